// The chat-template syntax tree (rl/chat_template.h): what the parser builds from the lexer's
// pieces and the evaluator walks. Nodes are immutable after parsing and shared by every render
// of a ChatTemplate.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "rl/chat_template_lexer.h"

namespace fp8rl::rl::chat_template_internal {

// A literal in the source: none/None (monostate), true/false, an integer, a float, a string.
using Literal = std::variant<std::monostate, bool, int64_t, double, std::string>;

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

struct Expr {
  enum Type {
    kLiteral,
    kName,
    kList,
    kDict,  // kids: key, value, key, value, ...
    kGetAttr,
    kGetItem,
    kSlice,   // kids: object, start, stop, step (null when absent)
    kCall,    // kids[0]: callee; args: positional; kwargs
    kFilter,  // kids[0]: object; name; args; kwargs
    kTest,    // kids[0]: object; name; args; negated
    kNeg,
    kPos,
    kNot,
    kAnd,
    kOr,
    kBinary,   // name: operator
    kCompare,  // kids: operands; ops: operators
    kCond,     // kids: then, cond, else (null when absent)
  } type;
  Pos pos;
  Literal literal;
  std::string name;
  std::vector<ExprPtr> kids;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using Body = std::vector<std::shared_ptr<Stmt>>;

struct Stmt {
  enum Type { kText, kOutput, kIf, kFor, kSet, kSetNsAttr, kSetBlock, kBreak, kContinue } type;
  Pos pos;
  std::string text;                // kText
  ExprPtr expr;                    // kOutput, kSet value, kFor iterable
  std::vector<ExprPtr> conds;      // kIf: one per branch
  std::vector<Body> bodies;        // kIf: one per branch (+ else); kFor: body (+ else)
  std::vector<std::string> names;  // kFor/kSet targets; kSetNsAttr: {namespace, attribute}
  ExprPtr filter;                  // kFor `if` clause
  bool has_else = false;
};

// A parsed template.
struct Program {
  Body body;
};

// The filters and tests the language knows (the evaluator implements them; a few known ones are
// still unsupported at render time). The parser rejects any other name.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

}  // namespace fp8rl::rl::chat_template_internal
