// Jinja subset interpreter for chat templates: lexer (jinja2's whitespace rules with HF's
// trim_blocks/lstrip_blocks), recursive-descent parser with jinja2's operator precedence, and a
// tree-walking evaluator over Python-like values.
#include "rl/chat_template.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "rl/chat_template_ast.h"
#include "rl/chat_template_lexer.h"
#include "rl/chat_template_parser.h"
#include "rl/chat_template_pystr.h"

namespace fp8rl::rl {
namespace chat_template_internal {
namespace {

// ---------------------------------------------------------------------------------------------
// Errors. The interpreter throws TemplateError internally; the public entry points turn it into
// absl::InvalidArgumentError.

struct TemplateError {
  std::string message;
};

[[noreturn]] void Fail(Pos pos, const std::string& what) {
  throw TemplateError{absl::StrCat("chat_template ", pos.line, ":", pos.col, ": ", what)};
}

// Python ints never overflow; an int64 result that would is an error here, never undefined
// behavior or a wrong number.
int64_t CheckedInt(bool overflowed, int64_t value, Pos pos) {
  if (overflowed) Fail(pos, "integer overflow");
  return value;
}

// Largest string or list a template may build by repetition ('-' * n, [x] * n): far above any
// prompt, far below what would exhaust memory.
constexpr size_t kMaxRepeatedSize = size_t{16} << 20;

// Bridges from the Status-returning lexer and string helpers to the exceptions this file still
// uses internally (until the parser and evaluator return Status too).
template <typename T>
T OrThrow(absl::StatusOr<T> v) {
  if (!v.ok()) throw TemplateError{std::string(v.status().message())};
  return *std::move(v);
}
std::u32string Decode(std::string_view s) { return OrThrow(decode_utf8(s)); }
void AppendUtf8(std::string& out, char32_t cp) { append_utf8(out, cp); }
std::string Encode(std::u32string_view s) { return encode_utf8(s); }
bool IsPySpace(char32_t c) { return is_py_space(c); }
std::string PyFloatRepr(double x) { return py_float_repr(x); }
std::string PyStrRepr(const std::string& s) { return OrThrow(py_str_repr(s)); }
std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count) {
  return OrThrow(py_replace(s, from, to, count));
}
bool IsAscii(const std::string& s) { return is_ascii(s); }
using Tok = TokenType;

// ---------------------------------------------------------------------------------------------
// Values.

struct Value;
using List = std::vector<Value>;
struct Dict;

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kFunc
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString; kFunc: the function or method name; kUndefined: the missing name
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;   // kDict, kNamespace (shared and mutable for ns.attr = ...)
  std::shared_ptr<Value> self;  // kFunc bound method: the receiver

  static Value Undefined(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value None() { return Make(Kind::kNone); }
  static Value Bool(bool x) {
    Value v = Make(Kind::kBool);
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v = Make(Kind::kInt);
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v = Make(Kind::kFloat);
    v.f = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v = Make(Kind::kString);
    v.s = std::move(x);
    return v;
  }
  static Value MakeList(List items = {}) {
    Value v = Make(Kind::kList);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value MakeDict();
  static Value Func(std::string name, std::shared_ptr<Value> self = nullptr) {
    Value v = Make(Kind::kFunc);
    v.s = std::move(name);
    v.self = std::move(self);
    return v;
  }
  static Value Make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
  bool is(Kind k) const { return kind == k; }
  bool is_number() const {
    return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat;
  }
  bool is_integral() const { return kind == Kind::kBool || kind == Kind::kInt; }
  int64_t as_int() const { return kind == Kind::kBool ? (b ? 1 : 0) : i; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(as_int()); }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(key, std::move(v));
  }
};

Value Value::MakeDict() {
  Value v = Make(Kind::kDict);
  v.dict = std::make_shared<Dict>();
  return v;
}

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunc:
      return "function";
  }
  return "?";
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        throw TemplateError{"chat_template: integer input above 2^63-1 is unsupported"};
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::MakeDict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), FromJson(it.value()));
      return d;
    }
    default:
      throw TemplateError{"chat_template: unsupported JSON input value (binary or discarded)"};
  }
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->items.empty();
    case Kind::kNamespace:
    case Kind::kFunc:
      return true;
  }
  return false;
}

std::string Repr(const Value& v, Pos pos);

// str(v): what {{ v }}, `~` and the `string` filter produce.
std::string Str(const Value& v, Pos pos) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return PyFloatRepr(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kList:
    case Kind::kDict:
      return Repr(v, pos);
    case Kind::kNamespace:
      Fail(pos, "printing a namespace object is unsupported");
    case Kind::kFunc:
      Fail(pos, absl::StrCat("printing function '", v.s, "' is unsupported"));
  }
  return "";
}

std::string Repr(const Value& v, Pos pos) {
  if (v.is(Kind::kString)) return PyStrRepr(v.s);
  if (v.is(Kind::kUndefined)) Fail(pos, "printing an undefined value inside a list or dict");
  if (v.is(Kind::kList)) {
    std::string out = "[";
    for (size_t k = 0; k < v.list->size(); ++k) {
      if (k) out += ", ";
      out += Repr((*v.list)[k], pos);
    }
    return out + "]";
  }
  if (v.is(Kind::kDict)) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, e] : v.dict->items) {
      if (!first) out += ", ";
      first = false;
      out += PyStrRepr(k) + ": " + Repr(e, pos);
    }
    return out + "}";
  }
  return Str(v, pos);
}

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as HF's tojson filter calls it.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void JsonString(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : Decode(s)) {
    char buf[16];
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            const char32_t u = c - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x",
                          static_cast<unsigned>(0xd800 + (u >> 10)),
                          static_cast<unsigned>(0xdc00 + (u & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          AppendUtf8(out, c);
        }
    }
  }
  out.push_back('"');
}

void Json(std::string& out, const Value& v, const JsonOptions& o, int depth, Pos pos) {
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(o.indent) * d, ' ');
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.b ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.i);
      return;
    case Kind::kFloat:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += PyFloatRepr(v.f);
      }
      return;
    case Kind::kString:
      JsonString(out, v.s, o.ensure_ascii);
      return;
    case Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += o.item_sep;
        newline(depth + 1);
        Json(out, (*v.list)[k], o, depth + 1, pos);
      }
      newline(depth);
      out.push_back(']');
      return;
    }
    case Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out.push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += o.item_sep;
        newline(depth + 1);
        JsonString(out, items[k]->first, o.ensure_ascii);
        out += o.key_sep;
        Json(out, items[k]->second, o, depth + 1, pos);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
    default:
      Fail(pos,
           absl::StrCat("tojson: object of type '", TypeName(v), "' is not JSON serializable"));
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Kind::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !Equal(v, *o)) return false;
      }
      return true;
    default:
      return a.dict == b.dict && a.s == b.s;
  }
}

}  // namespace

namespace {

// ---------------------------------------------------------------------------------------------
// Evaluator.

enum class Flow { kNormal, kBreak, kContinue };

std::vector<Value> Iterate(const Value& v, Pos pos) {
  switch (v.kind) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return *v.list;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::Str(kv.first));
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : Decode(v.s)) {
        std::string one;
        AppendUtf8(one, c);
        chars.push_back(Value::Str(one));
      }
      return chars;
    }
    default:
      Fail(pos, absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

// Python's slice.indices + gather for a sequence of length n.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start, const Value& stop,
                                  const Value& step, Pos pos) {
  auto opt = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is(Kind::kUndefined) || v.is(Kind::kNone)) return std::nullopt;
    if (!v.is_integral()) Fail(pos, absl::StrCat("slice ", what, " must be an integer"));
    return v.as_int();
  };
  const int64_t st = opt(step, "step").value_or(1);
  if (st == 0) Fail(pos, "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  const int64_t a = clamp(opt(start, "start"), st < 0 ? n - 1 : 0);
  const int64_t b = clamp(opt(stop, "stop"), st < 0 ? -1 : n);
  std::vector<int64_t> idx;
  for (int64_t k = a; st > 0 ? k < b : k > b; k += st) idx.push_back(k);
  return idx;
}

// str.strip/lstrip/rstrip with Python semantics (whitespace, or the code points in `chars`).
std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right, Pos pos) {
  std::u32string cs;
  const bool by_chars = !(chars.is(Kind::kUndefined) || chars.is(Kind::kNone));
  if (by_chars) {
    if (!chars.is(Kind::kString)) Fail(pos, "strip arg must be None or str");
    cs = Decode(chars.s);
  }
  const std::u32string u = Decode(s);
  auto strip = [&](char32_t c) {
    return by_chars ? cs.find(c) != std::u32string::npos : IsPySpace(c);
  };
  size_t a = 0, b = u.size();
  if (left) {
    while (a < b && strip(u[a])) ++a;
  }
  if (right) {
    while (b > a && strip(u[b - 1])) --b;
  }
  return Encode(std::u32string_view(u).substr(a, b - a));
}

std::vector<std::string> PySplit(const std::string& s, const Value& sep, int64_t maxsplit,
                                 Pos pos) {
  std::vector<std::string> out;
  if (sep.is(Kind::kUndefined) || sep.is(Kind::kNone)) {
    const std::u32string u = Decode(s);
    size_t k = 0;
    while (true) {
      while (k < u.size() && IsPySpace(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = u.size();
        while (e > k && IsPySpace(u[e - 1])) --e;
        out.push_back(Encode(std::u32string_view(u).substr(k, e - k)));
        break;
      }
      size_t e = k;
      while (e < u.size() && !IsPySpace(u[e])) ++e;
      out.push_back(Encode(std::u32string_view(u).substr(k, e - k)));
      k = e;
    }
    return out;
  }
  if (!sep.is(Kind::kString)) Fail(pos, "split separator must be a string");
  if (sep.s.empty()) Fail(pos, "split: empty separator");
  size_t k = 0;
  while (true) {
    const size_t f = s.find(sep.s, k);
    if (f == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(s.substr(k));
      break;
    }
    out.push_back(s.substr(k, f - k));
    k = f + sep.s.size();
  }
  return out;
}

const std::set<std::string, std::less<>>& StrMethods() {
  static const auto* m = new std::set<std::string, std::less<>>{
      // Every Python str method, so that an unsupported one is named when called.
      "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
      "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
      "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
      "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
      "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
      "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
      "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
      "swapcase",     "title",       "translate", "upper",      "zfill"};
  return *m;
}
const std::set<std::string, std::less<>>& DictMethods() {
  static const auto* m = new std::set<std::string, std::less<>>{
      "items", "keys",  "values",     "get",     "pop",     "update",
      "copy",  "clear", "setdefault", "popitem", "fromkeys"};
  return *m;
}
const std::set<std::string, std::less<>>& ListMethods() {
  static const auto* m = new std::set<std::string, std::less<>>{
      "append", "extend", "insert",  "pop",  "remove", "index",
      "count",  "sort",   "reverse", "copy", "clear"};
  return *m;
}

Value FromLiteral(const Literal& literal) {
  switch (literal.index()) {
    case 0:
      return Value::None();
    case 1:
      return Value::Bool(std::get<bool>(literal));
    case 2:
      return Value::Int(std::get<int64_t>(literal));
    case 3:
      return Value::Float(std::get<double>(literal));
    default:
      return Value::Str(std::get<std::string>(literal));
  }
}

class Evaluator {
 public:
  Evaluator(const ChatTemplateInputs& in) : in_(in) {
    frames_.emplace_back();
    auto& g = frames_.back();
    g["raise_exception"] = Value::Func("raise_exception");
    g["strftime_now"] = Value::Func("strftime_now");
    g["namespace"] = Value::Func("namespace");
    g["range"] = Value::Func("range");
    g["dict"] = Value::Func("dict");
    g["messages"] = FromJson(in.messages);
    g["tools"] = FromJson(in.tools);
    g["documents"] = Value::None();
    g["add_generation_prompt"] = Value::Bool(in.add_generation_prompt);
    if (in.bos_token) g["bos_token"] = Value::Str(*in.bos_token);
    if (in.eos_token) g["eos_token"] = Value::Str(*in.eos_token);
    if (!in.kwargs.is_null()) {
      if (!in.kwargs.is_object()) {
        throw TemplateError{"chat_template: kwargs must be a JSON object"};
      }
      for (auto it = in.kwargs.begin(); it != in.kwargs.end(); ++it) {
        g[it.key()] = FromJson(it.value());
      }
    }
  }

  std::string Run(const Body& body) {
    std::string out;
    Exec(body, out);
    return out;
  }

 private:
  Flow Exec(const Body& body, std::string& out) {
    for (const auto& st : body) {
      const Flow f = ExecOne(*st, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow ExecOne(const Stmt& st, std::string& out) {
    switch (st.type) {
      case Stmt::kText:
        out += st.text;
        return Flow::kNormal;
      case Stmt::kOutput:
        out += Str(Eval(*st.expr), st.expr->pos);
        return Flow::kNormal;
      case Stmt::kIf:
        for (size_t k = 0; k < st.conds.size(); ++k) {
          if (Truthy(Eval(*st.conds[k]))) return Exec(st.bodies[k], out);
        }
        if (st.bodies.size() > st.conds.size()) return Exec(st.bodies.back(), out);
        return Flow::kNormal;
      case Stmt::kFor:
        return ExecFor(st, out);
      case Stmt::kSet:
        Assign(st.names, Eval(*st.expr), st.pos);
        return Flow::kNormal;
      case Stmt::kSetBlock: {
        std::string captured;
        Exec(st.bodies[0], captured);
        frames_.back()[st.names[0]] = Value::Str(captured);
        return Flow::kNormal;
      }
      case Stmt::kSetNsAttr: {
        const Value ns = Lookup(st.names[0]);
        if (!ns.is(Kind::kNamespace)) {
          Fail(st.pos, absl::StrCat("cannot assign attribute '", st.names[1], "' on '", st.names[0],
                                    "' (", TypeName(ns), "): not a namespace"));
        }
        ns.dict->set(st.names[1], Eval(*st.expr));
        return Flow::kNormal;
      }
      case Stmt::kBreak:
        if (loop_depth_ == 0) Fail(st.pos, "'break' outside a loop");
        return Flow::kBreak;
      case Stmt::kContinue:
        if (loop_depth_ == 0) Fail(st.pos, "'continue' outside a loop");
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void Assign(const std::vector<std::string>& names, const Value& v, Pos pos) {
    auto& frame = frames_.back();
    if (names.size() == 1) {
      frame[names[0]] = v;
      return;
    }
    const std::vector<Value> items = Iterate(v, pos);
    if (items.size() != names.size()) {
      Fail(pos,
           absl::StrCat("cannot unpack ", items.size(), " values into ", names.size(), " names"));
    }
    for (size_t k = 0; k < names.size(); ++k) frame[names[k]] = items[k];
  }

  Flow ExecFor(const Stmt& st, std::string& out) {
    std::vector<Value> items = Iterate(Eval(*st.expr), st.expr->pos);
    if (st.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        frames_.emplace_back();
        Assign(st.names, item, st.pos);
        const bool keep = Truthy(Eval(*st.filter));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (st.has_else) return Exec(st.bodies[1], out);
      return Flow::kNormal;
    }
    ++loop_depth_;
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      frames_.emplace_back();
      Value loop = Value::MakeDict();
      loop.dict->set("index0", Value::Int(k));
      loop.dict->set("index", Value::Int(k + 1));
      loop.dict->set("revindex0", Value::Int(n - 1 - k));
      loop.dict->set("revindex", Value::Int(n - k));
      loop.dict->set("first", Value::Bool(k == 0));
      loop.dict->set("last", Value::Bool(k == n - 1));
      loop.dict->set("length", Value::Int(n));
      loop.dict->set("depth", Value::Int(1));
      loop.dict->set("depth0", Value::Int(0));
      if (k > 0) loop.dict->set("previtem", items[k - 1]);
      if (k + 1 < n) loop.dict->set("nextitem", items[k + 1]);
      frames_.back()["loop"] = loop;
      Assign(st.names, items[k], st.pos);
      const Flow f = Exec(st.bodies[0], out);
      frames_.pop_back();
      if (f == Flow::kBreak) break;
    }
    --loop_depth_;
    return Flow::kNormal;
  }

  Value Lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      const auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::Undefined(name);
  }

  [[noreturn]] void FailUndefined(const Value& v, Pos pos) {
    Fail(pos, v.s.empty() ? std::string("value is undefined")
                          : absl::StrCat("'", v.s, "' is undefined"));
  }

  // obj.name (jinja2: getattr first, then item).
  Value GetAttr(const Value& obj, const std::string& name, Pos pos) {
    switch (obj.kind) {
      case Kind::kUndefined:
        FailUndefined(obj, pos);
      case Kind::kDict:
        if (DictMethods().count(name)) return Value::Func(name, std::make_shared<Value>(obj));
        if (const Value* v = obj.dict->find(name)) return *v;
        return Value::Undefined(name);
      case Kind::kNamespace:
        if (const Value* v = obj.dict->find(name)) return *v;
        return Value::Undefined(name);
      case Kind::kString:
        if (StrMethods().count(name)) return Value::Func(name, std::make_shared<Value>(obj));
        return Value::Undefined(name);
      case Kind::kList:
        if (ListMethods().count(name)) return Value::Func(name, std::make_shared<Value>(obj));
        return Value::Undefined(name);
      default:
        return Value::Undefined(name);
    }
  }

  // obj[key] (jinja2: item first, then attribute for string keys).
  Value GetItem(const Value& obj, const Value& key, Pos pos) {
    switch (obj.kind) {
      case Kind::kUndefined:
        FailUndefined(obj, pos);
      case Kind::kDict:
        if (key.is(Kind::kString)) {
          if (const Value* v = obj.dict->find(key.s)) return *v;
          return GetAttr(obj, key.s, pos);
        }
        return Value::Undefined();
      case Kind::kList:
      case Kind::kString: {
        if (key.is(Kind::kString)) return GetAttr(obj, key.s, pos);
        if (!key.is_integral()) return Value::Undefined();
        if (obj.is(Kind::kList)) {
          const int64_t n = static_cast<int64_t>(obj.list->size());
          int64_t k = key.as_int();
          if (k < 0) k += n;
          if (k < 0 || k >= n) return Value::Undefined();
          return (*obj.list)[static_cast<size_t>(k)];
        }
        const std::u32string u = Decode(obj.s);
        const int64_t n = static_cast<int64_t>(u.size());
        int64_t k = key.as_int();
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::Undefined();
        std::string one;
        AppendUtf8(one, u[static_cast<size_t>(k)]);
        return Value::Str(one);
      }
      case Kind::kNamespace:
        if (key.is(Kind::kString)) return GetAttr(obj, key.s, pos);
        return Value::Undefined();
      default:
        return Value::Undefined();
    }
  }

  Value Eval(const Expr& e) {
    switch (e.type) {
      case Expr::kLiteral:
        return FromLiteral(e.literal);
      case Expr::kName:
        return Lookup(e.name);
      case Expr::kList: {
        List items;
        for (const auto& k : e.kids) items.push_back(Eval(*k));
        return Value::MakeList(std::move(items));
      }
      case Expr::kDict: {
        Value d = Value::MakeDict();
        for (size_t k = 0; k < e.kids.size(); k += 2) {
          const Value key = Eval(*e.kids[k]);
          if (!key.is(Kind::kString)) Fail(e.kids[k]->pos, "dict literal keys must be strings");
          d.dict->set(key.s, Eval(*e.kids[k + 1]));
        }
        return d;
      }
      case Expr::kGetAttr:
        return GetAttr(Eval(*e.kids[0]), e.name, e.pos);
      case Expr::kGetItem:
        return GetItem(Eval(*e.kids[0]), Eval(*e.kids[1]), e.pos);
      case Expr::kSlice: {
        const Value obj = Eval(*e.kids[0]);
        auto part = [&](size_t k) { return e.kids[k] ? Eval(*e.kids[k]) : Value::None(); };
        const Value a = part(1), b = part(2), c = part(3);
        if (obj.is(Kind::kList)) {
          List items;
          for (int64_t k : SliceIndices(static_cast<int64_t>(obj.list->size()), a, b, c, e.pos)) {
            items.push_back((*obj.list)[static_cast<size_t>(k)]);
          }
          return Value::MakeList(std::move(items));
        }
        if (obj.is(Kind::kString)) {
          const std::u32string u = Decode(obj.s);
          std::u32string r;
          for (int64_t k : SliceIndices(static_cast<int64_t>(u.size()), a, b, c, e.pos)) {
            r.push_back(u[static_cast<size_t>(k)]);
          }
          return Value::Str(Encode(r));
        }
        if (obj.is(Kind::kUndefined)) FailUndefined(obj, e.pos);
        Fail(e.pos, absl::StrCat("cannot slice a '", TypeName(obj), "'"));
      }
      case Expr::kCall:
        return EvalCall(e);
      case Expr::kFilter:
        return EvalFilter(e);
      case Expr::kTest: {
        const bool r = EvalTest(e);
        return Value::Bool(e.negated ? !r : r);
      }
      case Expr::kNeg:
      case Expr::kPos: {
        const Value v = Eval(*e.kids[0]);
        if (v.is(Kind::kUndefined)) FailUndefined(v, e.pos);
        if (!v.is_number()) {
          Fail(e.pos, absl::StrCat("bad operand type for unary ", e.type == Expr::kNeg ? "-" : "+",
                                   ": '", TypeName(v), "'"));
        }
        if (e.type == Expr::kPos) return v.is(Kind::kFloat) ? v : Value::Int(v.as_int());
        if (v.is(Kind::kFloat)) return Value::Float(-v.f);
        int64_t r = 0;
        const bool overflowed = __builtin_sub_overflow(int64_t{0}, v.as_int(), &r);
        return Value::Int(CheckedInt(overflowed, r, e.pos));
      }
      case Expr::kNot:
        return Value::Bool(!Truthy(Eval(*e.kids[0])));
      case Expr::kAnd: {
        Value a = Eval(*e.kids[0]);
        return Truthy(a) ? Eval(*e.kids[1]) : a;
      }
      case Expr::kOr: {
        Value a = Eval(*e.kids[0]);
        return Truthy(a) ? a : Eval(*e.kids[1]);
      }
      case Expr::kBinary:
        return EvalBinary(e.name, Eval(*e.kids[0]), Eval(*e.kids[1]), e.pos);
      case Expr::kCompare: {
        Value left = Eval(*e.kids[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = Eval(*e.kids[k + 1]);
          if (!Compare(e.ops[k], left, right, e.pos)) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::kCond:
        if (Truthy(Eval(*e.kids[1]))) return Eval(*e.kids[0]);
        return e.kids[2] ? Eval(*e.kids[2]) : Value::Undefined();
    }
    Fail(e.pos, "internal: unknown expression");
  }

  bool Contains(const Value& container, const Value& item, Pos pos) {
    switch (container.kind) {
      case Kind::kString:
        if (!item.is(Kind::kString)) {
          Fail(pos,
               absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
        }
        return container.s.find(item.s) != std::string::npos;
      case Kind::kList:
        return std::any_of(container.list->begin(), container.list->end(),
                           [&](const Value& v) { return Equal(v, item); });
      case Kind::kDict:
        return item.is(Kind::kString) && container.dict->find(item.s) != nullptr;
      case Kind::kUndefined:
        return false;
      default:
        Fail(pos, absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
    }
  }

  bool Compare(const std::string& op, const Value& a, const Value& b, Pos pos) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in") return Contains(b, a, pos);
    if (op == "not in") return !Contains(b, a, pos);
    int c = 0;
    if (a.is_number() && b.is_number()) {
      if (a.is_integral() && b.is_integral()) {
        c = a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
      } else {
        c = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
      }
    } else if (a.is(Kind::kString) && b.is(Kind::kString)) {
      c = a.s.compare(b.s) < 0 ? -1 : a.s.compare(b.s) > 0 ? 1 : 0;  // UTF-8 keeps cp order
    } else {
      Fail(pos, absl::StrCat("'", op, "' not supported between '", TypeName(a), "' and '",
                             TypeName(b), "'"));
    }
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  Value EvalBinary(const std::string& op, const Value& a, const Value& b, Pos pos) {
    if (op == "~") return Value::Str(Str(a, pos) + Str(b, pos));
    if (a.is(Kind::kUndefined)) FailUndefined(a, pos);
    if (b.is(Kind::kUndefined)) FailUndefined(b, pos);
    auto unsupported = [&]() {
      Fail(pos, absl::StrCat("unsupported operand types for ", op, ": '", TypeName(a), "' and '",
                             TypeName(b), "'"));
    };
    if (op == "+") {
      if (a.is(Kind::kString) && b.is(Kind::kString)) return Value::Str(a.s + b.s);
      if (a.is(Kind::kList) && b.is(Kind::kList)) {
        List items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::MakeList(std::move(items));
      }
    }
    if (op == "*" &&
        (a.is(Kind::kString) || a.is(Kind::kList) || b.is(Kind::kString) || b.is(Kind::kList))) {
      const Value& seq = a.is_integral() ? b : a;
      const Value& times = a.is_integral() ? a : b;
      if (!times.is_integral() || !(seq.is(Kind::kString) || seq.is(Kind::kList))) unsupported();
      const size_t unit = seq.is(Kind::kString) ? seq.s.size() : seq.list->size();
      if (times.as_int() > 0 && unit > 0 &&
          static_cast<uint64_t>(times.as_int()) > kMaxRepeatedSize / unit) {
        Fail(pos, absl::StrCat("repetition result longer than ", kMaxRepeatedSize));
      }
      if (seq.is(Kind::kString)) {
        std::string r;
        for (int64_t k = 0; k < times.as_int(); ++k) r += seq.s;
        return Value::Str(r);
      }
      List items;
      for (int64_t k = 0; k < times.as_int(); ++k) {
        items.insert(items.end(), seq.list->begin(), seq.list->end());
      }
      return Value::MakeList(std::move(items));
    }
    if (!a.is_number() || !b.is_number()) {
      if (op == "%" && a.is(Kind::kString)) {
        Fail(pos, "unsupported: printf-style string formatting with '%'");
      }
      unsupported();
    }
    const bool ints = a.is_integral() && b.is_integral();
    const double x = a.as_double(), y = b.as_double();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return Value::Float(x + y);
      const bool overflowed = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
      return Value::Int(CheckedInt(overflowed, r, pos));
    }
    if (op == "-") {
      if (!ints) return Value::Float(x - y);
      const bool overflowed = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
      return Value::Int(CheckedInt(overflowed, r, pos));
    }
    if (op == "*") {
      if (!ints) return Value::Float(x * y);
      const bool overflowed = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      return Value::Int(CheckedInt(overflowed, r, pos));
    }
    if (op == "/") {
      if (y == 0) Fail(pos, "division by zero");
      return Value::Float(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) Fail(pos, "integer division or modulo by zero");
      if (ints) {
        const int64_t p = a.as_int(), q = b.as_int();
        if (p == std::numeric_limits<int64_t>::min() && q == -1) Fail(pos, "integer overflow");
        int64_t d = p / q, m = p % q;
        if (m != 0 && ((m < 0) != (q < 0))) {
          --d;
          m += q;
        }
        return op == "//" ? Value::Int(d) : Value::Int(m);
      }
      const double d = std::floor(x / y);
      return op == "//" ? Value::Float(d) : Value::Float(x - d * y);
    }
    if (op == "**") {
      if (ints && b.as_int() >= 0) {
        // Square and multiply: at most 2 x 63 checked products, whatever the exponent.
        int64_t result = 1, base = a.as_int();
        for (int64_t e = b.as_int(); e > 0; e >>= 1) {
          if (e & 1) CheckedInt(__builtin_mul_overflow(result, base, &result), 0, pos);
          if (e > 1) CheckedInt(__builtin_mul_overflow(base, base, &base), 0, pos);
        }
        return Value::Int(result);
      }
      return Value::Float(std::pow(x, y));
    }
    Fail(pos, absl::StrCat("unsupported operator '", op, "'"));
  }

  // Positional then keyword arguments, resolved against a parameter list with defaults.
  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
  };

  Args EvalArgs(const Expr& e, size_t skip = 0) {
    Args a;
    for (size_t k = skip; k < e.args.size(); ++k) a.pos.push_back(Eval(*e.args[k]));
    for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, Eval(*v));
    return a;
  }

  // Binds `a` to `params` (Python-style); missing ones are Undefined. Errors name `fn`.
  std::vector<Value> Bind(const Args& a, const std::vector<std::string>& params,
                          const std::string& fn, Pos pos) {
    if (a.pos.size() > params.size()) {
      Fail(pos, absl::StrCat(fn, "() takes at most ", params.size(), " arguments (", a.pos.size(),
                             " given)"));
    }
    std::vector<Value> out(params.size());
    for (size_t k = 0; k < a.pos.size(); ++k) out[k] = a.pos[k];
    for (const auto& [name, v] : a.kw) {
      const auto it = std::find(params.begin(), params.end(), name);
      if (it == params.end()) {
        Fail(pos, absl::StrCat(fn, "() got an unsupported keyword argument '", name, "'"));
      }
      out[static_cast<size_t>(it - params.begin())] = v;
    }
    return out;
  }

  static bool Given(const Value& v) { return !v.is(Kind::kUndefined); }

  std::string ExpectStr(const Value& v, const std::string& what, Pos pos) {
    if (!v.is(Kind::kString)) {
      Fail(pos, absl::StrCat(what, " must be a string, got '", TypeName(v), "'"));
    }
    return v.s;
  }

  Value EvalCall(const Expr& call) {
    // Errors point at the callee (the function name, or the '.' of a method).
    Expr e = call;
    e.pos = call.kids[0]->pos;
    const Value callee = Eval(*e.kids[0]);
    if (callee.is(Kind::kUndefined)) FailUndefined(callee, e.pos);
    if (!callee.is(Kind::kFunc)) {
      Fail(e.pos, absl::StrCat("'", TypeName(callee), "' object is not callable"));
    }
    const Args a = EvalArgs(e);
    const std::string& fn = callee.s;
    if (callee.self) return CallMethod(*callee.self, fn, a, e.pos);
    if (fn == "raise_exception") {
      const auto p = Bind(a, {"message"}, fn, e.pos);
      throw TemplateError{absl::StrCat("chat_template ", e.pos.line, ":", e.pos.col,
                                       ": raise_exception: ", Str(p[0], e.pos))};
    }
    if (fn == "strftime_now") {
      const auto p = Bind(a, {"format"}, fn, e.pos);
      const std::string fmt = ExpectStr(p[0], "strftime_now format", e.pos);
      const std::time_t now = in_.now_unix_seconds ? static_cast<std::time_t>(*in_.now_unix_seconds)
                                                   : std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      const size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      if (n == 0 && !fmt.empty()) Fail(e.pos, "strftime_now: empty or too long result");
      return Value::Str(std::string(buf, n));
    }
    if (fn == "namespace" || fn == "dict") {
      Value d = Value::MakeDict();
      if (fn == "namespace") d.kind = Kind::kNamespace;
      if (a.pos.size() > 1) Fail(e.pos, absl::StrCat(fn, "() takes at most 1 positional argument"));
      if (a.pos.size() == 1) {
        if (!a.pos[0].is(Kind::kDict))
          Fail(e.pos, absl::StrCat(fn, "() positional must be a dict"));
        d.dict->items = a.pos[0].dict->items;
      }
      for (const auto& [k, v] : a.kw) d.dict->set(k, v);
      return d;
    }
    if (fn == "range") {
      if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) {
        Fail(e.pos, "range() takes 1 to 3 positional arguments");
      }
      for (const Value& v : a.pos) {
        if (!v.is_integral()) Fail(e.pos, "range() arguments must be integers");
      }
      int64_t start = 0, stop = 0, step = 1;
      if (a.pos.size() == 1) {
        stop = a.pos[0].as_int();
      } else {
        start = a.pos[0].as_int();
        stop = a.pos[1].as_int();
        if (a.pos.size() == 3) step = a.pos[2].as_int();
      }
      if (step == 0) Fail(e.pos, "range() step must not be zero");
      List items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
        items.push_back(Value::Int(k));
        if (items.size() > 1000000) Fail(e.pos, "range() too long");
        if (__builtin_add_overflow(k, step, &k)) break;  // past stop: Python's range ends here
      }
      return Value::MakeList(std::move(items));
    }
    Fail(e.pos, absl::StrCat("unsupported function '", fn, "'"));
  }

  Value CallMethod(const Value& self, const std::string& fn, const Args& a, Pos pos) {
    if (self.is(Kind::kString)) {
      const std::string& s = self.s;
      if (fn == "startswith" || fn == "endswith") {
        const auto p = Bind(a, {"prefix"}, fn, pos);
        std::vector<std::string> options;
        if (p[0].is(Kind::kList)) {
          for (const Value& v : *p[0].list) options.push_back(ExpectStr(v, fn + " argument", pos));
        } else {
          options.push_back(ExpectStr(p[0], fn + " argument", pos));
        }
        for (const std::string& o : options) {
          if (fn == "startswith"
                  ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                  : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0) {
            return Value::Bool(true);
          }
        }
        return Value::Bool(false);
      }
      if (fn == "strip" || fn == "lstrip" || fn == "rstrip") {
        const auto p = Bind(a, {"chars"}, fn, pos);
        return Value::Str(PyStrip(s, p[0], fn != "rstrip", fn != "lstrip", pos));
      }
      if (fn == "split") {
        const auto p = Bind(a, {"sep", "maxsplit"}, fn, pos);
        if (Given(p[1]) && !p[1].is_integral()) Fail(pos, "split maxsplit must be an integer");
        List items;
        for (auto& part : PySplit(s, p[0], Given(p[1]) ? p[1].as_int() : -1, pos)) {
          items.push_back(Value::Str(std::move(part)));
        }
        return Value::MakeList(std::move(items));
      }
      if (fn == "replace") {
        const auto p = Bind(a, {"old", "new", "count"}, fn, pos);
        if (Given(p[2]) && !p[2].is_integral()) Fail(pos, "replace count must be an integer");
        return Value::Str(PyReplace(s, ExpectStr(p[0], "replace old", pos),
                                    ExpectStr(p[1], "replace new", pos),
                                    Given(p[2]) ? p[2].as_int() : -1));
      }
      if (fn == "upper" || fn == "lower") {
        Bind(a, {}, fn, pos);
        if (!IsAscii(s)) Fail(pos, absl::StrCat("unsupported: str.", fn, "() on non-ASCII text"));
        std::string r = s;
        for (char& c : r) {
          c = static_cast<char>(fn == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                              : std::tolower(static_cast<unsigned char>(c)));
        }
        return Value::Str(r);
      }
      if (fn == "join") {
        const auto p = Bind(a, {"iterable"}, fn, pos);
        std::string r;
        bool first = true;
        for (const Value& v : Iterate(p[0], pos)) {
          if (!first) r += s;
          first = false;
          r += ExpectStr(v, "join item", pos);
        }
        return Value::Str(r);
      }
      Fail(pos, absl::StrCat("unsupported string method '", fn, "'"));
    }
    if (self.is(Kind::kDict)) {
      if (fn == "items" || fn == "keys" || fn == "values") {
        Bind(a, {}, fn, pos);
        List items;
        for (const auto& [k, v] : self.dict->items) {
          if (fn == "items") {
            items.push_back(Value::MakeList({Value::Str(k), v}));
          } else {
            items.push_back(fn == "keys" ? Value::Str(k) : v);
          }
        }
        return Value::MakeList(std::move(items));
      }
      if (fn == "get") {
        const auto p = Bind(a, {"key", "default"}, fn, pos);
        if (p[0].is(Kind::kString)) {
          if (const Value* v = self.dict->find(p[0].s)) return *v;
        }
        return Given(p[1]) ? p[1] : Value::None();
      }
      Fail(pos, absl::StrCat("unsupported dict method '", fn, "' (templates are immutable)"));
    }
    Fail(pos, absl::StrCat("unsupported ", TypeName(self), " method '", fn, "'"));
  }

  // Applies test `name` to `v` with extra args (for select/reject and `is`).
  bool ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args, Pos pos) {
    auto arg0 = [&]() -> const Value& {
      if (args.empty()) Fail(pos, absl::StrCat("test '", name, "' needs an argument"));
      return args[0];
    };
    if (name == "defined") return !v.is(Kind::kUndefined);
    if (name == "undefined") return v.is(Kind::kUndefined);
    if (name == "none") return v.is(Kind::kNone);
    if (name == "boolean") return v.is(Kind::kBool);
    if (name == "false") return v.is(Kind::kBool) && !v.b;
    if (name == "true") return v.is(Kind::kBool) && v.b;
    if (name == "integer") return v.is(Kind::kInt);
    if (name == "float") return v.is(Kind::kFloat);
    if (name == "number") return v.is_number();
    if (name == "string") return v.is(Kind::kString);
    if (name == "mapping") return v.is(Kind::kDict);
    if (name == "iterable") {
      return v.is(Kind::kList) || v.is(Kind::kDict) || v.is(Kind::kString) ||
             v.is(Kind::kUndefined);
    }
    if (name == "sequence") {
      return v.is(Kind::kList) || v.is(Kind::kDict) || v.is(Kind::kString) ||
             v.is(Kind::kUndefined);
    }
    if (name == "callable") return v.is(Kind::kFunc);
    if (name == "equalto" || name == "eq" || name == "==") return Equal(v, arg0());
    if (name == "ne" || name == "!=") return !Equal(v, arg0());
    if (name == "lt" || name == "<") return Compare("<", v, arg0(), pos);
    if (name == "le" || name == "<=") return Compare("<=", v, arg0(), pos);
    if (name == "gt" || name == ">") return Compare(">", v, arg0(), pos);
    if (name == "ge" || name == ">=") return Compare(">=", v, arg0(), pos);
    if (name == "in") return Contains(arg0(), v, pos);
    if (name == "sameas") {
      const Value& o = arg0();
      if (v.kind != o.kind) return false;
      if (v.is(Kind::kNone) || v.is(Kind::kUndefined)) return true;
      if (v.is(Kind::kBool)) return v.b == o.b;
      if (v.is(Kind::kList)) return v.list == o.list;
      if (v.is(Kind::kDict) || v.is(Kind::kNamespace)) return v.dict == o.dict;
      Fail(pos, "unsupported: 'sameas' on numbers or strings (identity is a CPython detail)");
    }
    if (name == "even" || name == "odd" || name == "divisibleby") {
      if (!v.is_integral()) Fail(pos, absl::StrCat("test '", name, "' needs an integer"));
      if (name == "divisibleby") {
        if (!arg0().is_integral() || arg0().as_int() == 0) {
          Fail(pos, "divisibleby needs a non-zero integer");
        }
        return v.as_int() % arg0().as_int() == 0;
      }
      const bool even = v.as_int() % 2 == 0;
      return name == "even" ? even : !even;
    }
    if (name == "lower" || name == "upper") {
      if (!v.is(Kind::kString) || !IsAscii(v.s)) {
        Fail(pos, absl::StrCat("test '", name, "' supports ASCII strings only"));
      }
      bool cased = false;
      for (char c : v.s) {
        if (std::isalpha(static_cast<unsigned char>(c))) {
          cased = true;
          if (name == "lower" ? std::isupper(static_cast<unsigned char>(c))
                              : std::islower(static_cast<unsigned char>(c))) {
            return false;
          }
        }
      }
      return cased;
    }
    Fail(pos, absl::StrCat("unsupported test '", name, "'"));
  }

  bool EvalTest(const Expr& e) {
    const Value v = Eval(*e.kids[0]);
    if (!e.kwargs.empty()) Fail(e.pos, "keyword arguments to tests are unsupported");
    std::vector<Value> args;
    for (const auto& a : e.args) args.push_back(Eval(*a));
    return ApplyTest(e.name, v, args, e.pos);
  }

  Value EvalFilter(const Expr& e) {
    const Value v = Eval(*e.kids[0]);
    const Args a = EvalArgs(e);
    const std::string& f = e.name;
    const Pos pos = e.pos;
    if (f == "trim") {
      const auto p = Bind(a, {"chars"}, f, pos);
      return Value::Str(PyStrip(Str(v, pos), p[0], true, true, pos));
    }
    if (f == "length" || f == "count") {
      Bind(a, {}, f, pos);
      switch (v.kind) {
        case Kind::kUndefined:
          return Value::Int(0);
        case Kind::kString:
          return Value::Int(static_cast<int64_t>(Decode(v.s).size()));
        case Kind::kList:
          return Value::Int(static_cast<int64_t>(v.list->size()));
        case Kind::kDict:
          return Value::Int(static_cast<int64_t>(v.dict->items.size()));
        default:
          Fail(pos, absl::StrCat("object of type '", TypeName(v), "' has no len()"));
      }
    }
    if (f == "tojson") {
      const auto p = Bind(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, f, pos);
      JsonOptions o;
      if (Given(p[0])) o.ensure_ascii = Truthy(p[0]);
      if (Given(p[1]) && !p[1].is(Kind::kNone)) {
        if (!p[1].is_integral()) Fail(pos, "tojson indent must be an integer");
        o.indent = static_cast<int>(std::max<int64_t>(0, p[1].as_int()));
        o.item_sep = ",";
      }
      if (Given(p[2]) && !p[2].is(Kind::kNone)) {
        if (!p[2].is(Kind::kList) || p[2].list->size() != 2) {
          Fail(pos, "tojson separators must be a pair of strings");
        }
        o.item_sep = ExpectStr((*p[2].list)[0], "tojson item separator", pos);
        o.key_sep = ExpectStr((*p[2].list)[1], "tojson key separator", pos);
      }
      if (Given(p[3])) o.sort_keys = Truthy(p[3]);
      std::string out;
      Json(out, v, o, 0, pos);
      return Value::Str(out);
    }
    if (f == "string") {
      Bind(a, {}, f, pos);
      return v.is(Kind::kString) ? v : Value::Str(Str(v, pos));
    }
    if (f == "safe") {
      Bind(a, {}, f, pos);
      return v;
    }
    if (f == "first" || f == "last") {
      Bind(a, {}, f, pos);
      const std::vector<Value> items = Iterate(v, pos);
      if (items.empty()) return Value::Undefined();
      return f == "first" ? items.front() : items.back();
    }
    if (f == "items") {
      Bind(a, {}, f, pos);
      if (v.is(Kind::kUndefined)) return Value::MakeList();
      if (!v.is(Kind::kDict)) Fail(pos, "items filter needs a mapping");
      return CallMethod(v, "items", {}, pos);
    }
    if (f == "list") {
      Bind(a, {}, f, pos);
      return Value::MakeList(Iterate(v, pos));
    }
    if (f == "join") {
      const auto p = Bind(a, {"d", "attribute"}, f, pos);
      if (Given(p[1])) Fail(pos, "unsupported: join(attribute=...)");
      const std::string sep = Given(p[0]) ? Str(p[0], pos) : "";
      std::string r;
      bool first = true;
      for (const Value& item : Iterate(v, pos)) {
        if (!first) r += sep;
        first = false;
        r += Str(item, pos);
      }
      return Value::Str(r);
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      if (!a.kw.empty()) Fail(pos, absl::StrCat(f, ": keyword arguments are unsupported"));
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "select" || f == "selectattr";
      size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (a.pos.empty()) Fail(pos, absl::StrCat(f, " needs an attribute name"));
        attr = ExpectStr(a.pos[0], f + " attribute", pos);
        k = 1;
      }
      std::string test;
      if (a.pos.size() > k) {
        test = ExpectStr(a.pos[k], f + " test name", pos);
        if (!is_known_test(test)) Fail(pos, absl::StrCat("unsupported test '", test, "'"));
      }
      const std::vector<Value> targs(a.pos.begin() + std::min(a.pos.size(), k + 1), a.pos.end());
      List out;
      for (const Value& item : Iterate(v, pos)) {
        const Value subject = by_attr ? GetAttr(item, attr, pos) : item;
        const bool r = test.empty() ? Truthy(subject) : ApplyTest(test, subject, targs, pos);
        if (r == keep_if) out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    }
    if (f == "map") {
      if (a.pos.empty()) {
        const auto p = Bind(a, {"attribute", "default"}, f, pos);
        const std::string attr = ExpectStr(p[0], "map attribute", pos);
        List out;
        for (const Value& item : Iterate(v, pos)) {
          Value r = GetAttr(item, attr, pos);
          if (r.is(Kind::kUndefined) && Given(p[1])) r = p[1];
          out.push_back(r);
        }
        return Value::MakeList(std::move(out));
      }
      Fail(pos, "unsupported: map(filter_name) (only map(attribute=...))");
    }
    if (f == "default" || f == "d") {
      const auto p = Bind(a, {"default_value", "boolean"}, f, pos);
      const bool use = Given(p[1]) && Truthy(p[1]) ? !Truthy(v) : v.is(Kind::kUndefined);
      if (use) return Given(p[0]) ? p[0] : Value::Str("");
      return v;
    }
    if (f == "replace") {
      const auto p = Bind(a, {"old", "new", "count"}, f, pos);
      if (Given(p[2]) && !p[2].is(Kind::kNone) && !p[2].is_integral()) {
        Fail(pos, "replace count must be an integer");
      }
      return Value::Str(PyReplace(Str(v, pos), Str(p[0], pos), Str(p[1], pos),
                                  Given(p[2]) && !p[2].is(Kind::kNone) ? p[2].as_int() : -1));
    }
    if (f == "lower" || f == "upper") {
      return CallMethod(Value::Str(Str(v, pos)), f, a, pos);
    }
    if (f == "abs") {
      Bind(a, {}, f, pos);
      if (!v.is_number()) Fail(pos, "abs needs a number");
      if (v.is(Kind::kFloat)) return Value::Float(std::fabs(v.f));
      if (v.as_int() == std::numeric_limits<int64_t>::min()) Fail(pos, "integer overflow");
      return Value::Int(std::llabs(v.as_int()));
    }
    if (f == "int") {
      const auto p = Bind(a, {"default", "base"}, f, pos);
      if (Given(p[1])) Fail(pos, "unsupported: int(base=...)");
      if (v.is_integral()) return Value::Int(v.as_int());
      if (v.is(Kind::kFloat)) {
        // Python truncates toward zero; NaN, infinities and values beyond int64 are errors.
        if (!(std::fabs(v.f) < 9223372036854775808.0)) {
          Fail(pos, "int filter: float out of the int64 range");
        }
        return Value::Int(static_cast<int64_t>(v.f));
      }
      Fail(pos, "unsupported: int filter on a non-number");
    }
    Fail(pos, absl::StrCat("unsupported filter '", f, "'"));
  }

  const ChatTemplateInputs& in_;
  std::vector<std::map<std::string, Value>> frames_;
  int loop_depth_ = 0;
};

}  // namespace
}  // namespace chat_template_internal

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  using namespace chat_template_internal;
  try {
    auto program = std::make_shared<Program>();
    program->body = OrThrow(parse_template(OrThrow(lex_template(source))));
    return ChatTemplate(std::move(program));
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(e.message);
  }
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  using namespace chat_template_internal;
  if (!inputs.messages.is_array()) {
    return absl::InvalidArgumentError("chat_template: messages must be a JSON array");
  }
  try {
    Evaluator ev(inputs);
    return ev.Run(program_->body);
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(e.message);
  }
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
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
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
