// The chat-template evaluator's values and their Python-visible conversions
// (rl/chat_template_value.h).
#include "rl/chat_template_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rl/chat_template_pystr.h"

namespace fp8rl::rl::chat_template_internal {

Value Value::make_undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}

Value Value::make_bool(bool x) {
  Value v = make(Kind::kBool);
  v.b = x;
  return v;
}

Value Value::make_int(int64_t x) {
  Value v = make(Kind::kInt);
  v.i = x;
  return v;
}

Value Value::make_float(double x) {
  Value v = make(Kind::kFloat);
  v.f = x;
  return v;
}

Value Value::make_str(std::string x) {
  Value v = make(Kind::kString);
  v.s = std::move(x);
  return v;
}

Value Value::make_list(List items) {
  Value v = make(Kind::kList);
  v.list = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::make_dict() {
  Value v = make(Kind::kDict);
  v.dict = std::make_shared<Dict>();
  return v;
}

Value Value::make_func(std::string name, std::shared_ptr<Value> self) {
  Value v = make(Kind::kFunc);
  v.s = std::move(name);
  v.self = std::move(self);
  return v;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

std::string type_name(const Value& v) {
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

absl::StatusOr<Value> from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::make_none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::make_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::make_int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return absl::InvalidArgumentError(
            "chat_template: integer input above 2^63-1 is unsupported");
      }
      return Value::make_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::make_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::make_str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) {
        FP8RL_ASSIGN_OR_RETURN(Value item, from_json(e));
        items.push_back(std::move(item));
      }
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        FP8RL_ASSIGN_OR_RETURN(Value item, from_json(it.value()));
        d.dict->set(it.key(), std::move(item));
      }
      return d;
    }
    default:
      return absl::InvalidArgumentError(
          "chat_template: unsupported JSON input value (binary or discarded)");
  }
}

bool truthy(const Value& v) {
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

absl::StatusOr<std::string> to_str(const Value& v, Pos pos) {
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
      return py_float_repr(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kList:
    case Kind::kDict:
      return repr(v, pos);
    case Kind::kNamespace:
      return template_error(pos, "printing a namespace object is unsupported");
    case Kind::kFunc:
      return template_error(pos, absl::StrCat("printing function '", v.s, "' is unsupported"));
  }
  return "";
}

absl::StatusOr<std::string> repr(const Value& v, Pos pos) {
  if (v.is(Kind::kString)) return py_str_repr(v.s);
  if (v.is(Kind::kUndefined)) {
    return template_error(pos, "printing an undefined value inside a list or dict");
  }
  if (v.is(Kind::kList)) {
    std::string out = "[";
    for (size_t k = 0; k < v.list->size(); ++k) {
      if (k) out += ", ";
      FP8RL_ASSIGN_OR_RETURN(const std::string item, repr((*v.list)[k], pos));
      out += item;
    }
    return out + "]";
  }
  if (v.is(Kind::kDict)) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, e] : v.dict->items) {
      if (!first) out += ", ";
      first = false;
      // The value before the key: the order the one-file interpreter's compiler chose, kept so
      // that when both fail the same error is reported.
      FP8RL_ASSIGN_OR_RETURN(const std::string item, repr(e, pos));
      FP8RL_ASSIGN_OR_RETURN(const std::string key, py_str_repr(k));
      out += key + ": " + item;
    }
    return out + "}";
  }
  return to_str(v, pos);
}

namespace {

absl::Status append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  FP8RL_ASSIGN_OR_RETURN(const std::u32string code_points, decode_utf8(s));
  for (char32_t c : code_points) {
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
          append_utf8(out, c);
        }
    }
  }
  out.push_back('"');
  return absl::OkStatus();
}

}  // namespace

absl::Status append_json(std::string& out, const Value& v, const JsonOptions& o, int depth,
                         Pos pos) {
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(o.indent) * d, ' ');
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return absl::OkStatus();
    case Kind::kBool:
      out += v.b ? "true" : "false";
      return absl::OkStatus();
    case Kind::kInt:
      out += std::to_string(v.i);
      return absl::OkStatus();
    case Kind::kFloat:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += py_float_repr(v.f);
      }
      return absl::OkStatus();
    case Kind::kString:
      return append_json_string(out, v.s, o.ensure_ascii);
    case Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return absl::OkStatus();
      }
      out.push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += o.item_sep;
        newline(depth + 1);
        FP8RL_RETURN_IF_ERROR(append_json(out, (*v.list)[k], o, depth + 1, pos));
      }
      newline(depth);
      out.push_back(']');
      return absl::OkStatus();
    }
    case Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return absl::OkStatus();
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
        FP8RL_RETURN_IF_ERROR(append_json_string(out, items[k]->first, o.ensure_ascii));
        out += o.key_sep;
        FP8RL_RETURN_IF_ERROR(append_json(out, items[k]->second, o, depth + 1, pos));
      }
      newline(depth);
      out.push_back('}');
      return absl::OkStatus();
    }
    default:
      return template_error(pos, absl::StrCat("tojson: object of type '", type_name(v),
                                              "' is not JSON serializable"));
  }
}

bool equal(const Value& a, const Value& b) {
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
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Kind::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    default:
      return a.dict == b.dict && a.s == b.s;
  }
}

absl::StatusOr<std::vector<Value>> iterate(const Value& v, Pos pos) {
  switch (v.kind) {
    case Kind::kUndefined:
      return std::vector<Value>{};
    case Kind::kList:
      return *v.list;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::make_str(kv.first));
      return keys;
    }
    case Kind::kString: {
      FP8RL_ASSIGN_OR_RETURN(const std::u32string code_points, decode_utf8(v.s));
      std::vector<Value> chars;
      for (char32_t c : code_points) {
        std::string one;
        append_utf8(one, c);
        chars.push_back(Value::make_str(one));
      }
      return chars;
    }
    default:
      return template_error(pos, absl::StrCat("'", type_name(v), "' object is not iterable"));
  }
}

}  // namespace fp8rl::rl::chat_template_internal
