// HfTokenizer: the Hugging Face `tokenizer.json` byte-level BPE tokenizers of Qwen2/2.5/3,
// Llama 3.x and DeepSeek-V3, in C++, so a job can post-train a real checkpoint with its own
// vocabulary. The byte tokenizer (rl/tokenizer.h) stays for the built-in toy tasks.
//
// Encoding pipeline (the order of the Hugging Face tokenizers library):
//   1. added tokens are matched first, leftmost-longest, on the raw text (normalized: false) and
//      then on the normalized text (normalized: true); lstrip/rstrip swallow the whitespace beside
//      a match; single_word requires no word character on either side;
//   2. normalizer: null, NFC (ICU) or a Sequence of those;
//   3. pre-tokenizer: a Sequence of Split (PCRE2 with UTF + UCP, JIT; behavior Isolated or
//      Removed), Digits and ByteLevel (add_prefix_space, use_regex);
//   4. model BPE: merges applied by rank (lowest first, leftmost on ties); ignore_merges emits a
//      whole word found in the vocabulary; byte_fallback emits <0xXX> for a byte missing from
//      the vocabulary; unk_token otherwise; a word with neither is an error;
//   5. post-processor (only with add_special_tokens): ByteLevel (no-op on ids) and
//      TemplateProcessing's `single` template (Llama 3 prepends <|begin_of_text|>).
// Decoding is the ByteLevel decoder: each token's characters map back to bytes, so decode(encode(
// text)) == text byte for byte; decode returns raw bytes, which may be invalid UTF-8 for an
// arbitrary id sequence (to_valid_utf8 replaces invalid sequences with U+FFFD like the reference).
//
// Anything else in tokenizer.json (another model, normalizer, pre-tokenizer, decoder,
// post-processor, truncation, padding, dropout, subword prefixes) is an error naming the file
// and the JSON path: a tokenizer is never silently encoded differently.
//
// Thread safety: encode/decode are const and may be called from several threads at once (the
// word cache is guarded by a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::rl {

struct HfAddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

class HfTokenizer {
 public:
  // Loads DIR/tokenizer.json, and the special ids from DIR/tokenizer_config.json
  // (bos_token/eos_token/pad_token) and DIR/generation_config.json (bos_token_id, eos_token_id as a
  // number or a list, pad_token_id) when they exist.
  static absl::StatusOr<HfTokenizer> load(const std::string& dir);
  // Parses the text of a tokenizer.json; `source` names it in errors. No special ids are set
  // beyond what set_special_tokens gives.
  static absl::StatusOr<HfTokenizer> from_json_text(const std::string& text,
                                                    const std::string& source);

  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer();

  // `text` must be valid UTF-8 (an error names the first bad byte). add_special_tokens applies
  // the post-processor (e.g. Llama 3's BOS); chat templates already write those tokens, so the
  // default is off.
  absl::StatusOr<std::vector<int32_t>> encode(std::string_view text,
                                              bool add_special_tokens = false) const;
  // Raw bytes; an id outside the vocabulary is an error naming it.
  absl::StatusOr<std::string> decode(std::span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // Replaces every invalid UTF-8 sequence with U+FFFD, one per maximal invalid subpart (the
  // WHATWG / Unicode "best practice" that Rust's from_utf8_lossy and JavaScript's TextDecoder use).
  static std::string to_valid_utf8(std::string_view bytes);

  // The token string as written in tokenizer.json (byte-level characters for vocabulary tokens)
  // or an added token's content.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // One past the largest id (vocabulary and added tokens).
  int32_t vocab_size() const;
  const std::vector<HfAddedToken>& added_tokens() const;

  // Special ids; unset when the checkpoint does not name them.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> pad_id() const;
  // The main EOS (tokenizer_config.json's eos_token, else the first of generation_config.json).
  std::optional<int32_t> eos_id() const;
  // Every id generation stops at: generation_config.json's eos_token_id list, then
  // tokenizer_config.json's eos_token if not already in it.
  const std::vector<int32_t>& eos_ids() const;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8rl::rl
