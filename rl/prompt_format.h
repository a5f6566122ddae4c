// PromptFormat: how a job turns a task's example into prompt tokens and a completion's tokens
// back into text: a tokenizer, an optional chat template and the special ids. The toy models use
// the byte tokenizer and the plain format (byte_prompt_format()); a job that starts from a
// Hugging Face checkpoint fills it from the checkpoint folder (load_prompt_format(dir)).
//
// Prompt tokens (encode_prompt):
//   plain format (no chat template): [bos_id when set] + encode(example.prompt). With the byte
//     tokenizer that is BOS + the prompt bytes, what the toy tasks have always fed.
//   chat format: encode(render), where render is the chat template applied to
//     [{"role": "system", "content": example.system} when non-empty,
//      {"role": "user", "content": example.user, or example.prompt when user is empty}]
//     with add_generation_prompt = true, bos_token / eos_token and the extra template_kwargs
//     (e.g. {"enable_thinking": false} for Qwen3). The template writes BOS itself, so none is
//     added.
// Completions (decode_completion) are decoded up to (not including) the first stop id.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "rl/chat_template.h"
#include "rl/tasks.h"

namespace fp8rl::rl {

// The tokenizer behind a prompt format (the byte tokenizer or a checkpoint's tokenizer.json).
class PromptTokenizer {
 public:
  virtual ~PromptTokenizer() = default;
  // Text -> ids, special tokens written in the text matched (chat templates write them).
  virtual absl::StatusOr<std::vector<int32_t>> encode(std::string_view text) const = 0;
  // Ids -> text; never fails (a model's garbage completion simply scores 0): ids that are not
  // tokens and invalid UTF-8 become U+FFFD.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t vocab_size() const = 0;
};

struct PromptFormat {
  std::shared_ptr<const PromptTokenizer> tokenizer;  // required
  std::optional<ChatTemplate> chat_template;         // unset: the plain format
  // Template variables bos_token / eos_token (unset: undefined in the template, as in HF).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  nlohmann::ordered_json template_kwargs = nullptr;  // an object or null
  std::optional<int32_t> bos_id;                     // prepended in the plain format
  std::vector<int32_t> stop_ids;                     // generation stops at any of them
};

// The chat-template part of a tokenizer folder: DIR/tokenizer_config.json's chat_template (unset
// when the file or the key is absent) and its bos_token / eos_token texts. A template that does
// not parse, or an unreadable or malformed file, is an error naming the file.
struct ChatTemplateFiles {
  std::optional<ChatTemplate> chat_template;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};
absl::StatusOr<ChatTemplateFiles> load_chat_template_files(const std::string& dir);

// Byte tokenizer (rl/tokenizer.h), plain format, bos_id = kBosId, stop_ids = {kEosId}.
PromptFormat byte_prompt_format();

// From a Hugging Face checkpoint or tokenizer folder: DIR/tokenizer.json and its special ids
// (HfTokenizer::load), and DIR/tokenizer_config.json's chat_template when it has one (plain
// format otherwise, with the tokenizer's BOS id). stop_ids = HfTokenizer::eos_ids(). Errors
// name the file.
absl::StatusOr<PromptFormat> load_prompt_format(const std::string& dir);

// The chat messages of an example (see the header comment).
nlohmann::ordered_json chat_messages(const Example& example);

// The prompt text: the rendered chat template, or example.prompt in the plain format.
absl::StatusOr<std::string> render_prompt(const Example& example, const PromptFormat& format);

// The prompt token ids (see the header comment).
absl::StatusOr<std::vector<int32_t>> encode_prompt(const Example& example,
                                                   const PromptFormat& format);

// A completion's text: the ids before the first stop id, decoded.
std::string decode_completion(std::span<const int32_t> ids, const PromptFormat& format);

}  // namespace fp8rl::rl
