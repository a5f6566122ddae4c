// Python's str semantics over UTF-8 bytes, for the chat-template interpreter
// (rl/chat_template.h): code points, str.isspace() whitespace, repr() of str and float, and
// str.replace. Jinja templates index, measure and print strings as Python does, so the lexer and
// the evaluator both count code points, never bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fp8rl::rl::chat_template_internal {

// Code points of `s`; InvalidArgument "chat_template: invalid UTF-8 in a string value" on a
// malformed sequence.
absl::StatusOr<std::u32string> decode_utf8(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
std::string encode_utf8(std::u32string_view s);

// str.isspace() for one code point.
bool is_py_space(char32_t c);

// Length in bytes of the Python-whitespace code point starting at s[i], or 0.
absl::StatusOr<size_t> space_at(std::string_view s, size_t i);

// s.rstrip() with Python's whitespace.
absl::StatusOr<std::string_view> rstrip_space(std::string_view s);

// Whether every byte is ASCII.
bool is_ascii(std::string_view s);

// repr(x) of a float: the shortest digits that round-trip; positional for 1e-4 <= |x| < 1e16.
std::string py_float_repr(double x);

// repr(s) of a str: quotes chosen as Python does, non-printable code points escaped.
absl::StatusOr<std::string> py_str_repr(std::string_view s);

// s.replace(from, to, count); count < 0: every occurrence.
absl::StatusOr<std::string> py_replace(const std::string& s, const std::string& from,
                                       const std::string& to, int64_t count);

}  // namespace fp8rl::rl::chat_template_internal
