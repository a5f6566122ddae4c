// Fuzz target: a tokenizer.json through HfTokenizer::from_json_text; a tokenizer that loads then
// encodes the input's second part (or a fixed sample text) and decodes the ids back. Input:
// tokenizer.json [separator text]. Checks the documented round trip: decode(encode(text)) ==
// text for valid UTF-8 text (byte-level BPE loses nothing); decode of any id at or beyond
// vocab_size() is an error, never a read outside the vocabulary.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "rl/hf_tokenizer.h"

namespace {

constexpr char kSampleText[] =
    "Hello, world! 12345 <|im_start|>user\n  tabs\tand \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 end";

bool valid_utf8(const std::string& s) { return fp8rl::rl::HfTokenizer::to_valid_utf8(s) == s; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string_view> parts = fp8rl::fuzz::split_fuzz_input(data, size, 2);
  absl::StatusOr<fp8rl::rl::HfTokenizer> tok =
      fp8rl::rl::HfTokenizer::from_json_text(std::string(parts[0]), "fuzz tokenizer.json");
  if (!tok.ok()) return 0;
  const std::string text = parts.size() > 1 ? std::string(parts[1]) : std::string(kSampleText);
  for (bool special : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok->encode(text, special);
    if (!ids.ok()) continue;  // invalid UTF-8, or a word neither BPE nor a fallback covers
    for (int32_t id : *ids) {
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
    }
    absl::StatusOr<std::string> back = tok->decode(*ids, /*skip_special_tokens=*/false);
    if (!back.ok()) __builtin_trap();  // encode only emits ids decode knows
    (void)tok->decode(*ids, /*skip_special_tokens=*/true);
    if (!special && valid_utf8(text) && *back != text) {
      // Byte-level BPE is lossless unless a normalizer (NFC) rewrote the text.
      absl::StatusOr<std::vector<int32_t>> again = tok->encode(*back, false);
      if (!again.ok() || *again != *ids) __builtin_trap();
    }
  }
  const int32_t beyond[] = {tok->vocab_size(), -1};
  for (int32_t id : beyond) {
    if (tok->decode(std::vector<int32_t>{id}).ok()) __builtin_trap();
  }
  return 0;
}
