// The chat-template evaluator's values (rl/chat_template.h): Python-like None, bool, int, float,
// str, list, dict, jinja2's undefined, namespace() objects and callables, with the conversions
// whose output a template can see -- str(), repr(), json.dumps (HF's tojson), truthiness, ==.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "rl/chat_template_lexer.h"

namespace fp8rl::rl::chat_template_internal {

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
  std::shared_ptr<List> list;   // kList
  std::shared_ptr<Dict> dict;   // kDict, kNamespace (shared and mutable for ns.attr = ...)
  std::shared_ptr<Value> self;  // kFunc bound method: the receiver

  static Value make_undefined(std::string name = "");
  static Value make_none() { return make(Kind::kNone); }
  static Value make_bool(bool x);
  static Value make_int(int64_t x);
  static Value make_float(double x);
  static Value make_str(std::string x);
  static Value make_list(List items = {});
  static Value make_dict();
  static Value make_func(std::string name, std::shared_ptr<Value> self = nullptr);
  static Value make(Kind k) {
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

// An insertion-ordered str -> value mapping (Python dicts keep insertion order).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

// Python's type name, for error messages ('str', 'NoneType', ...).
std::string type_name(const Value& v);

// A JSON input (messages, tools, kwargs) as a value; objects keep their key order.
// InvalidArgument on an unsigned integer above 2^63-1 or a binary value.
absl::StatusOr<Value> from_json(const nlohmann::ordered_json& j);

bool truthy(const Value& v);

// str(v): what {{ v }}, `~` and the `string` filter produce. Errors name `pos`.
absl::StatusOr<std::string> to_str(const Value& v, Pos pos);

// repr(v), as str() prints list and dict items.
absl::StatusOr<std::string> repr(const Value& v, Pos pos);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as HF's tojson filter calls it.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
absl::Status append_json(std::string& out, const Value& v, const JsonOptions& options, int depth,
                         Pos pos);

// Python's == (1 == 1.0 == True; lists and dicts element-wise).
bool equal(const Value& a, const Value& b);

// The items a for loop visits: list items, dict keys, string code points; none for undefined.
absl::StatusOr<std::vector<Value>> iterate(const Value& v, Pos pos);

}  // namespace fp8rl::rl::chat_template_internal
