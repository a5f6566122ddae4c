// Operators, lookups, functions, methods, filters and tests of the chat-template evaluator
// (rl/chat_template_builtins.h).
#include "rl/chat_template_builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rl/chat_template_ast.h"
#include "rl/chat_template_pystr.h"

namespace fp8rl::rl::chat_template_internal {
namespace {

using NameSet = std::set<std::string, std::less<>>;

const NameSet& str_methods() {
  static const auto* m = new NameSet{
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

const NameSet& dict_methods() {
  static const auto* m = new NameSet{"items", "keys",  "values",     "get",     "pop",     "update",
                                     "copy",  "clear", "setdefault", "popitem", "fromkeys"};
  return *m;
}

const NameSet& list_methods() {
  static const auto* m = new NameSet{"append", "extend", "insert",  "pop",  "remove", "index",
                                     "count",  "sort",   "reverse", "copy", "clear"};
  return *m;
}

// Python ints never overflow; an int64 result that would is an error here, never undefined
// behavior or a wrong number.
absl::StatusOr<Value> checked_int(bool overflowed, int64_t value, Pos pos) {
  if (overflowed) return template_error(pos, "integer overflow");
  return Value::make_int(value);
}

bool given(const Value& v) { return !v.is(Kind::kUndefined); }

// Binds `a` to `params` (Python-style); missing ones are undefined. Errors name `fn`.
absl::StatusOr<std::vector<Value>> bind(const Args& a, const std::vector<std::string>& params,
                                        const std::string& fn, Pos pos) {
  if (a.positional.size() > params.size()) {
    return template_error(pos, absl::StrCat(fn, "() takes at most ", params.size(), " arguments (",
                                            a.positional.size(), " given)"));
  }
  std::vector<Value> out(params.size());
  for (size_t k = 0; k < a.positional.size(); ++k) out[k] = a.positional[k];
  for (const auto& [name, v] : a.keyword) {
    const auto it = std::find(params.begin(), params.end(), name);
    if (it == params.end()) {
      return template_error(
          pos, absl::StrCat(fn, "() got an unsupported keyword argument '", name, "'"));
    }
    out[static_cast<size_t>(it - params.begin())] = v;
  }
  return out;
}

absl::StatusOr<std::string> expect_str(const Value& v, const std::string& what, Pos pos) {
  if (!v.is(Kind::kString)) {
    return template_error(pos, absl::StrCat(what, " must be a string, got '", type_name(v), "'"));
  }
  return v.s;
}

// Python's slice.indices for a sequence of length n: the indices visited.
absl::StatusOr<std::vector<int64_t>> slice_indices(int64_t n, const Value& start, const Value& stop,
                                                   const Value& step, Pos pos) {
  auto opt = [&](const Value& v, const char* what) -> absl::StatusOr<std::optional<int64_t>> {
    if (v.is(Kind::kUndefined) || v.is(Kind::kNone)) return std::optional<int64_t>();
    if (!v.is_integral()) {
      return template_error(pos, absl::StrCat("slice ", what, " must be an integer"));
    }
    return std::optional<int64_t>(v.as_int());
  };
  FP8RL_ASSIGN_OR_RETURN(const std::optional<int64_t> step_given, opt(step, "step"));
  const int64_t st = step_given.value_or(1);
  if (st == 0) return template_error(pos, "slice step cannot be zero");
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
  FP8RL_ASSIGN_OR_RETURN(const std::optional<int64_t> start_given, opt(start, "start"));
  const int64_t a = clamp(start_given, st < 0 ? n - 1 : 0);
  FP8RL_ASSIGN_OR_RETURN(const std::optional<int64_t> stop_given, opt(stop, "stop"));
  const int64_t b = clamp(stop_given, st < 0 ? -1 : n);
  std::vector<int64_t> idx;
  for (int64_t k = a; st > 0 ? k < b : k > b; k += st) idx.push_back(k);
  return idx;
}

// str.strip/lstrip/rstrip with Python semantics (whitespace, or the code points in `chars`).
absl::StatusOr<std::string> py_strip(const std::string& s, const Value& chars, bool left,
                                     bool right, Pos pos) {
  std::u32string cs;
  const bool by_chars = !(chars.is(Kind::kUndefined) || chars.is(Kind::kNone));
  if (by_chars) {
    if (!chars.is(Kind::kString)) return template_error(pos, "strip arg must be None or str");
    FP8RL_ASSIGN_OR_RETURN(cs, decode_utf8(chars.s));
  }
  FP8RL_ASSIGN_OR_RETURN(const std::u32string u, decode_utf8(s));
  auto strip = [&](char32_t c) {
    return by_chars ? cs.find(c) != std::u32string::npos : is_py_space(c);
  };
  size_t a = 0, b = u.size();
  if (left) {
    while (a < b && strip(u[a])) ++a;
  }
  if (right) {
    while (b > a && strip(u[b - 1])) --b;
  }
  return encode_utf8(std::u32string_view(u).substr(a, b - a));
}

// str.split(sep, maxsplit) with Python semantics (sep none/undefined: runs of whitespace).
absl::StatusOr<std::vector<std::string>> py_split(const std::string& s, const Value& sep,
                                                  int64_t maxsplit, Pos pos) {
  std::vector<std::string> out;
  if (sep.is(Kind::kUndefined) || sep.is(Kind::kNone)) {
    FP8RL_ASSIGN_OR_RETURN(const std::u32string u, decode_utf8(s));
    size_t k = 0;
    while (true) {
      while (k < u.size() && is_py_space(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = u.size();
        while (e > k && is_py_space(u[e - 1])) --e;
        out.push_back(encode_utf8(std::u32string_view(u).substr(k, e - k)));
        break;
      }
      size_t e = k;
      while (e < u.size() && !is_py_space(u[e])) ++e;
      out.push_back(encode_utf8(std::u32string_view(u).substr(k, e - k)));
      k = e;
    }
    return out;
  }
  if (!sep.is(Kind::kString)) return template_error(pos, "split separator must be a string");
  if (sep.s.empty()) return template_error(pos, "split: empty separator");
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

absl::StatusOr<bool> contains(const Value& container, const Value& item, Pos pos) {
  switch (container.kind) {
    case Kind::kString:
      if (!item.is(Kind::kString)) {
        return template_error(
            pos,
            absl::StrCat("'in <string>' requires string as left operand, not ", type_name(item)));
      }
      return container.s.find(item.s) != std::string::npos;
    case Kind::kList:
      return std::any_of(container.list->begin(), container.list->end(),
                         [&](const Value& v) { return equal(v, item); });
    case Kind::kDict:
      return item.is(Kind::kString) && container.dict->find(item.s) != nullptr;
    case Kind::kUndefined:
      return false;
    default:
      return template_error(
          pos, absl::StrCat("argument of type '", type_name(container), "' is not iterable"));
  }
}

// --- global functions and methods

absl::StatusOr<Value> call_str_method(const std::string& s, const std::string& fn, const Args& a,
                                      Pos pos) {
  if (fn == "startswith" || fn == "endswith") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"prefix"}, fn, pos));
    std::vector<std::string> options;
    if (p[0].is(Kind::kList)) {
      for (const Value& v : *p[0].list) {
        FP8RL_ASSIGN_OR_RETURN(std::string option, expect_str(v, fn + " argument", pos));
        options.push_back(std::move(option));
      }
    } else {
      FP8RL_ASSIGN_OR_RETURN(std::string option, expect_str(p[0], fn + " argument", pos));
      options.push_back(std::move(option));
    }
    for (const std::string& o : options) {
      if (fn == "startswith"
              ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
              : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0) {
        return Value::make_bool(true);
      }
    }
    return Value::make_bool(false);
  }
  if (fn == "strip" || fn == "lstrip" || fn == "rstrip") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"chars"}, fn, pos));
    FP8RL_ASSIGN_OR_RETURN(std::string r, py_strip(s, p[0], fn != "rstrip", fn != "lstrip", pos));
    return Value::make_str(std::move(r));
  }
  if (fn == "split") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"sep", "maxsplit"}, fn, pos));
    if (given(p[1]) && !p[1].is_integral()) {
      return template_error(pos, "split maxsplit must be an integer");
    }
    FP8RL_ASSIGN_OR_RETURN(std::vector<std::string> parts,
                           py_split(s, p[0], given(p[1]) ? p[1].as_int() : -1, pos));
    List items;
    for (auto& part : parts) items.push_back(Value::make_str(std::move(part)));
    return Value::make_list(std::move(items));
  }
  if (fn == "replace") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"old", "new", "count"}, fn, pos));
    if (given(p[2]) && !p[2].is_integral()) {
      return template_error(pos, "replace count must be an integer");
    }
    // `new` is checked before `old`: the order the one-file interpreter's compiler chose.
    FP8RL_ASSIGN_OR_RETURN(const std::string to, expect_str(p[1], "replace new", pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string from, expect_str(p[0], "replace old", pos));
    FP8RL_ASSIGN_OR_RETURN(std::string r,
                           py_replace(s, from, to, given(p[2]) ? p[2].as_int() : -1));
    return Value::make_str(std::move(r));
  }
  if (fn == "upper" || fn == "lower") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, fn, pos).status());
    if (!is_ascii(s)) {
      return template_error(pos, absl::StrCat("unsupported: str.", fn, "() on non-ASCII text"));
    }
    std::string r = s;
    for (char& c : r) {
      c = static_cast<char>(fn == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                          : std::tolower(static_cast<unsigned char>(c)));
    }
    return Value::make_str(r);
  }
  if (fn == "join") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"iterable"}, fn, pos));
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> items, iterate(p[0], pos));
    std::string r;
    bool first = true;
    for (const Value& v : items) {
      if (!first) r += s;
      first = false;
      FP8RL_ASSIGN_OR_RETURN(const std::string item, expect_str(v, "join item", pos));
      r += item;
    }
    return Value::make_str(r);
  }
  return template_error(pos, absl::StrCat("unsupported string method '", fn, "'"));
}

absl::StatusOr<Value> call_method(const Value& self, const std::string& fn, const Args& a,
                                  Pos pos) {
  if (self.is(Kind::kString)) return call_str_method(self.s, fn, a, pos);
  if (self.is(Kind::kDict)) {
    if (fn == "items" || fn == "keys" || fn == "values") {
      FP8RL_RETURN_IF_ERROR(bind(a, {}, fn, pos).status());
      List items;
      for (const auto& [k, v] : self.dict->items) {
        if (fn == "items") {
          items.push_back(Value::make_list({Value::make_str(k), v}));
        } else {
          items.push_back(fn == "keys" ? Value::make_str(k) : v);
        }
      }
      return Value::make_list(std::move(items));
    }
    if (fn == "get") {
      FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"key", "default"}, fn, pos));
      if (p[0].is(Kind::kString)) {
        if (const Value* v = self.dict->find(p[0].s)) return *v;
      }
      return given(p[1]) ? p[1] : Value::make_none();
    }
    return template_error(
        pos, absl::StrCat("unsupported dict method '", fn, "' (templates are immutable)"));
  }
  return template_error(pos, absl::StrCat("unsupported ", type_name(self), " method '", fn, "'"));
}

absl::StatusOr<Value> call_range(const Args& a, Pos pos) {
  if (!a.keyword.empty() || a.positional.empty() || a.positional.size() > 3) {
    return template_error(pos, "range() takes 1 to 3 positional arguments");
  }
  for (const Value& v : a.positional) {
    if (!v.is_integral()) return template_error(pos, "range() arguments must be integers");
  }
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].as_int();
  } else {
    start = a.positional[0].as_int();
    stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
  }
  if (step == 0) return template_error(pos, "range() step must not be zero");
  List items;
  for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
    items.push_back(Value::make_int(k));
    if (items.size() > 1000000) return template_error(pos, "range() too long");
    if (__builtin_add_overflow(k, step, &k)) break;  // past stop: Python's range ends here
  }
  return Value::make_list(std::move(items));
}

}  // namespace

absl::Status undefined_error(const Value& v, Pos pos) {
  return template_error(pos, v.s.empty() ? std::string("value is undefined")
                                         : absl::StrCat("'", v.s, "' is undefined"));
}

absl::StatusOr<Value> get_attr(const Value& obj, const std::string& name, Pos pos) {
  switch (obj.kind) {
    case Kind::kUndefined:
      return undefined_error(obj, pos);
    case Kind::kDict:
      if (dict_methods().count(name)) {
        return Value::make_func(name, std::make_shared<Value>(obj));
      }
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::make_undefined(name);
    case Kind::kNamespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::make_undefined(name);
    case Kind::kString:
      if (str_methods().count(name)) return Value::make_func(name, std::make_shared<Value>(obj));
      return Value::make_undefined(name);
    case Kind::kList:
      if (list_methods().count(name)) {
        return Value::make_func(name, std::make_shared<Value>(obj));
      }
      return Value::make_undefined(name);
    default:
      return Value::make_undefined(name);
  }
}

absl::StatusOr<Value> get_item(const Value& obj, const Value& key, Pos pos) {
  switch (obj.kind) {
    case Kind::kUndefined:
      return undefined_error(obj, pos);
    case Kind::kDict:
      if (key.is(Kind::kString)) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        return get_attr(obj, key.s, pos);
      }
      return Value::make_undefined();
    case Kind::kList:
    case Kind::kString: {
      if (key.is(Kind::kString)) return get_attr(obj, key.s, pos);
      if (!key.is_integral()) return Value::make_undefined();
      if (obj.is(Kind::kList)) {
        const int64_t n = static_cast<int64_t>(obj.list->size());
        int64_t k = key.as_int();
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::make_undefined();
        return (*obj.list)[static_cast<size_t>(k)];
      }
      FP8RL_ASSIGN_OR_RETURN(const std::u32string u, decode_utf8(obj.s));
      const int64_t n = static_cast<int64_t>(u.size());
      int64_t k = key.as_int();
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::make_undefined();
      std::string one;
      append_utf8(one, u[static_cast<size_t>(k)]);
      return Value::make_str(one);
    }
    case Kind::kNamespace:
      if (key.is(Kind::kString)) return get_attr(obj, key.s, pos);
      return Value::make_undefined();
    default:
      return Value::make_undefined();
  }
}

absl::StatusOr<Value> get_slice(const Value& obj, const Value& start, const Value& stop,
                                const Value& step, Pos pos) {
  if (obj.is(Kind::kList)) {
    FP8RL_ASSIGN_OR_RETURN(
        const std::vector<int64_t> indices,
        slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step, pos));
    List items;
    for (int64_t k : indices) items.push_back((*obj.list)[static_cast<size_t>(k)]);
    return Value::make_list(std::move(items));
  }
  if (obj.is(Kind::kString)) {
    FP8RL_ASSIGN_OR_RETURN(const std::u32string u, decode_utf8(obj.s));
    FP8RL_ASSIGN_OR_RETURN(const std::vector<int64_t> indices,
                           slice_indices(static_cast<int64_t>(u.size()), start, stop, step, pos));
    std::u32string r;
    for (int64_t k : indices) r.push_back(u[static_cast<size_t>(k)]);
    return Value::make_str(encode_utf8(r));
  }
  if (obj.is(Kind::kUndefined)) return undefined_error(obj, pos);
  return template_error(pos, absl::StrCat("cannot slice a '", type_name(obj), "'"));
}

absl::StatusOr<Value> unary_op(bool negate, const Value& v, Pos pos) {
  if (v.is(Kind::kUndefined)) return undefined_error(v, pos);
  if (!v.is_number()) {
    return template_error(pos, absl::StrCat("bad operand type for unary ", negate ? "-" : "+",
                                            ": '", type_name(v), "'"));
  }
  if (!negate) return v.is(Kind::kFloat) ? v : Value::make_int(v.as_int());
  if (v.is(Kind::kFloat)) return Value::make_float(-v.f);
  int64_t r = 0;
  const bool overflowed = __builtin_sub_overflow(int64_t{0}, v.as_int(), &r);
  return checked_int(overflowed, r, pos);
}

absl::StatusOr<Value> binary_op(const std::string& op, const Value& a, const Value& b, Pos pos) {
  if (op == "~") {
    // The right operand is printed first: the order the one-file interpreter's compiler chose,
    // kept so that when both fail the same error is reported.
    FP8RL_ASSIGN_OR_RETURN(const std::string right, to_str(b, pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string left, to_str(a, pos));
    return Value::make_str(left + right);
  }
  if (a.is(Kind::kUndefined)) return undefined_error(a, pos);
  if (b.is(Kind::kUndefined)) return undefined_error(b, pos);
  auto unsupported = [&]() {
    return template_error(pos, absl::StrCat("unsupported operand types for ", op, ": '",
                                            type_name(a), "' and '", type_name(b), "'"));
  };
  if (op == "+") {
    if (a.is(Kind::kString) && b.is(Kind::kString)) return Value::make_str(a.s + b.s);
    if (a.is(Kind::kList) && b.is(Kind::kList)) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(items));
    }
  }
  if (op == "*" &&
      (a.is(Kind::kString) || a.is(Kind::kList) || b.is(Kind::kString) || b.is(Kind::kList))) {
    const Value& seq = a.is_integral() ? b : a;
    const Value& times = a.is_integral() ? a : b;
    if (!times.is_integral() || !(seq.is(Kind::kString) || seq.is(Kind::kList))) {
      return unsupported();
    }
    const size_t unit = seq.is(Kind::kString) ? seq.s.size() : seq.list->size();
    if (times.as_int() > 0 && unit > 0 &&
        static_cast<uint64_t>(times.as_int()) > kMaxRepeatedSize / unit) {
      return template_error(pos, absl::StrCat("repetition result longer than ", kMaxRepeatedSize));
    }
    if (seq.is(Kind::kString)) {
      std::string r;
      for (int64_t k = 0; k < times.as_int(); ++k) r += seq.s;
      return Value::make_str(r);
    }
    List items;
    for (int64_t k = 0; k < times.as_int(); ++k) {
      items.insert(items.end(), seq.list->begin(), seq.list->end());
    }
    return Value::make_list(std::move(items));
  }
  if (!a.is_number() || !b.is_number()) {
    if (op == "%" && a.is(Kind::kString)) {
      return template_error(pos, "unsupported: printf-style string formatting with '%'");
    }
    return unsupported();
  }
  const bool ints = a.is_integral() && b.is_integral();
  const double x = a.as_double(), y = b.as_double();
  int64_t r = 0;
  if (op == "+") {
    if (!ints) return Value::make_float(x + y);
    const bool overflowed = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
    return checked_int(overflowed, r, pos);
  }
  if (op == "-") {
    if (!ints) return Value::make_float(x - y);
    const bool overflowed = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
    return checked_int(overflowed, r, pos);
  }
  if (op == "*") {
    if (!ints) return Value::make_float(x * y);
    const bool overflowed = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
    return checked_int(overflowed, r, pos);
  }
  if (op == "/") {
    if (y == 0) return template_error(pos, "division by zero");
    return Value::make_float(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) return template_error(pos, "integer division or modulo by zero");
    if (ints) {
      const int64_t p = a.as_int(), q = b.as_int();
      if (p == std::numeric_limits<int64_t>::min() && q == -1) {
        return template_error(pos, "integer overflow");
      }
      int64_t d = p / q, m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) {
        --d;
        m += q;
      }
      return op == "//" ? Value::make_int(d) : Value::make_int(m);
    }
    const double d = std::floor(x / y);
    return op == "//" ? Value::make_float(d) : Value::make_float(x - d * y);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      // Square and multiply: at most 2 x 63 checked products, whatever the exponent.
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) {
          return template_error(pos, "integer overflow");
        }
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
          return template_error(pos, "integer overflow");
        }
      }
      return Value::make_int(result);
    }
    return Value::make_float(std::pow(x, y));
  }
  return template_error(pos, absl::StrCat("unsupported operator '", op, "'"));
}

absl::StatusOr<bool> compare(const std::string& op, const Value& a, const Value& b, Pos pos) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(b, a, pos);
  if (op == "not in") {
    FP8RL_ASSIGN_OR_RETURN(const bool in, contains(b, a, pos));
    return !in;
  }
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
    return template_error(pos, absl::StrCat("'", op, "' not supported between '", type_name(a),
                                            "' and '", type_name(b), "'"));
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

absl::StatusOr<Value> call_function(const Value& callee, const Args& a,
                                    std::optional<int64_t> now_unix_seconds, Pos pos) {
  const std::string& fn = callee.s;
  if (callee.self) return call_method(*callee.self, fn, a, pos);
  if (fn == "raise_exception") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"message"}, fn, pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string message, to_str(p[0], pos));
    return template_error(pos, absl::StrCat("raise_exception: ", message));
  }
  if (fn == "strftime_now") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"format"}, fn, pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string fmt, expect_str(p[0], "strftime_now format", pos));
    const std::time_t now =
        now_unix_seconds ? static_cast<std::time_t>(*now_unix_seconds) : std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty())
      return template_error(pos, "strftime_now: empty or too long result");
    return Value::make_str(std::string(buf, n));
  }
  if (fn == "namespace" || fn == "dict") {
    Value d = Value::make_dict();
    if (fn == "namespace") d.kind = Kind::kNamespace;
    if (a.positional.size() > 1) {
      return template_error(pos, absl::StrCat(fn, "() takes at most 1 positional argument"));
    }
    if (a.positional.size() == 1) {
      if (!a.positional[0].is(Kind::kDict)) {
        return template_error(pos, absl::StrCat(fn, "() positional must be a dict"));
      }
      d.dict->items = a.positional[0].dict->items;
    }
    for (const auto& [k, v] : a.keyword) d.dict->set(k, v);
    return d;
  }
  if (fn == "range") return call_range(a, pos);
  return template_error(pos, absl::StrCat("unsupported function '", fn, "'"));
}

absl::StatusOr<bool> apply_test(const std::string& name, const Value& v,
                                const std::vector<Value>& args, Pos pos) {
  auto arg0 = [&]() -> absl::StatusOr<Value> {
    if (args.empty())
      return template_error(pos, absl::StrCat("test '", name, "' needs an argument"));
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
  if (name == "iterable" || name == "sequence") {
    return v.is(Kind::kList) || v.is(Kind::kDict) || v.is(Kind::kString) || v.is(Kind::kUndefined);
  }
  if (name == "callable") return v.is(Kind::kFunc);
  static const auto* kComparisons =
      new std::vector<std::pair<std::vector<std::string>, std::string>>{
          {{"equalto", "eq", "=="}, "=="},
          {{"ne", "!="}, "!="},
          {{"lt", "<"}, "<"},
          {{"le", "<="}, "<="},
          {{"gt", ">"}, ">"},
          {{"ge", ">="}, ">="}};
  for (const auto& [names, op] : *kComparisons) {
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      FP8RL_ASSIGN_OR_RETURN(const Value other, arg0());
      return compare(op, v, other, pos);
    }
  }
  if (name == "in") {
    FP8RL_ASSIGN_OR_RETURN(const Value container, arg0());
    return contains(container, v, pos);
  }
  if (name == "sameas") {
    FP8RL_ASSIGN_OR_RETURN(const Value o, arg0());
    if (v.kind != o.kind) return false;
    if (v.is(Kind::kNone) || v.is(Kind::kUndefined)) return true;
    if (v.is(Kind::kBool)) return v.b == o.b;
    if (v.is(Kind::kList)) return v.list == o.list;
    if (v.is(Kind::kDict) || v.is(Kind::kNamespace)) return v.dict == o.dict;
    return template_error(
        pos, "unsupported: 'sameas' on numbers or strings (identity is a CPython detail)");
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!v.is_integral()) {
      return template_error(pos, absl::StrCat("test '", name, "' needs an integer"));
    }
    if (name == "divisibleby") {
      FP8RL_ASSIGN_OR_RETURN(const Value divisor, arg0());
      if (!divisor.is_integral() || divisor.as_int() == 0) {
        return template_error(pos, "divisibleby needs a non-zero integer");
      }
      return v.as_int() % divisor.as_int() == 0;
    }
    const bool even = v.as_int() % 2 == 0;
    return name == "even" ? even : !even;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is(Kind::kString) || !is_ascii(v.s)) {
      return template_error(pos, absl::StrCat("test '", name, "' supports ASCII strings only"));
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
  return template_error(pos, absl::StrCat("unsupported test '", name, "'"));
}

namespace {

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> filter_select(const std::string& f, const Value& v, const Args& a, Pos pos) {
  if (!a.keyword.empty()) {
    return template_error(pos, absl::StrCat(f, ": keyword arguments are unsupported"));
  }
  const bool by_attr = f == "selectattr" || f == "rejectattr";
  const bool keep_if = f == "select" || f == "selectattr";
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.positional.empty()) {
      return template_error(pos, absl::StrCat(f, " needs an attribute name"));
    }
    FP8RL_ASSIGN_OR_RETURN(attr, expect_str(a.positional[0], f + " attribute", pos));
    k = 1;
  }
  std::string test;
  if (a.positional.size() > k) {
    FP8RL_ASSIGN_OR_RETURN(test, expect_str(a.positional[k], f + " test name", pos));
    if (!is_known_test(test)) {
      return template_error(pos, absl::StrCat("unsupported test '", test, "'"));
    }
  }
  const std::vector<Value> targs(a.positional.begin() + std::min(a.positional.size(), k + 1),
                                 a.positional.end());
  FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> items, iterate(v, pos));
  List out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      FP8RL_ASSIGN_OR_RETURN(subject, get_attr(item, attr, pos));
    }
    bool r = false;
    if (test.empty()) {
      r = truthy(subject);
    } else {
      FP8RL_ASSIGN_OR_RETURN(r, apply_test(test, subject, targs, pos));
    }
    if (r == keep_if) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

// tojson(ensure_ascii, indent, separators, sort_keys), HF's override of jinja2's.
absl::StatusOr<Value> filter_tojson(const Value& v, const Args& a, Pos pos) {
  FP8RL_ASSIGN_OR_RETURN(
      const std::vector<Value> p,
      bind(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson", pos));
  JsonOptions o;
  if (given(p[0])) o.ensure_ascii = truthy(p[0]);
  if (given(p[1]) && !p[1].is(Kind::kNone)) {
    if (!p[1].is_integral()) return template_error(pos, "tojson indent must be an integer");
    o.indent = static_cast<int>(std::max<int64_t>(0, p[1].as_int()));
    o.item_sep.assign(1, ',');  // (not `= ","`: GCC 12 -O3 warns -Wrestrict falsely)
  }
  if (given(p[2]) && !p[2].is(Kind::kNone)) {
    if (!p[2].is(Kind::kList) || p[2].list->size() != 2) {
      return template_error(pos, "tojson separators must be a pair of strings");
    }
    FP8RL_ASSIGN_OR_RETURN(o.item_sep, expect_str((*p[2].list)[0], "tojson item separator", pos));
    FP8RL_ASSIGN_OR_RETURN(o.key_sep, expect_str((*p[2].list)[1], "tojson key separator", pos));
  }
  if (given(p[3])) o.sort_keys = truthy(p[3]);
  std::string out;
  FP8RL_RETURN_IF_ERROR(append_json(out, v, o, 0, pos));
  return Value::make_str(out);
}

}  // namespace

absl::StatusOr<Value> apply_filter(const std::string& f, const Value& v, const Args& a, Pos pos) {
  if (f == "trim") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"chars"}, f, pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string text, to_str(v, pos));
    FP8RL_ASSIGN_OR_RETURN(std::string r, py_strip(text, p[0], true, true, pos));
    return Value::make_str(std::move(r));
  }
  if (f == "length" || f == "count") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, f, pos).status());
    switch (v.kind) {
      case Kind::kUndefined:
        return Value::make_int(0);
      case Kind::kString: {
        FP8RL_ASSIGN_OR_RETURN(const std::u32string u, decode_utf8(v.s));
        return Value::make_int(static_cast<int64_t>(u.size()));
      }
      case Kind::kList:
        return Value::make_int(static_cast<int64_t>(v.list->size()));
      case Kind::kDict:
        return Value::make_int(static_cast<int64_t>(v.dict->items.size()));
      default:
        return template_error(pos,
                              absl::StrCat("object of type '", type_name(v), "' has no len()"));
    }
  }
  if (f == "tojson") return filter_tojson(v, a, pos);
  if (f == "string") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, f, pos).status());
    if (v.is(Kind::kString)) return v;
    FP8RL_ASSIGN_OR_RETURN(std::string text, to_str(v, pos));
    return Value::make_str(std::move(text));
  }
  if (f == "safe") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, f, pos).status());
    return v;
  }
  if (f == "first" || f == "last") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, f, pos).status());
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> items, iterate(v, pos));
    if (items.empty()) return Value::make_undefined();
    return f == "first" ? items.front() : items.back();
  }
  if (f == "items") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, f, pos).status());
    if (v.is(Kind::kUndefined)) return Value::make_list();
    if (!v.is(Kind::kDict)) return template_error(pos, "items filter needs a mapping");
    return call_method(v, "items", {}, pos);
  }
  if (f == "list") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, f, pos).status());
    FP8RL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v, pos));
    return Value::make_list(std::move(items));
  }
  if (f == "join") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"d", "attribute"}, f, pos));
    if (given(p[1])) return template_error(pos, "unsupported: join(attribute=...)");
    std::string sep;
    if (given(p[0])) {
      FP8RL_ASSIGN_OR_RETURN(sep, to_str(p[0], pos));
    }
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> items, iterate(v, pos));
    std::string r;
    bool first = true;
    for (const Value& item : items) {
      if (!first) r += sep;
      first = false;
      FP8RL_ASSIGN_OR_RETURN(const std::string text, to_str(item, pos));
      r += text;
    }
    return Value::make_str(r);
  }
  if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
    return filter_select(f, v, a, pos);
  }
  if (f == "map") {
    if (!a.positional.empty()) {
      return template_error(pos, "unsupported: map(filter_name) (only map(attribute=...))");
    }
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"attribute", "default"}, f, pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string attr, expect_str(p[0], "map attribute", pos));
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> items, iterate(v, pos));
    List out;
    for (const Value& item : items) {
      FP8RL_ASSIGN_OR_RETURN(Value r, get_attr(item, attr, pos));
      if (r.is(Kind::kUndefined) && given(p[1])) r = p[1];
      out.push_back(r);
    }
    return Value::make_list(std::move(out));
  }
  if (f == "default" || f == "d") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p,
                           bind(a, {"default_value", "boolean"}, f, pos));
    const bool use = given(p[1]) && truthy(p[1]) ? !truthy(v) : v.is(Kind::kUndefined);
    if (use) return given(p[0]) ? p[0] : Value::make_str("");
    return v;
  }
  if (f == "replace") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"old", "new", "count"}, f, pos));
    const bool has_count = given(p[2]) && !p[2].is(Kind::kNone);
    if (has_count && !p[2].is_integral()) {
      return template_error(pos, "replace count must be an integer");
    }
    // Printed right to left: the order the one-file interpreter's compiler chose.
    FP8RL_ASSIGN_OR_RETURN(const std::string to, to_str(p[1], pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string from, to_str(p[0], pos));
    FP8RL_ASSIGN_OR_RETURN(const std::string text, to_str(v, pos));
    FP8RL_ASSIGN_OR_RETURN(std::string r,
                           py_replace(text, from, to, has_count ? p[2].as_int() : -1));
    return Value::make_str(std::move(r));
  }
  if (f == "lower" || f == "upper") {
    FP8RL_ASSIGN_OR_RETURN(const std::string text, to_str(v, pos));
    return call_method(Value::make_str(text), f, a, pos);
  }
  if (f == "abs") {
    FP8RL_RETURN_IF_ERROR(bind(a, {}, f, pos).status());
    if (!v.is_number()) return template_error(pos, "abs needs a number");
    if (v.is(Kind::kFloat)) return Value::make_float(std::fabs(v.f));
    if (v.as_int() == std::numeric_limits<int64_t>::min()) {
      return template_error(pos, "integer overflow");
    }
    return Value::make_int(std::llabs(v.as_int()));
  }
  if (f == "int") {
    FP8RL_ASSIGN_OR_RETURN(const std::vector<Value> p, bind(a, {"default", "base"}, f, pos));
    if (given(p[1])) return template_error(pos, "unsupported: int(base=...)");
    if (v.is_integral()) return Value::make_int(v.as_int());
    if (v.is(Kind::kFloat)) {
      // Python truncates toward zero; NaN, infinities and values beyond int64 are errors.
      if (!(std::fabs(v.f) < 9223372036854775808.0)) {
        return template_error(pos, "int filter: float out of the int64 range");
      }
      return Value::make_int(static_cast<int64_t>(v.f));
    }
    return template_error(pos, "unsupported: int filter on a non-number");
  }
  return template_error(pos, absl::StrCat("unsupported filter '", f, "'"));
}

}  // namespace fp8rl::rl::chat_template_internal
