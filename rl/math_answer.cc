// Math answer extraction and canonical numeric form (math_answer.h).
#include "rl/math_answer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace fp8rl::rl {

namespace {

using u128 = unsigned __int128;

constexpr std::string_view kUnicodeMinus = "\xE2\x88\x92";  // U+2212
constexpr size_t kMaxExactDigits = 36;                      // 10^36 < 2^120

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

size_t digits_end(std::string_view s, size_t i) {
  while (i < s.size() && is_digit(s[i])) ++i;
  return i;
}

// The parts of a number as matched in the text: sign, integer digits (commas removed), fraction
// digits after '.', denominator digits after '/'.
struct NumberParts {
  bool negative = false;
  std::string int_digits;
  std::string frac_digits;
  std::string denom_digits;
};

// Matches a number starting at s[i] (a sign, a digit or a '.' before a digit). Returns the end
// of the match, or i when there is no number there. Grammar in math_answer.h (last_number).
size_t match_number(std::string_view s, size_t i, bool allow_plus, NumberParts* parts) {
  const size_t begin = i;
  NumberParts p;
  if (i < s.size() && (s[i] == '-' || (allow_plus && s[i] == '+'))) {
    p.negative = s[i] == '-';
    ++i;
  } else if (s.substr(i, kUnicodeMinus.size()) == kUnicodeMinus) {
    p.negative = true;
    i += kUnicodeMinus.size();
  }
  const size_t int_begin = i;
  size_t end = digits_end(s, i);
  p.int_digits.assign(s.substr(int_begin, end - int_begin));
  // Thousands commas: the first group has 1-3 digits, every later group exactly 3.
  if (end > int_begin && end - int_begin <= 3) {
    while (end + 4 <= s.size() && s[end] == ',' && digits_end(s, end + 1) == end + 4) {
      p.int_digits.append(s.substr(end + 1, 3));
      end += 4;
    }
  }
  i = end;
  if (i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
    const size_t frac_end = digits_end(s, i + 1);
    p.frac_digits.assign(s.substr(i + 1, frac_end - i - 1));
    i = frac_end;
  } else if (!p.int_digits.empty() && i + 1 < s.size() && s[i] == '/' && is_digit(s[i + 1])) {
    const size_t denom_end = digits_end(s, i + 1);
    p.denom_digits.assign(s.substr(i + 1, denom_end - i - 1));
    i = denom_end;
  }
  if (p.int_digits.empty() && p.frac_digits.empty()) return begin;
  if (parts != nullptr) *parts = std::move(p);
  return i;
}

std::string strip_leading_zeros(std::string_view digits) {
  const size_t nz = digits.find_first_not_of('0');
  return nz == std::string_view::npos ? "0" : std::string(digits.substr(nz));
}

std::string strip_trailing_zeros(std::string_view digits) {
  const size_t nz = digits.find_last_not_of('0');
  return nz == std::string_view::npos ? "" : std::string(digits.substr(0, nz + 1));
}

u128 parse_u128(std::string_view digits) {
  u128 v = 0;
  for (char c : digits) v = v * 10 + static_cast<u128>(c - '0');
  return v;
}

std::string u128_to_string(u128 v) {
  if (v == 0) return "0";
  std::string out;
  while (v > 0) {
    out.push_back(static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

u128 gcd(u128 a, u128 b) {
  while (b != 0) {
    const u128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// The canonical text of a matched number, or nullopt for a zero denominator.
std::optional<std::string> canonical_number(const NumberParts& n) {
  const std::string int_part = strip_leading_zeros(n.int_digits);
  if (!n.denom_digits.empty() && strip_leading_zeros(n.denom_digits) == "0") return std::nullopt;
  if (n.int_digits.size() + n.frac_digits.size() > kMaxExactDigits ||
      n.denom_digits.size() > kMaxExactDigits) {
    // Too long for the exact rational: keep the digits, canonical up to zeros.
    const std::string frac = strip_trailing_zeros(n.frac_digits);
    std::string body = frac.empty() ? int_part : absl::StrCat(int_part, ".", frac);
    if (!n.denom_digits.empty()) absl::StrAppend(&body, "/", strip_leading_zeros(n.denom_digits));
    return (n.negative && body != "0") ? absl::StrCat("-", body) : body;
  }
  // value = p / q exactly.
  u128 p = parse_u128(absl::StrCat(n.int_digits, n.frac_digits));
  u128 q = 1;
  for (size_t i = 0; i < n.frac_digits.size(); ++i) q *= 10;
  if (!n.denom_digits.empty()) q = parse_u128(n.denom_digits);
  if (p == 0) return "0";
  const u128 g = gcd(p, q);
  p /= g;
  q /= g;
  const std::string sign = n.negative ? "-" : "";
  if (q == 1) return absl::StrCat(sign, u128_to_string(p));
  // A terminating decimal when q = 2^a 5^b: print p * 10^k / q with k = max(a, b) decimals.
  u128 rest = q;
  int twos = 0, fives = 0;
  while (rest % 2 == 0) rest /= 2, ++twos;
  while (rest % 5 == 0) rest /= 5, ++fives;
  const int k = std::max(twos, fives);
  if (rest == 1 && k <= 38) {
    u128 ten_k = 1;
    for (int i = 0; i < k; ++i) ten_k *= 10;
    const u128 m = ten_k / q;
    if (p <= ~static_cast<u128>(0) / m) {
      // digits has at least k + 1 characters: "0.0009765625" for 1/1024.
      const std::string digits = u128_to_string(p * m);
      const size_t width = static_cast<size_t>(k) + 1;
      const std::string padded =
          digits.size() < width ? std::string(width - digits.size(), '0') + digits : digits;
      const size_t point = padded.size() - static_cast<size_t>(k);
      return absl::StrCat(sign, padded.substr(0, point), ".", padded.substr(point));
    }
  }
  return absl::StrCat(sign, u128_to_string(p), "/", u128_to_string(q));
}

// The closing brace matching the '{' at s[open], or npos.
size_t matching_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') {
      ++depth;
    } else if (s[i] == '}') {
      if (--depth == 0) return i;
    }
  }
  return std::string_view::npos;
}

// True when every character is a digit, '.' or a leading '-' (a \frac argument we rewrite).
bool is_plain_number(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s.front() == '-') s.remove_prefix(1);
  return !s.empty() && s.find_first_not_of("0123456789.") == std::string_view::npos;
}

// \frac{a}{b}, \dfrac{a}{b}, \tfrac{a}{b} with plain-number a, b -> "a/b".
std::string rewrite_fracs(std::string s) {
  for (std::string_view name : {"\\dfrac{", "\\tfrac{", "\\frac{"}) {
    size_t pos = 0;
    while ((pos = s.find(name, pos)) != std::string::npos) {
      const size_t open1 = pos + name.size() - 1;
      const size_t close1 = matching_brace(s, open1);
      if (close1 == std::string::npos || close1 + 1 >= s.size() || s[close1 + 1] != '{') {
        pos += name.size();
        continue;
      }
      const size_t close2 = matching_brace(s, close1 + 1);
      if (close2 == std::string::npos) {
        pos += name.size();
        continue;
      }
      const std::string_view sv(s);
      const std::string_view a = sv.substr(open1 + 1, close1 - open1 - 1);
      const std::string_view b = sv.substr(close1 + 2, close2 - close1 - 2);
      if (!is_plain_number(a) || !is_plain_number(b)) {
        pos += name.size();
        continue;
      }
      const std::string replacement = absl::StrCat(std::string(trim(a)), "/", std::string(trim(b)));
      s.replace(pos, close2 + 1 - pos, replacement);
      pos += replacement.size();
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<MathExtractor> parse_math_extractor(std::string_view name) {
  if (name == "boxed") return MathExtractor::kBoxed;
  if (name == "hash") return MathExtractor::kHash;
  if (name == "last_number") return MathExtractor::kLastNumber;
  return absl::InvalidArgumentError(
      absl::StrCat("must be one of boxed, hash, last_number, got \"", std::string(name), "\""));
}

std::string_view math_extractor_name(MathExtractor extractor) {
  switch (extractor) {
    case MathExtractor::kBoxed:
      return "boxed";
    case MathExtractor::kHash:
      return "hash";
    case MathExtractor::kLastNumber:
      return "last_number";
  }
  return "?";
}

std::vector<MathExtractor> default_math_extractors() {
  return {MathExtractor::kBoxed, MathExtractor::kHash, MathExtractor::kLastNumber};
}

std::optional<std::string> extract_last_boxed(std::string_view text) {
  constexpr std::string_view kBoxed = "\\boxed";
  size_t pos = text.rfind(kBoxed);
  while (pos != std::string_view::npos) {
    size_t open = pos + kBoxed.size();
    while (open < text.size() && text[open] == ' ') ++open;
    if (open < text.size() && text[open] == '{') {
      const size_t close = matching_brace(text, open);
      if (close != std::string_view::npos) {
        return std::string(trim(text.substr(open + 1, close - open - 1)));
      }
    }
    if (pos == 0) break;
    pos = text.rfind(kBoxed, pos - 1);
  }
  return std::nullopt;
}

std::optional<std::string> extract_after_hash(std::string_view text) {
  const size_t pos = text.rfind("####");
  if (pos == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(pos + 4);
  rest = rest.substr(0, rest.find('\n'));
  rest = trim(rest);
  if (rest.empty()) return std::nullopt;
  return std::string(rest);
}

std::optional<std::string> extract_last_number(std::string_view text) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < text.size()) {
    const bool starts =
        is_digit(text[i]) || (text[i] == '.' && i + 1 < text.size() && is_digit(text[i + 1]) &&
                              (i == 0 || !is_digit(text[i - 1])));
    if (!starts) {
      ++i;
      continue;
    }
    // A sign belongs to the number unless it follows an operand (then it is a binary minus).
    auto operand_before = [&](size_t at) {
      if (at == 0) return false;
      const char c = text[at - 1];
      return is_digit(c) || is_alpha(c) || c == ')' || c == ']' || c == '}';
    };
    size_t start = i;
    if (i >= 1 && text[i - 1] == '-' && !operand_before(i - 1)) {
      start = i - 1;
    } else if (i >= kUnicodeMinus.size() &&
               text.substr(i - kUnicodeMinus.size(), kUnicodeMinus.size()) == kUnicodeMinus &&
               !operand_before(i - kUnicodeMinus.size())) {
      start = i - kUnicodeMinus.size();
    }
    const size_t end = match_number(text, start, /*allow_plus=*/false, nullptr);
    last = std::string(text.substr(start, end - start));
    i = end;
  }
  return last;
}

std::optional<std::string> extract_math_answer(std::string_view completion,
                                               std::span<const MathExtractor> order) {
  for (MathExtractor e : order) {
    std::optional<std::string> found;
    switch (e) {
      case MathExtractor::kBoxed:
        found = extract_last_boxed(completion);
        break;
      case MathExtractor::kHash:
        found = extract_after_hash(completion);
        break;
      case MathExtractor::kLastNumber:
        found = extract_last_number(completion);
        break;
    }
    if (found.has_value() && !found->empty()) return found;
  }
  return std::nullopt;
}

std::string normalize_math_answer(std::string_view answer) {
  std::string s = absl::StrReplaceAll(std::string(trim(answer)), {{"$", ""},
                                                                  {"\\left", ""},
                                                                  {"\\right", ""},
                                                                  {"\\!", ""},
                                                                  {"\\,", ""},
                                                                  {"\\;", ""},
                                                                  {"\\:", ""},
                                                                  {"\\ ", ""},
                                                                  {"{,}", ","},
                                                                  {"\xE2\x88\x92", "-"}});
  s = std::string(trim(s));
  // Unwrap \text{...} (and friends) around the whole answer and drop one trailing '.' and '%',
  // repeated until nothing changes, so the result is a fixed point.
  for (bool changed = true; changed;) {
    const std::string before = s;
    for (std::string_view w : {"\\text{", "\\textbf{", "\\mathrm{", "\\mathbf{"}) {
      if (s.starts_with(w) && matching_brace(s, w.size() - 1) == s.size() - 1) {
        s = std::string(trim(std::string_view(s).substr(w.size(), s.size() - w.size() - 1)));
      }
    }
    if (!s.empty() && s.back() == '.') s.pop_back();
    if (s.ends_with("\\%")) {
      s.resize(s.size() - 2);
    } else if (!s.empty() && s.back() == '%') {
      s.pop_back();
    }
    s = std::string(trim(s));
    changed = s != before;
  }
  s = rewrite_fracs(std::move(s));
  // "x = 5" -> "5".
  if (s.size() >= 2 && is_alpha(s[0])) {
    size_t i = 1;
    while (i < s.size() && is_space(s[i])) ++i;
    if (i < s.size() && s[i] == '=') s = std::string(trim(std::string_view(s).substr(i + 1)));
  }
  NumberParts parts;
  if (!s.empty() && match_number(s, 0, /*allow_plus=*/true, &parts) == s.size()) {
    if (std::optional<std::string> canonical = canonical_number(parts)) return *canonical;
  }
  std::string out;
  for (char c : s) {
    if (!is_space(c)) out.push_back(c);
  }
  return out;
}

}  // namespace fp8rl::rl
