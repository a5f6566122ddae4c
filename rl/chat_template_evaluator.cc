// The chat-template evaluator (rl/chat_template_evaluator.h): statements write into the output,
// expressions evaluate to values (rl/chat_template_value.h); what a value does under an operator,
// filter, test or call is in rl/chat_template_builtins.h.
#include "rl/chat_template_evaluator.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rl/chat_template_builtins.h"
#include "rl/chat_template_value.h"

namespace fp8rl::rl::chat_template_internal {
namespace {

// What a statement asks of the enclosing loop.
enum class Flow { kNormal, kBreak, kContinue };

Value from_literal(const Literal& literal) {
  switch (literal.index()) {
    case 0:
      return Value::make_none();
    case 1:
      return Value::make_bool(std::get<bool>(literal));
    case 2:
      return Value::make_int(std::get<int64_t>(literal));
    case 3:
      return Value::make_float(std::get<double>(literal));
    default:
      return Value::make_str(std::get<std::string>(literal));
  }
}

class Evaluator {
 public:
  explicit Evaluator(const ChatTemplateInputs& in) : in_(in) {}

  // The globals HF passes (messages, tools, add_generation_prompt, tokens, **kwargs) and the
  // functions the template may call.
  absl::Status init_globals() {
    frames_.emplace_back();
    auto& g = frames_.back();
    for (const char* fn : {"raise_exception", "strftime_now", "namespace", "range", "dict"}) {
      g[fn] = Value::make_func(fn);
    }
    FP8RL_ASSIGN_OR_RETURN(g["messages"], from_json(in_.messages));
    FP8RL_ASSIGN_OR_RETURN(g["tools"], from_json(in_.tools));
    g["documents"] = Value::make_none();
    g["add_generation_prompt"] = Value::make_bool(in_.add_generation_prompt);
    if (in_.bos_token) g["bos_token"] = Value::make_str(*in_.bos_token);
    if (in_.eos_token) g["eos_token"] = Value::make_str(*in_.eos_token);
    if (!in_.kwargs.is_null()) {
      if (!in_.kwargs.is_object()) {
        return absl::InvalidArgumentError("chat_template: kwargs must be a JSON object");
      }
      for (auto it = in_.kwargs.begin(); it != in_.kwargs.end(); ++it) {
        FP8RL_ASSIGN_OR_RETURN(g[it.key()], from_json(it.value()));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> run(const Body& body) {
    std::string out;
    FP8RL_RETURN_IF_ERROR(exec(body, out).status());
    return out;
  }

 private:
  // --- statements

  absl::StatusOr<Flow> exec(const Body& body, std::string& out) {
    for (const auto& st : body) {
      FP8RL_ASSIGN_OR_RETURN(const Flow f, exec_one(*st, out));
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> exec_one(const Stmt& st, std::string& out) {
    switch (st.type) {
      case Stmt::kText:
        out += st.text;
        return Flow::kNormal;
      case Stmt::kOutput: {
        FP8RL_ASSIGN_OR_RETURN(const Value v, eval(*st.expr));
        FP8RL_ASSIGN_OR_RETURN(const std::string text, to_str(v, st.expr->pos));
        out += text;
        return Flow::kNormal;
      }
      case Stmt::kIf:
        for (size_t k = 0; k < st.conds.size(); ++k) {
          FP8RL_ASSIGN_OR_RETURN(const Value cond, eval(*st.conds[k]));
          if (truthy(cond)) return exec(st.bodies[k], out);
        }
        if (st.bodies.size() > st.conds.size()) return exec(st.bodies.back(), out);
        return Flow::kNormal;
      case Stmt::kFor:
        return exec_for(st, out);
      case Stmt::kSet: {
        FP8RL_ASSIGN_OR_RETURN(const Value v, eval(*st.expr));
        FP8RL_RETURN_IF_ERROR(assign(st.names, v, st.pos));
        return Flow::kNormal;
      }
      case Stmt::kSetBlock: {
        std::string captured;
        FP8RL_RETURN_IF_ERROR(exec(st.bodies[0], captured).status());
        frames_.back()[st.names[0]] = Value::make_str(captured);
        return Flow::kNormal;
      }
      case Stmt::kSetNsAttr: {
        const Value ns = lookup(st.names[0]);
        if (!ns.is(Kind::kNamespace)) {
          return template_error(
              st.pos, absl::StrCat("cannot assign attribute '", st.names[1], "' on '", st.names[0],
                                   "' (", type_name(ns), "): not a namespace"));
        }
        FP8RL_ASSIGN_OR_RETURN(Value v, eval(*st.expr));
        ns.dict->set(st.names[1], std::move(v));
        return Flow::kNormal;
      }
      case Stmt::kBreak:
        if (loop_depth_ == 0) return template_error(st.pos, "'break' outside a loop");
        return Flow::kBreak;
      case Stmt::kContinue:
        if (loop_depth_ == 0) return template_error(st.pos, "'continue' outside a loop");
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  // Binds `v` to one name, or unpacks it into several, in the innermost frame.
  absl::Status assign(const std::vector<std::string>& names, const Value& v, Pos pos) {
    auto& frame = frames_.back();
    if (names.size() == 1) {
      frame[names[0]] = v;
      return absl::OkStatus();
    }
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> items, iterate(v, pos));
    if (items.size() != names.size()) {
      return template_error(pos, absl::StrCat("cannot unpack ", items.size(), " values into ",
                                              names.size(), " names"));
    }
    for (size_t k = 0; k < names.size(); ++k) frame[names[k]] = items[k];
    return absl::OkStatus();
  }

  // Evaluates a for loop's `if` filter on one item in a scope of its own.
  absl::StatusOr<bool> keep_item(const Stmt& st, const Value& item) {
    frames_.emplace_back();
    absl::Status assigned = assign(st.names, item, st.pos);
    absl::StatusOr<Value> keep = assigned.ok() ? eval(*st.filter) : absl::StatusOr<Value>(assigned);
    frames_.pop_back();
    if (!keep.ok()) return keep.status();
    return truthy(*keep);
  }

  absl::StatusOr<Flow> exec_for(const Stmt& st, std::string& out) {
    FP8RL_ASSIGN_OR_RETURN(const Value iterable, eval(*st.expr));
    FP8RL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(iterable, st.expr->pos));
    if (st.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        FP8RL_ASSIGN_OR_RETURN(const bool keep, keep_item(st, item));
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (st.has_else) return exec(st.bodies[1], out);
      return Flow::kNormal;
    }
    ++loop_depth_;
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      frames_.emplace_back();
      Value loop = Value::make_dict();
      loop.dict->set("index0", Value::make_int(k));
      loop.dict->set("index", Value::make_int(k + 1));
      loop.dict->set("revindex0", Value::make_int(n - 1 - k));
      loop.dict->set("revindex", Value::make_int(n - k));
      loop.dict->set("first", Value::make_bool(k == 0));
      loop.dict->set("last", Value::make_bool(k == n - 1));
      loop.dict->set("length", Value::make_int(n));
      loop.dict->set("depth", Value::make_int(1));
      loop.dict->set("depth0", Value::make_int(0));
      if (k > 0) loop.dict->set("previtem", items[k - 1]);
      if (k + 1 < n) loop.dict->set("nextitem", items[k + 1]);
      frames_.back()["loop"] = loop;
      absl::Status assigned = assign(st.names, items[k], st.pos);
      absl::StatusOr<Flow> f =
          assigned.ok() ? exec(st.bodies[0], out) : absl::StatusOr<Flow>(assigned);
      frames_.pop_back();
      if (!f.ok()) return f.status();
      if (*f == Flow::kBreak) break;
    }
    --loop_depth_;
    return Flow::kNormal;
  }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      const auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::make_undefined(name);
  }

  // --- expressions

  absl::StatusOr<Value> eval(const Expr& e) {
    switch (e.type) {
      case Expr::kLiteral:
        return from_literal(e.literal);
      case Expr::kName:
        return lookup(e.name);
      case Expr::kList: {
        List items;
        for (const auto& k : e.kids) {
          FP8RL_ASSIGN_OR_RETURN(Value item, eval(*k));
          items.push_back(std::move(item));
        }
        return Value::make_list(std::move(items));
      }
      case Expr::kDict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k < e.kids.size(); k += 2) {
          FP8RL_ASSIGN_OR_RETURN(const Value key, eval(*e.kids[k]));
          if (!key.is(Kind::kString)) {
            return template_error(e.kids[k]->pos, "dict literal keys must be strings");
          }
          FP8RL_ASSIGN_OR_RETURN(Value v, eval(*e.kids[k + 1]));
          d.dict->set(key.s, std::move(v));
        }
        return d;
      }
      case Expr::kGetAttr: {
        FP8RL_ASSIGN_OR_RETURN(const Value obj, eval(*e.kids[0]));
        return get_attr(obj, e.name, e.pos);
      }
      case Expr::kGetItem: {
        // The key before the object: the order the one-file interpreter's compiler chose, kept
        // so that when both fail the same error is reported.
        FP8RL_ASSIGN_OR_RETURN(const Value key, eval(*e.kids[1]));
        FP8RL_ASSIGN_OR_RETURN(const Value obj, eval(*e.kids[0]));
        return get_item(obj, key, e.pos);
      }
      case Expr::kSlice: {
        FP8RL_ASSIGN_OR_RETURN(const Value obj, eval(*e.kids[0]));
        Value parts[3];
        for (size_t k = 1; k <= 3; ++k) {
          if (e.kids[k]) {
            FP8RL_ASSIGN_OR_RETURN(parts[k - 1], eval(*e.kids[k]));
          } else {
            parts[k - 1] = Value::make_none();
          }
        }
        return get_slice(obj, parts[0], parts[1], parts[2], e.pos);
      }
      case Expr::kCall:
        return eval_call(e);
      case Expr::kFilter: {
        FP8RL_ASSIGN_OR_RETURN(const Value v, eval(*e.kids[0]));
        FP8RL_ASSIGN_OR_RETURN(const Args a, eval_args(e));
        return apply_filter(e.name, v, a, e.pos);
      }
      case Expr::kTest: {
        FP8RL_ASSIGN_OR_RETURN(const Value v, eval(*e.kids[0]));
        if (!e.kwargs.empty()) {
          return template_error(e.pos, "keyword arguments to tests are unsupported");
        }
        FP8RL_ASSIGN_OR_RETURN(const Args a, eval_args(e));
        FP8RL_ASSIGN_OR_RETURN(const bool r, apply_test(e.name, v, a.positional, e.pos));
        return Value::make_bool(e.negated ? !r : r);
      }
      case Expr::kNeg:
      case Expr::kPos: {
        FP8RL_ASSIGN_OR_RETURN(const Value v, eval(*e.kids[0]));
        return unary_op(e.type == Expr::kNeg, v, e.pos);
      }
      case Expr::kNot: {
        FP8RL_ASSIGN_OR_RETURN(const Value v, eval(*e.kids[0]));
        return Value::make_bool(!truthy(v));
      }
      case Expr::kAnd: {
        FP8RL_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0]));
        if (truthy(a)) return eval(*e.kids[1]);
        return a;
      }
      case Expr::kOr: {
        FP8RL_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0]));
        if (truthy(a)) return a;
        return eval(*e.kids[1]);
      }
      case Expr::kBinary: {
        // The right operand first, as for kGetItem.
        FP8RL_ASSIGN_OR_RETURN(const Value b, eval(*e.kids[1]));
        FP8RL_ASSIGN_OR_RETURN(const Value a, eval(*e.kids[0]));
        return binary_op(e.name, a, b, e.pos);
      }
      case Expr::kCompare: {
        FP8RL_ASSIGN_OR_RETURN(Value left, eval(*e.kids[0]));
        for (size_t k = 0; k < e.ops.size(); ++k) {
          FP8RL_ASSIGN_OR_RETURN(Value right, eval(*e.kids[k + 1]));
          FP8RL_ASSIGN_OR_RETURN(const bool holds, compare(e.ops[k], left, right, e.pos));
          if (!holds) return Value::make_bool(false);
          left = std::move(right);
        }
        return Value::make_bool(true);
      }
      case Expr::kCond: {
        FP8RL_ASSIGN_OR_RETURN(const Value cond, eval(*e.kids[1]));
        if (truthy(cond)) return eval(*e.kids[0]);
        if (e.kids[2]) return eval(*e.kids[2]);
        return Value::make_undefined();
      }
    }
    return template_error(e.pos, "internal: unknown expression");
  }

  absl::StatusOr<Args> eval_args(const Expr& e) {
    Args a;
    for (const auto& arg : e.args) {
      FP8RL_ASSIGN_OR_RETURN(Value v, eval(*arg));
      a.positional.push_back(std::move(v));
    }
    for (const auto& [k, arg] : e.kwargs) {
      FP8RL_ASSIGN_OR_RETURN(Value v, eval(*arg));
      a.keyword.emplace_back(k, std::move(v));
    }
    return a;
  }

  // Errors point at the callee (the function name, or the '.' of a method).
  absl::StatusOr<Value> eval_call(const Expr& call) {
    const Pos pos = call.kids[0]->pos;
    FP8RL_ASSIGN_OR_RETURN(const Value callee, eval(*call.kids[0]));
    if (callee.is(Kind::kUndefined)) return undefined_error(callee, pos);
    if (!callee.is(Kind::kFunc)) {
      return template_error(pos, absl::StrCat("'", type_name(callee), "' object is not callable"));
    }
    FP8RL_ASSIGN_OR_RETURN(const Args a, eval_args(call));
    return call_function(callee, a, in_.now_unix_seconds, pos);
  }

  const ChatTemplateInputs& in_;
  std::vector<std::map<std::string, Value>> frames_;  // globals first, innermost scope last
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> render_program(const Program& program,
                                           const ChatTemplateInputs& inputs) {
  if (!inputs.messages.is_array()) {
    return absl::InvalidArgumentError("chat_template: messages must be a JSON array");
  }
  Evaluator evaluator(inputs);
  FP8RL_RETURN_IF_ERROR(evaluator.init_globals());
  return evaluator.run(program.body);
}

}  // namespace fp8rl::rl::chat_template_internal
