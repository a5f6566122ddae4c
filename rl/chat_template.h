// Renders a Hugging Face checkpoint's `chat_template` (Jinja) in C++, byte-identical to what
// transformers' apply_chat_template produces with jinja2, so prompts built here match the ones the
// model was trained with.
//
// The interpreter covers the Jinja subset the Qwen2.5, Qwen3, Llama 3.1/3.2 and DeepSeek-V3
// templates use (docs/guide.md, "Chat templates", lists it). It lexes like jinja2 with HF's
// settings: trim_blocks=True, lstrip_blocks=True, `-`/`+` whitespace control, one trailing newline
// of the source dropped. Anything outside the subset (an unknown tag, filter, test, method or
// operator) is an InvalidArgument error naming the construct and its line:col in the template,
// raised by Parse when it is visible in the source and by Render otherwise -- never a silently
// different prompt.
//
// Values follow Python semantics where output depends on them: `{{ x }}` prints str(x) (None,
// True, 1.0, ['a'] as Python does), `tojson` is HF's override (json.dumps with ensure_ascii=False,
// insertion-ordered keys, ", " / ": " separators, optional indent/separators/sort_keys), string
// length, indexing and slicing count code points. Objects keep their key order, hence
// nlohmann::ordered_json in the inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fp8rl::rl {

// The variables HF's apply_chat_template passes to the template.
struct ChatTemplateInputs {
  // Array of {"role": ..., "content": ..., optional "tool_calls", "reasoning_content", ...}.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // Tool schemas; null renders as `tools=None` (what HF passes when no tools are given).
  nlohmann::ordered_json tools = nullptr;
  bool add_generation_prompt = false;
  // Special tokens; an unset one is undefined in the template (HF omits tokens the tokenizer
  // lacks).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // Extra template variables (e.g. {"enable_thinking": false}); must be an object or null.
  // They override the variables above, as HF's **kwargs do.
  nlohmann::ordered_json kwargs = nullptr;
  // Clock for strftime_now(), in Unix seconds formatted in the local time zone like
  // datetime.now(); unset = the current time. Tests pin it.
  std::optional<int64_t> now_unix_seconds;
};

namespace chat_template_internal {
struct Program;
}

class ChatTemplate {
 public:
  // Lexes and parses `source`. InvalidArgument with line:col on a syntax error or an unsupported
  // tag, filter or test.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders the template. InvalidArgument on a runtime error (with line:col), including
  // raise_exception("msg") from the template, whose message is carried verbatim.
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const chat_template_internal::Program> program)
      : program_(std::move(program)) {}
  std::shared_ptr<const chat_template_internal::Program> program_;
};

// The default chat template of a parsed tokenizer_config.json: `chat_template` as a string, or
// the entry named "default" when it is a list of {"name", "template"}. NotFound when absent.
absl::StatusOr<std::string> ChatTemplateFromTokenizerConfig(const nlohmann::ordered_json& config);

// A special token's text from tokenizer_config.json (`bos_token`, `eos_token`, ...): a string or
// an AddedToken object's "content". nullopt when the key is absent or null.
std::optional<std::string> SpecialTokenFromTokenizerConfig(const nlohmann::ordered_json& config,
                                                           std::string_view key);

}  // namespace fp8rl::rl
