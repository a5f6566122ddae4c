// Python str semantics over UTF-8 for the chat-template interpreter (rl/chat_template_pystr.h).
#include "rl/chat_template_pystr.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace fp8rl::rl::chat_template_internal {

absl::StatusOr<std::u32string> decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) {
      return absl::InvalidArgumentError("chat_template: invalid UTF-8 in a string value");
    }
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) {
        return absl::InvalidArgumentError("chat_template: invalid UTF-8 in a string value");
      }
      cp = (cp << 6) | (cc & 0x3f);
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  for (char32_t cp : s) append_utf8(out, cp);
  return out;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

absl::StatusOr<size_t> space_at(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return is_py_space(c) ? 1 : 0;
  const size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) return 0;
  FP8RL_ASSIGN_OR_RETURN(const std::u32string cp, decode_utf8(s.substr(i, n)));
  return cp.size() == 1 && is_py_space(cp[0]) ? n : 0;
}

absl::StatusOr<std::string_view> rstrip_space(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    FP8RL_ASSIGN_OR_RETURN(const size_t space, space_at(s, start));
    if (space != end - start) break;
    end = start;
  }
  return s.substr(0, end);
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf is [-]d.ddde[+-]XX
  std::string s(buf);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s = s.substr(1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, 1) + (e > 2 ? s.substr(2, e - 2) : "");
  const int exp = std::atoi(s.c_str() + e + 1);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int nd = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp < 0) return sign + "0." + std::string(-exp - 1, '0') + digits;
    if (exp + 1 >= nd) return sign + digits + std::string(exp + 1 - nd, '0') + ".0";
    return sign + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
  }
  std::string mant = digits.substr(0, 1);
  if (nd > 1) mant += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + mant + ebuf;
}

namespace {

// Code points Python's str.isprintable() rejects, for the categories that occur in practice
// (controls, format characters, separators other than ' ', private use, surrogates).
bool is_py_non_printable(char32_t c) {
  return c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
         (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff ||
         (c >= 0xd800 && c <= 0xf8ff) || (c >= 0xfff9 && c <= 0xfffb) || c >= 0xf0000 ||
         c == 0x180e || c == 0x61c || (c >= 0x600 && c <= 0x605) || c == 0x6dd || c == 0x70f ||
         c == 0x110bd || (c >= 0x1d173 && c <= 0x1d17a) || c == 0xe0001 ||
         (c >= 0xe0020 && c <= 0xe007f);
}

}  // namespace

absl::StatusOr<std::string> py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  FP8RL_ASSIGN_OR_RETURN(const std::u32string code_points, decode_utf8(s));
  for (char32_t c : code_points) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_py_non_printable(c)) {
      char buf[16];
      if (c < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

absl::StatusOr<std::string> py_replace(const std::string& s, const std::string& from,
                                       const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every code point (and at both ends).
    int64_t done = 0;
    FP8RL_ASSIGN_OR_RETURN(const std::u32string u, decode_utf8(s));
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < u.size()) append_utf8(out, u[k]);
    }
    return out;
  }
  size_t k = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t f = s.find(from, k);
    if (f == std::string::npos) break;
    out += s.substr(k, f - k);
    out += to;
    k = f + from.size();
    ++done;
  }
  return out + s.substr(k);
}

}  // namespace fp8rl::rl::chat_template_internal
