// Fuzz target: a chat template (Jinja source from a checkpoint's tokenizer_config.json) through
// ChatTemplate::Parse, then Render with a conversation; an error is fine, a crash or a hang is
// not. Input: template [separator messages-JSON]; without the second part a fixed conversation
// with a system prompt, a tool call and reasoning content is rendered.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "nlohmann/json.hpp"
#include "rl/chat_template.h"

namespace {

constexpr char kConversation[] = R"([
  {"role": "system", "content": "You are helpful."},
  {"role": "user", "content": "What is 2+3? \u00e9"},
  {"role": "assistant", "content": "<think>add</think>5", "reasoning_content": "add",
   "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"x": 2}}}]},
  {"role": "tool", "content": "5"},
  {"role": "user", "content": ""}
])";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string_view> parts = fp8rl::fuzz::split_fuzz_input(data, size, 2);
  absl::StatusOr<fp8rl::rl::ChatTemplate> tmpl = fp8rl::rl::ChatTemplate::Parse(parts[0]);
  if (!tmpl.ok()) return 0;
  fp8rl::rl::ChatTemplateInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(kConversation);
  if (parts.size() > 1) {
    nlohmann::ordered_json messages =
        nlohmann::ordered_json::parse(parts[1], nullptr, /*allow_exceptions=*/false);
    if (!messages.is_discarded()) inputs.messages = std::move(messages);
  }
  inputs.tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "calc", "parameters": {}}}])");
  inputs.bos_token = "<s>";
  inputs.eos_token = "</s>";
  inputs.now_unix_seconds = 1700000000;
  for (bool generation_prompt : {false, true}) {
    inputs.add_generation_prompt = generation_prompt;
    (void)tmpl->Render(inputs);
  }
  return 0;
}
