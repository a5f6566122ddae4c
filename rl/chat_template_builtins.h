// What the chat-template evaluator (rl/chat_template.h) applies to values: operators, attribute
// and item lookup, slices, the global functions (raise_exception, strftime_now, namespace, dict,
// range), str/dict methods, filters and tests -- each with Python's or jinja2's result, and an
// InvalidArgument naming the template position for anything outside the supported subset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rl/chat_template_lexer.h"
#include "rl/chat_template_value.h"

namespace fp8rl::rl::chat_template_internal {

// Largest string or list a template may build by repetition ('-' * n, [x] * n): far above any
// prompt, far below what would exhaust memory.
inline constexpr size_t kMaxRepeatedSize = size_t{16} << 20;

// A call's evaluated arguments: positional, then keyword in source order.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// "'name' is undefined" (or "value is undefined") at `pos`: using an undefined value.
absl::Status undefined_error(const Value& v, Pos pos);

// obj.name (jinja2: attribute first, then item; str/dict/list methods are bound callables).
absl::StatusOr<Value> get_attr(const Value& obj, const std::string& name, Pos pos);
// obj[key] (jinja2: item first, then attribute for string keys); out of range is undefined.
absl::StatusOr<Value> get_item(const Value& obj, const Value& key, Pos pos);
// obj[start:stop:step] of a list or string; none/undefined bounds are absent.
absl::StatusOr<Value> get_slice(const Value& obj, const Value& start, const Value& stop,
                                const Value& step, Pos pos);

// -v (negate) or +v.
absl::StatusOr<Value> unary_op(bool negate, const Value& v, Pos pos);
// a op b for op in + - * / // % ** ~; int64 overflow is an error.
absl::StatusOr<Value> binary_op(const std::string& op, const Value& a, const Value& b, Pos pos);
// a op b for op in == != < <= > >= in, not in.
absl::StatusOr<bool> compare(const std::string& op, const Value& a, const Value& b, Pos pos);

// Calls a kFunc value: a bound method or a global function. `now_unix_seconds` is
// strftime_now's clock (unset: the current time).
absl::StatusOr<Value> call_function(const Value& callee, const Args& args,
                                    std::optional<int64_t> now_unix_seconds, Pos pos);

// `v is name(args)`.
absl::StatusOr<bool> apply_test(const std::string& name, const Value& v,
                                const std::vector<Value>& args, Pos pos);
// `v | name(args)`.
absl::StatusOr<Value> apply_filter(const std::string& name, const Value& v, const Args& args,
                                   Pos pos);

}  // namespace fp8rl::rl::chat_template_internal
