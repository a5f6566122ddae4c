// Final answers of math problems: where a completion states its answer (the last \boxed{...}, a
// GSM8K-style "#### n" line, or the last number in the text) and the canonical form two answers
// are compared in, so "1,234.50", "+1234.5" and "$1234.50" all score as the same answer.
//
// Extractors (tried in the configured order; the first that finds something wins):
//   boxed        the content of the last complete \boxed{...} (braces nested to any depth;
//                "\boxed {x}" with spaces is accepted; an unclosed \boxed{ is skipped).
//   hash         the rest of the line after the last "####", trimmed; empty: nothing found.
//   last_number  the last number in the text: an optional sign ('-' or U+2212 only when not
//                preceded by a letter, digit or closing bracket, so "3-4" gives "4"), digits
//                with optional well-formed thousands commas ("1,234,567"; in "3,45" only "45"
//                is the number), an optional ".digits" part, and an optional "/digits" part
//                (so "12/25" is the fraction 12/25). A sentence-ending '.' is not part of it.
//
// Normalization (normalize_math_answer), applied to the extracted answer and to the reference:
//   1. cleanup: trim; drop '$', LaTeX spacing (\, \! \; \: and "\ "), \left and \right; "{,}"
//      becomes ','; U+2212 becomes '-'; \text{...}, \textbf{...} and \mathrm{...} around the
//      whole answer are unwrapped; \frac{a}{b}, \dfrac and \tfrac become "a/b" when a and b are
//      plain numbers; one trailing '.' and one trailing '%' are dropped (GSM8K writes percentages
//      as bare numbers); a "x =" prefix of one variable is dropped.
//   2. numbers: what remains, if it is a number as in last_number (commas well-formed, a leading
//      '+' allowed), is read as an EXACT rational and printed canonically: lowest terms, no '+',
//      no leading zeros, "-0" is "0", an integer without ".0", a value whose denominator has only
//      the factors 2 and 5 as a terminating decimal ("3/4" -> "0.75", "2.50" -> "2.5"), any other
//      fraction as "p/q" ("2/6" -> "1/3"). So 3/4 and 0.75 are the same answer, while 1/3 and
//      0.333 are not (a rounded decimal is a different number). Numbers with more than 36
//      digits keep their decimal digits without the rational step.
//   3. anything else (an expression, a word, "1/0") is compared with all whitespace removed.
// Errors never happen: a completion with no answer is std::nullopt, and every string has a
// canonical form.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::rl {

enum class MathExtractor { kBoxed, kHash, kLastNumber };

// "boxed" | "hash" | "last_number"; an error listing the names otherwise.
absl::StatusOr<MathExtractor> parse_math_extractor(std::string_view name);
std::string_view math_extractor_name(MathExtractor extractor);
// The default order: boxed, hash, last_number.
std::vector<MathExtractor> default_math_extractors();

// Each extractor on its own (see the header comment); nullopt when it finds nothing.
std::optional<std::string> extract_last_boxed(std::string_view text);
std::optional<std::string> extract_after_hash(std::string_view text);
std::optional<std::string> extract_last_number(std::string_view text);

// The first extractor in `order` that finds an answer, its raw (unnormalized) text.
std::optional<std::string> extract_math_answer(std::string_view completion,
                                               std::span<const MathExtractor> order);

// The canonical form of an answer (never fails; see the header comment).
std::string normalize_math_answer(std::string_view answer);

}  // namespace fp8rl::rl
