// The public entry points of the chat-template interpreter (rl/chat_template.h). The work is
// done in three stages, one file each: rl/chat_template_lexer.h (text -> tokens),
// rl/chat_template_parser.h (tokens -> syntax tree) and rl/chat_template_evaluator.h (tree +
// variables -> text), all reporting errors as absl::Status.
#include "rl/chat_template.h"

#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "rl/chat_template_ast.h"
#include "rl/chat_template_evaluator.h"
#include "rl/chat_template_lexer.h"
#include "rl/chat_template_parser.h"

namespace fp8rl::rl {

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  namespace internal = chat_template_internal;
  FP8RL_ASSIGN_OR_RETURN(std::vector<internal::Piece> pieces, internal::lex_template(source));
  auto program = std::make_shared<internal::Program>();
  FP8RL_ASSIGN_OR_RETURN(program->body, internal::parse_template(std::move(pieces)));
  return ChatTemplate(std::move(program));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  return chat_template_internal::render_program(*program_, inputs);
}

absl::StatusOr<std::string> ChatTemplateFromTokenizerConfig(const nlohmann::ordered_json& config) {
  if (!config.is_object() || !config.contains("chat_template") ||
      config["chat_template"].is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& entry : t) {
      // (Not entry.value("name", ""): it throws when "name" is not a string.)
      if (entry.is_object() && entry.contains("name") && entry["name"] == "default" &&
          entry.contains("template") && entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return absl::NotFoundError("tokenizer_config.json chat_template list has no 'default' entry");
  }
  return absl::InvalidArgumentError(
      "tokenizer_config.json chat_template must be a string or a list of {name, template}");
}

std::optional<std::string> SpecialTokenFromTokenizerConfig(const nlohmann::ordered_json& config,
                                                           std::string_view key) {
  if (!config.is_object()) return std::nullopt;
  const auto it = config.find(std::string(key));
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace fp8rl::rl
