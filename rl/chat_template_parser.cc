// The chat-template parser (rl/chat_template_parser.h). Each parse_* method reads one grammar
// rule from the current tag's tokens; statements that open a block read the pieces up to their
// closing tag.
#include "rl/chat_template_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace fp8rl::rl::chat_template_internal {

bool is_known_filter(std::string_view name) {
  static const auto* filters = new std::set<std::string, std::less<>>{
      "trim",  "length",  "count",  "tojson",     "string",     "first",      "last",
      "items", "join",    "reject", "select",     "rejectattr", "selectattr", "map",
      "list",  "default", "d",      "replace",    "lower",      "upper",      "safe",
      "int",   "abs",     "unique", "capitalize", "title",      "float",      "dictsort"};
  return filters->count(name) > 0;
}

bool is_known_test(std::string_view name) {
  static const auto* tests = new std::set<std::string, std::less<>>{
      "defined", "undefined", "none",        "boolean", "false",    "true",     "integer",
      "float",   "number",    "string",      "mapping", "iterable", "sequence", "callable",
      "equalto", "eq",        "==",          "ne",      "!=",       "lt",       "<",
      "le",      "<=",        "gt",          ">",       "ge",       ">=",       "in",
      "even",    "odd",       "divisibleby", "sameas",  "lower",    "upper"};
  return tests->count(name) > 0;
}

namespace {

std::shared_ptr<Stmt> new_stmt(Stmt::Type type, Pos pos) {
  auto st = std::make_shared<Stmt>();
  st->type = type;
  st->pos = pos;
  return st;
}

ExprPtr new_expr(Expr::Type type, Pos pos) {
  auto e = std::make_shared<Expr>();
  e->type = type;
  e->pos = pos;
  return e;
}

// How deeply blocks and expressions may nest (each open block, each expression level and each
// unary operator counts one). The parser and the evaluator recurse once per level, so without a
// bound a long run of '(' or '{% if %}' in a template exhausts the stack; jinja2 itself gives up
// (RecursionError) below 100 nested parentheses, and real templates nest a handful of levels.
constexpr int kMaxNestingDepth = 256;

bool is_compare_op(const Token& t) {
  return t.type == TokenType::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                      t.text == ">" || t.text == "<=" || t.text == ">=");
}

// An integer literal's digits as int64; InvalidArgument beyond its range.
absl::StatusOr<int64_t> parse_int(const Token& digits) {
  errno = 0;
  const long long v = std::strtoll(digits.text.c_str(), nullptr, 10);
  if (errno == ERANGE) return template_error(digits.pos, "integer literal out of range");
  return static_cast<int64_t>(v);
}

class Parser {
  // Counts one nesting level while alive; see kMaxNestingDepth.
  class DepthGuard {
   public:
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    bool too_deep() const { return depth_ > kMaxNestingDepth; }

   private:
    int& depth_;
  };

  absl::Status nesting_error(Pos pos) const {
    return template_error(pos, absl::StrCat("nested deeper than ", kMaxNestingDepth, " levels"));
  }

 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  absl::StatusOr<Body> parse_template() {
    FP8RL_ASSIGN_OR_RETURN(Body body, parse_body({}));
    if (at_ < pieces_.size()) {
      return template_error(pieces_[at_].pos,
                            absl::StrCat("unexpected '", pieces_[at_].tokens[0].text, "'"));
    }
    return body;
  }

 private:
  // --- statements

  // Parses statements until a block whose keyword is in `stops` (left unconsumed) or the end.
  absl::StatusOr<Body> parse_body(const std::vector<std::string>& stops) {
    const DepthGuard guard(depth_);
    if (guard.too_deep()) return nesting_error(pieces_[at_ > 0 ? at_ - 1 : 0].pos);
    Body body;
    while (at_ < pieces_.size()) {
      Piece& p = pieces_[at_];
      if (p.type == Piece::kText) {
        auto st = new_stmt(Stmt::kText, p.pos);
        st->text = p.text;
        body.push_back(st);
        ++at_;
        continue;
      }
      toks_ = &p.tokens;
      ti_ = 0;
      if (p.type == Piece::kVar) {
        auto st = new_stmt(Stmt::kOutput, p.pos);
        FP8RL_ASSIGN_OR_RETURN(st->expr, parse_expression());
        FP8RL_RETURN_IF_ERROR(expect_end());
        body.push_back(st);
        ++at_;
        continue;
      }
      const Token& kw = cur();
      if (kw.type != TokenType::kName) {
        return template_error(kw.pos, "expected a tag name after '{%'");
      }
      if (std::find(stops.begin(), stops.end(), kw.text) != stops.end()) return body;
      FP8RL_ASSIGN_OR_RETURN(std::shared_ptr<Stmt> st, parse_statement());
      body.push_back(std::move(st));
    }
    if (!stops.empty()) {
      return template_error(
          pieces_.empty() ? Pos{} : pieces_.back().pos,
          absl::StrCat("unexpected end of template, expected '", stops.back(), "'"));
    }
    return body;
  }

  // The current block piece's keyword after a nested parse_body returned on it.
  std::string stop_keyword() {
    toks_ = &pieces_[at_].tokens;
    ti_ = 0;
    return cur().text;
  }

  // Consumes the current block's keyword and `%}`, moving to the next piece.
  absl::Status close_block() {
    next();
    FP8RL_RETURN_IF_ERROR(expect_end());
    ++at_;
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Stmt>> parse_statement() {
    const Token kw = next();
    if (kw.text == "if") return parse_if(kw);
    if (kw.text == "for") return parse_for(kw);
    if (kw.text == "set") return parse_set(kw);
    if (kw.text == "break" || kw.text == "continue") {
      FP8RL_RETURN_IF_ERROR(expect_end());
      ++at_;
      return new_stmt(kw.text == "break" ? Stmt::kBreak : Stmt::kContinue, kw.pos);
    }
    if (kw.text == "generation") {
      // HF's AssistantTracker extension: renders its body unchanged.
      FP8RL_RETURN_IF_ERROR(expect_end());
      ++at_;
      auto st = new_stmt(Stmt::kIf, kw.pos);
      auto always = new_expr(Expr::kLiteral, kw.pos);
      always->literal = true;
      st->conds.push_back(always);
      FP8RL_ASSIGN_OR_RETURN(Body body, parse_body({"endgeneration"}));
      st->bodies.push_back(std::move(body));
      stop_keyword();
      FP8RL_RETURN_IF_ERROR(close_block());
      return st;
    }
    static const auto* closers = new std::set<std::string, std::less<>>{
        "elif", "else", "endif", "endfor", "endset", "endgeneration"};
    if (closers->count(kw.text)) {
      return template_error(kw.pos,
                            absl::StrCat("unexpected '", kw.text, "' (no open block it closes)"));
    }
    return template_error(kw.pos, absl::StrCat("unsupported tag '", kw.text, "'"));
  }

  // {% if %} ... {% elif %} ... {% else %} ... {% endif %}, after the keyword.
  absl::StatusOr<std::shared_ptr<Stmt>> parse_if(const Token& kw) {
    auto st = new_stmt(Stmt::kIf, kw.pos);
    FP8RL_ASSIGN_OR_RETURN(ExprPtr cond, parse_expression());
    st->conds.push_back(std::move(cond));
    FP8RL_RETURN_IF_ERROR(expect_end());
    ++at_;
    while (true) {
      FP8RL_ASSIGN_OR_RETURN(Body body, parse_body({"elif", "else", "endif"}));
      st->bodies.push_back(std::move(body));
      const std::string stop = stop_keyword();
      next();
      if (stop == "elif") {
        FP8RL_ASSIGN_OR_RETURN(ExprPtr elif_cond, parse_expression());
        st->conds.push_back(std::move(elif_cond));
        FP8RL_RETURN_IF_ERROR(expect_end());
        ++at_;
      } else if (stop == "else") {
        FP8RL_RETURN_IF_ERROR(expect_end());
        ++at_;
        FP8RL_ASSIGN_OR_RETURN(Body else_body, parse_body({"endif"}));
        st->bodies.push_back(std::move(else_body));
        stop_keyword();
        FP8RL_RETURN_IF_ERROR(close_block());
        return st;
      } else {
        FP8RL_RETURN_IF_ERROR(expect_end());
        ++at_;
        return st;
      }
    }
  }

  // {% for a, b in xs if cond %} ... {% else %} ... {% endfor %}, after the keyword.
  absl::StatusOr<std::shared_ptr<Stmt>> parse_for(const Token& kw) {
    auto st = new_stmt(Stmt::kFor, kw.pos);
    FP8RL_ASSIGN_OR_RETURN(std::string first, expect_name());
    st->names.push_back(std::move(first));
    while (is_op(",")) {
      next();
      FP8RL_ASSIGN_OR_RETURN(std::string name, expect_name());
      st->names.push_back(std::move(name));
    }
    if (!is_name("in")) return template_error(cur().pos, "expected 'in' in for loop");
    next();
    FP8RL_ASSIGN_OR_RETURN(st->expr, parse_cond_expr(/*allow_cond=*/false));
    if (is_name("if")) {
      next();
      FP8RL_ASSIGN_OR_RETURN(st->filter, parse_expression());
    }
    if (is_name("recursive")) return template_error(cur().pos, "unsupported: recursive for loops");
    FP8RL_RETURN_IF_ERROR(expect_end());
    ++at_;
    FP8RL_ASSIGN_OR_RETURN(Body body, parse_body({"else", "endfor"}));
    st->bodies.push_back(std::move(body));
    if (stop_keyword() == "else") {
      next();
      FP8RL_RETURN_IF_ERROR(expect_end());
      ++at_;
      st->has_else = true;
      FP8RL_ASSIGN_OR_RETURN(Body else_body, parse_body({"endfor"}));
      st->bodies.push_back(std::move(else_body));
      stop_keyword();
    }
    FP8RL_RETURN_IF_ERROR(close_block());
    return st;
  }

  // {% set x = v %}, {% set a, b = v %}, {% set ns.attr = v %}, {% set x %}...{% endset %}.
  absl::StatusOr<std::shared_ptr<Stmt>> parse_set(const Token& kw) {
    FP8RL_ASSIGN_OR_RETURN(const std::string target, expect_name());
    if (is_op(".")) {
      next();
      auto st = new_stmt(Stmt::kSetNsAttr, kw.pos);
      FP8RL_ASSIGN_OR_RETURN(std::string attr, expect_name());
      st->names = {target, std::move(attr)};
      FP8RL_RETURN_IF_ERROR(expect_op("="));
      FP8RL_ASSIGN_OR_RETURN(st->expr, parse_expression());
      FP8RL_RETURN_IF_ERROR(expect_end());
      ++at_;
      return st;
    }
    std::vector<std::string> names = {target};
    while (is_op(",")) {
      next();
      FP8RL_ASSIGN_OR_RETURN(std::string name, expect_name());
      names.push_back(std::move(name));
    }
    if (cur().type == TokenType::kEnd && names.size() == 1) {
      auto st = new_stmt(Stmt::kSetBlock, kw.pos);
      st->names = names;
      ++at_;
      FP8RL_ASSIGN_OR_RETURN(Body body, parse_body({"endset"}));
      st->bodies.push_back(std::move(body));
      stop_keyword();
      FP8RL_RETURN_IF_ERROR(close_block());
      return st;
    }
    auto st = new_stmt(Stmt::kSet, kw.pos);
    st->names = names;
    FP8RL_RETURN_IF_ERROR(expect_op("="));
    FP8RL_ASSIGN_OR_RETURN(st->expr, parse_tuple());
    FP8RL_RETURN_IF_ERROR(expect_end());
    ++at_;
    return st;
  }

  // --- tokens of the current tag

  const Token& cur() const { return (*toks_)[ti_]; }
  const Token& peek(size_t n = 1) const { return (*toks_)[std::min(ti_ + n, toks_->size() - 1)]; }
  Token next() {
    Token t = cur();
    if (t.type != TokenType::kEnd) ++ti_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::kOp && cur().text == op; }
  bool is_name(std::string_view n) const {
    return cur().type == TokenType::kName && cur().text == n;
  }
  absl::Status expect_op(std::string_view op) {
    if (!is_op(op)) {
      return template_error(
          cur().pos, absl::StrCat("expected '", std::string(op), "', got '", cur().text, "'"));
    }
    next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> expect_name() {
    if (cur().type != TokenType::kName) {
      return template_error(cur().pos, absl::StrCat("expected a name, got '", cur().text, "'"));
    }
    return next().text;
  }
  absl::Status expect_end() const {
    if (cur().type != TokenType::kEnd) {
      return template_error(cur().pos,
                            absl::StrCat("unexpected '", cur().text, "' (unsupported syntax)"));
    }
    return absl::OkStatus();
  }

  // --- expressions, in jinja2's precedence order

  absl::StatusOr<ExprPtr> parse_expression() { return parse_cond_expr(true); }

  // `a, b` without brackets (a tuple) is accepted where jinja2 accepts it: `set x = a, b`.
  absl::StatusOr<ExprPtr> parse_tuple() {
    FP8RL_ASSIGN_OR_RETURN(ExprPtr first, parse_expression());
    if (!is_op(",")) return first;
    ExprPtr list = new_expr(Expr::kList, first->pos);
    list->kids.push_back(first);
    while (is_op(",")) {
      next();
      if (cur().type == TokenType::kEnd) break;
      FP8RL_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
      list->kids.push_back(std::move(item));
    }
    return list;
  }

  // `x if c else y` (when allowed; a for loop's iterable is parsed without it).
  absl::StatusOr<ExprPtr> parse_cond_expr(bool allow_cond) {
    const DepthGuard guard(depth_);
    if (guard.too_deep()) return nesting_error(cur().pos);
    FP8RL_ASSIGN_OR_RETURN(ExprPtr e, parse_or());
    while (allow_cond && is_name("if")) {
      const Pos pos = next().pos;
      ExprPtr cond = new_expr(Expr::kCond, pos);
      cond->kids.push_back(e);
      FP8RL_ASSIGN_OR_RETURN(ExprPtr test, parse_or());
      cond->kids.push_back(std::move(test));
      if (is_name("else")) {
        next();
        FP8RL_ASSIGN_OR_RETURN(ExprPtr otherwise, parse_cond_expr(true));
        cond->kids.push_back(std::move(otherwise));
      } else {
        cond->kids.push_back(nullptr);
      }
      e = cond;
    }
    return e;
  }

  absl::StatusOr<ExprPtr> parse_or() {
    FP8RL_ASSIGN_OR_RETURN(ExprPtr e, parse_and());
    while (is_name("or")) {
      ExprPtr n = new_expr(Expr::kOr, next().pos);
      FP8RL_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      n->kids = {e, std::move(right)};
      e = n;
    }
    return e;
  }

  absl::StatusOr<ExprPtr> parse_and() {
    FP8RL_ASSIGN_OR_RETURN(ExprPtr e, parse_not());
    while (is_name("and")) {
      ExprPtr n = new_expr(Expr::kAnd, next().pos);
      FP8RL_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      n->kids = {e, std::move(right)};
      e = n;
    }
    return e;
  }

  absl::StatusOr<ExprPtr> parse_not() {
    if (is_name("not")) {
      const DepthGuard guard(depth_);
      if (guard.too_deep()) return nesting_error(cur().pos);
      ExprPtr n = new_expr(Expr::kNot, next().pos);
      FP8RL_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
      n->kids = {std::move(operand)};
      return n;
    }
    return parse_compare();
  }

  // Chained comparisons: `a < b <= c` is one kCompare node.
  absl::StatusOr<ExprPtr> parse_compare() {
    FP8RL_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Pos pos = cur().pos;
      if (is_compare_op(cur())) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = new_expr(Expr::kCompare, pos);
        cmp->kids.push_back(first);
      }
      cmp->ops.push_back(op);
      FP8RL_ASSIGN_OR_RETURN(ExprPtr operand, parse_math1());
      cmp->kids.push_back(std::move(operand));
    }
    return cmp ? cmp : first;
  }

  static ExprPtr binary(std::string op, Pos pos, ExprPtr a, ExprPtr b) {
    ExprPtr n = new_expr(Expr::kBinary, pos);
    n->name = std::move(op);
    n->kids = {std::move(a), std::move(b)};
    return n;
  }

  // Left-associative binary operators `ops` over operands read by `operand`.
  template <typename Operand>
  absl::StatusOr<ExprPtr> parse_binary_level(std::initializer_list<std::string_view> ops,
                                             Operand operand) {
    FP8RL_ASSIGN_OR_RETURN(ExprPtr e, operand());
    while (std::any_of(ops.begin(), ops.end(), [&](std::string_view op) { return is_op(op); })) {
      const Token op = next();
      FP8RL_ASSIGN_OR_RETURN(ExprPtr right, operand());
      e = binary(op.text, op.pos, e, std::move(right));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> parse_math1() {
    return parse_binary_level({"+", "-"}, [this] { return parse_concat(); });
  }

  absl::StatusOr<ExprPtr> parse_concat() {
    return parse_binary_level({"~"}, [this] { return parse_math2(); });
  }

  absl::StatusOr<ExprPtr> parse_math2() {
    return parse_binary_level({"*", "/", "//", "%"}, [this] { return parse_pow(); });
  }

  absl::StatusOr<ExprPtr> parse_pow() {
    return parse_binary_level({"**"}, [this] { return parse_unary(true); });
  }

  absl::StatusOr<ExprPtr> parse_unary(bool with_filter) {
    const DepthGuard guard(depth_);
    if (guard.too_deep()) return nesting_error(cur().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      e = new_expr(op.text == "-" ? Expr::kNeg : Expr::kPos, op.pos);
      FP8RL_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
      e->kids = {std::move(operand)};
    } else {
      FP8RL_ASSIGN_OR_RETURN(ExprPtr primary, parse_primary());
      FP8RL_ASSIGN_OR_RETURN(e, parse_postfix(std::move(primary)));
    }
    if (with_filter) return parse_filter_expr(e);
    return e;
  }

  absl::StatusOr<ExprPtr> parse_primary() {
    const Token t = next();
    switch (t.type) {
      case TokenType::kName: {
        ExprPtr e = new_expr(Expr::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          e->literal = true;
        } else if (t.text == "false" || t.text == "False") {
          e->literal = false;
        } else if (t.text == "none" || t.text == "None") {
          e->literal = std::monostate{};
        } else {
          e->type = Expr::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenType::kString: {
        std::string s = t.text;
        while (cur().type == TokenType::kString) s += next().text;  // adjacent literals concatenate
        ExprPtr e = new_expr(Expr::kLiteral, t.pos);
        e->literal = std::move(s);
        return e;
      }
      case TokenType::kInt: {
        ExprPtr e = new_expr(Expr::kLiteral, t.pos);
        FP8RL_ASSIGN_OR_RETURN(const int64_t v, parse_int(t));
        e->literal = v;
        return e;
      }
      case TokenType::kFloat: {
        ExprPtr e = new_expr(Expr::kLiteral, t.pos);
        e->literal = std::strtod(t.text.c_str(), nullptr);
        return e;
      }
      case TokenType::kOp:
        if (t.text == "(") return parse_parenthesized(t.pos);
        if (t.text == "[") {
          ExprPtr list = new_expr(Expr::kList, t.pos);
          while (!is_op("]")) {
            FP8RL_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
            list->kids.push_back(std::move(item));
            if (!is_op(",")) break;
            next();
          }
          FP8RL_RETURN_IF_ERROR(expect_op("]"));
          return list;
        }
        if (t.text == "{") {
          ExprPtr dict = new_expr(Expr::kDict, t.pos);
          while (!is_op("}")) {
            FP8RL_ASSIGN_OR_RETURN(ExprPtr key, parse_expression());
            dict->kids.push_back(std::move(key));
            FP8RL_RETURN_IF_ERROR(expect_op(":"));
            FP8RL_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
            dict->kids.push_back(std::move(value));
            if (!is_op(",")) break;
            next();
          }
          FP8RL_RETURN_IF_ERROR(expect_op("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    return template_error(t.pos, absl::StrCat("unexpected '", t.text, "' in expression"));
  }

  // After '(': `()` (an empty tuple), `(x)`, or a tuple `(a, b,)`.
  absl::StatusOr<ExprPtr> parse_parenthesized(Pos pos) {
    if (is_op(")")) {
      next();
      return new_expr(Expr::kList, pos);
    }
    FP8RL_ASSIGN_OR_RETURN(ExprPtr e, parse_expression());
    if (is_op(",")) {
      ExprPtr list = new_expr(Expr::kList, pos);
      list->kids.push_back(e);
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        FP8RL_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
        list->kids.push_back(std::move(item));
      }
      e = list;
    }
    FP8RL_RETURN_IF_ERROR(expect_op(")"));
    return e;
  }

  // `.name`, `.0`, `[i]`, `[a:b:c]` and calls after a primary.
  absl::StatusOr<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const Pos pos = next().pos;
        ExprPtr n = new_expr(Expr::kGetAttr, pos);
        if (cur().type == TokenType::kInt) {
          n->type = Expr::kGetItem;
          ExprPtr idx = new_expr(Expr::kLiteral, cur().pos);
          const Token digits = next();
          FP8RL_ASSIGN_OR_RETURN(const int64_t v, parse_int(digits));
          idx->literal = v;
          n->kids = {e, idx};
        } else {
          FP8RL_ASSIGN_OR_RETURN(n->name, expect_name());
          n->kids = {e};
        }
        e = n;
      } else if (is_op("[")) {
        const Pos pos = next().pos;
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) {
            FP8RL_ASSIGN_OR_RETURN(parts[k], parse_expression());
          }
          if (k < 2 && is_op(":")) {
            next();
            is_slice = true;
          } else {
            break;
          }
        }
        FP8RL_RETURN_IF_ERROR(expect_op("]"));
        ExprPtr n = new_expr(is_slice ? Expr::kSlice : Expr::kGetItem, pos);
        n->kids = {e, parts[0]};
        if (is_slice) {
          n->kids.push_back(parts[1]);
          n->kids.push_back(parts[2]);
        } else if (!parts[0]) {
          return template_error(pos, "empty subscript");
        }
        e = n;
      } else if (is_op("(")) {
        FP8RL_ASSIGN_OR_RETURN(e, parse_call(e));
      } else {
        return e;
      }
    }
  }

  // `(args)` after `callee`: a kCall node.
  absl::StatusOr<ExprPtr> parse_call(ExprPtr callee) {
    ExprPtr n = new_expr(Expr::kCall, next().pos);
    n->kids = {std::move(callee)};
    FP8RL_RETURN_IF_ERROR(parse_args(*n));
    return n;
  }

  // After '(' has been consumed: positional and keyword arguments up to ')'.
  absl::Status parse_args(Expr& n) {
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) {
        return template_error(cur().pos, "unsupported: *args/**kwargs in calls");
      }
      if (cur().type == TokenType::kName && peek().type == TokenType::kOp && peek().text == "=") {
        std::string key = next().text;
        next();
        FP8RL_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
        n.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!n.kwargs.empty()) {
          return template_error(cur().pos, "positional argument after keyword argument");
        }
        FP8RL_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
        n.args.push_back(std::move(value));
      }
      if (!is_op(",")) break;
      next();
    }
    return expect_op(")");
  }

  absl::StatusOr<std::string> dotted_name() {
    FP8RL_ASSIGN_OR_RETURN(std::string name, expect_name());
    while (is_op(".")) {
      next();
      FP8RL_ASSIGN_OR_RETURN(const std::string part, expect_name());
      name += "." + part;
    }
    return name;
  }

  // `| filter(args)`, `is [not] test arg` and calls after a unary expression.
  absl::StatusOr<ExprPtr> parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        const Pos pos = cur().pos;
        ExprPtr n = new_expr(Expr::kFilter, pos);
        FP8RL_ASSIGN_OR_RETURN(n->name, dotted_name());
        if (!is_known_filter(n->name)) {
          return template_error(pos, absl::StrCat("unsupported filter '", n->name, "'"));
        }
        n->kids = {e};
        if (is_op("(")) {
          next();
          FP8RL_RETURN_IF_ERROR(parse_args(*n));
        }
        e = n;
      } else if (is_name("is")) {
        next();
        FP8RL_ASSIGN_OR_RETURN(e, parse_test(std::move(e)));
      } else if (is_op("(")) {
        FP8RL_ASSIGN_OR_RETURN(e, parse_call(e));
      } else {
        return e;
      }
    }
  }

  // After `is`: `[not] name`, then `(args)` or one argument without parentheses.
  absl::StatusOr<ExprPtr> parse_test(ExprPtr subject) {
    ExprPtr n = new_expr(Expr::kTest, cur().pos);
    if (is_name("not")) {
      next();
      n->negated = true;
    }
    n->pos = cur().pos;
    if (is_compare_op(cur())) {
      n->name = next().text;
    } else {
      FP8RL_ASSIGN_OR_RETURN(n->name, dotted_name());
    }
    if (!is_known_test(n->name)) {
      return template_error(n->pos, absl::StrCat("unsupported test '", n->name, "'"));
    }
    n->kids = {std::move(subject)};
    if (is_op("(")) {
      next();
      FP8RL_RETURN_IF_ERROR(parse_args(*n));
    } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString ||
                cur().type == TokenType::kInt || cur().type == TokenType::kFloat || is_op("(") ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) return template_error(cur().pos, "unexpected 'is'");
      FP8RL_ASSIGN_OR_RETURN(ExprPtr primary, parse_primary());
      FP8RL_ASSIGN_OR_RETURN(ExprPtr arg, parse_postfix(std::move(primary)));
      n->args.push_back(std::move(arg));
    }
    return n;
  }

  std::vector<Piece> pieces_;
  int depth_ = 0;  // nesting levels open; see kMaxNestingDepth
  size_t at_ = 0;  // the current piece
  const std::vector<Token>* toks_ = nullptr;
  size_t ti_ = 0;  // the current token of pieces_[at_]
};

}  // namespace

absl::StatusOr<Body> parse_template(std::vector<Piece> pieces) {
  return Parser(std::move(pieces)).parse_template();
}

}  // namespace fp8rl::rl::chat_template_internal
