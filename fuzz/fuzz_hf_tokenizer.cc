// Fuzz target: a tokenizer.json through HfTokenizer::from_json_text; a tokenizer that loads then
// encodes the input's second part (or a fixed sample text) and decodes the ids back. Input:
// tokenizer.json [separator text]. Checks that encoded ids lie in the vocabulary and decode, and
// that decoding an id at or beyond vocab_size() is an error, never a read outside the vocabulary.
// (decode(encode(text)) == text is not checked: normalizers, add_prefix_space and lstrip/rstrip
// added tokens change the text by design.)
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "rl/hf_tokenizer.h"

namespace {

constexpr char kSampleText[] =
    "Hello, world! 12345 <|im_start|>user\n  tabs\tand \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 end";

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
  }
  const int32_t beyond[] = {tok->vocab_size(), -1};
  for (int32_t id : beyond) {
    if (tok->decode(std::vector<int32_t>{id}).ok()) __builtin_trap();
  }
  return 0;
}
