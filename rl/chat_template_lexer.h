// The chat-template lexer (rl/chat_template.h): template text -> pieces (literal text, `{{ }}`,
// `{% %}`), each tag's inside split into tokens. It applies jinja2's whitespace rules with
// Hugging Face's settings (trim_blocks, lstrip_blocks, `-`/`+` control, \r\n -> \n, one trailing
// newline dropped), so the parser sees exactly the text jinja2 would emit.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl::rl::chat_template_internal {

// A place in the template source: 1-based line, and column in code points.
struct Pos {
  int line = 1;
  int col = 1;
};

// InvalidArgument "chat_template L:C: what": every error the interpreter reports about a place
// in the template has this form.
absl::Status template_error(Pos pos, const std::string& what);

enum class TokenType { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  TokenType type;
  std::string text;  // name, decoded string, number text (no '_'), operator; kEnd: "}}" or "%}"
  Pos pos;
};

// One piece of the template: text, {{ expression }} or {% statement %} ({# #} leaves none).
struct Piece {
  enum Type { kText, kVar, kBlock } type;
  std::string text;           // kText
  std::vector<Token> tokens;  // kVar/kBlock, ending with a kEnd token
  Pos pos;                    // of the text, or of the tag's '{'
};

// Lexes a whole template. InvalidArgument with line:col on an unterminated tag, comment or
// string, an unexpected character or a bad escape.
absl::StatusOr<std::vector<Piece>> lex_template(std::string_view source);

}  // namespace fp8rl::rl::chat_template_internal
