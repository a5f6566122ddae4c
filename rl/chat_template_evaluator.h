// The chat-template evaluator (rl/chat_template.h): walks a parsed template with HF's
// apply_chat_template variables and produces the rendered text.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "rl/chat_template.h"
#include "rl/chat_template_ast.h"

namespace fp8rl::rl::chat_template_internal {

// Renders `program`. InvalidArgument on a runtime error (with line:col where the template has
// one), including raise_exception("msg"), and on bad inputs (kwargs not an object, an integer
// above int64, invalid UTF-8 where a string is measured or escaped).
absl::StatusOr<std::string> render_program(const Program& program,
                                           const ChatTemplateInputs& inputs);

}  // namespace fp8rl::rl::chat_template_internal
