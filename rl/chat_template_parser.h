// The chat-template parser (rl/chat_template.h): the lexer's pieces -> a syntax tree, by
// recursive descent with jinja2's operator precedence.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "rl/chat_template_ast.h"
#include "rl/chat_template_lexer.h"

namespace fp8rl::rl::chat_template_internal {

// InvalidArgument with line:col on a syntax error, an unsupported tag, an unknown filter or test,
// or an integer literal outside int64.
absl::StatusOr<Body> parse_template(std::vector<Piece> pieces);

}  // namespace fp8rl::rl::chat_template_internal
