// Byte-level tokenizer shared by the coordinator (prompts, decoding completions for the verifier)
// and the tests: every UTF-8 byte is one token, so any text round-trips and no vocab file exists.
//
// Token ids (vocab_size() == 259):
//   0..255   the byte with that value
//   256      kBosId  beginning of sequence (prepended to every prompt)
//   257      kEosId  end of sequence (the model emits it to stop; decoding stops there)
//   258      kPadId  padding in batched tensors (never sampled, never decoded)
// A model may have a larger embedding table (padded vocab); ids >= vocab_size() are not tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace fp8rl::rl {

inline constexpr int32_t kNumByteTokens = 256;
inline constexpr int32_t kBosId = 256;
inline constexpr int32_t kEosId = 257;
inline constexpr int32_t kPadId = 258;
inline constexpr int32_t kTokenizerVocabSize = 259;

// What decode() writes for an id that is not a token (outside [0, vocab_size())): U+FFFD.
inline constexpr std::string_view kUnknownTokenText = "\xEF\xBF\xBD";

class ByteTokenizer {
 public:
  int32_t vocab_size() const { return kTokenizerVocabSize; }
  int32_t bos_id() const { return kBosId; }
  int32_t eos_id() const { return kEosId; }
  int32_t pad_id() const { return kPadId; }

  // One id per byte of `text`, optionally wrapped in BOS ... EOS.
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false,
                              bool add_eos = false) const;

  // Bytes back to text. BOS and PAD are skipped; decoding stops at the first EOS (the EOS and
  // everything after it are dropped); an id outside [0, vocab_size()) becomes kUnknownTokenText.
  // Never fails, so a model's garbage completion simply earns reward 0.
  std::string decode(std::span<const int32_t> ids) const;

  // InvalidArgument naming the first position whose id is outside [0, vocab_size()).
  absl::Status validate(std::span<const int32_t> ids) const;

  static bool is_special(int32_t id) { return id >= kNumByteTokens && id < kTokenizerVocabSize; }
};

}  // namespace fp8rl::rl
