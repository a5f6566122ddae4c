// Tests of rl/math_answer.h: each extractor on hard completions (nested braces, signs, thousands
// commas, sentence punctuation), the configurable order, and the canonical numeric form (commas,
// '+', trailing zeros, exact fractions: 3/4 == 0.75 but 1/3 != 0.333).
#include "rl/math_answer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

using Opt = std::optional<std::string>;

TEST(MathAnswer, LastBoxedHandlesNestingSpacesAndUnclosed) {
  EXPECT_EQ(extract_last_boxed("so \\boxed{42}."), Opt("42"));
  EXPECT_EQ(extract_last_boxed("\\boxed{1} then \\boxed{2}"), Opt("2"));
  EXPECT_EQ(extract_last_boxed("\\boxed{\\frac{1}{2}}"), Opt("\\frac{1}{2}"));
  EXPECT_EQ(extract_last_boxed("\\boxed{\\sqrt{\\frac{a}{b^{2}}}} done"),
            Opt("\\sqrt{\\frac{a}{b^{2}}}"));
  EXPECT_EQ(extract_last_boxed("\\boxed { 7 }"), Opt("7"));
  // The last \boxed is unclosed: the previous complete one counts.
  EXPECT_EQ(extract_last_boxed("\\boxed{3} and \\boxed{4"), Opt("3"));
  EXPECT_EQ(extract_last_boxed("\\boxed{4"), std::nullopt);
  EXPECT_EQ(extract_last_boxed("no box here, 12"), std::nullopt);
  EXPECT_EQ(extract_last_boxed("\\boxed 5"), std::nullopt);
}

TEST(MathAnswer, AfterHashTakesTheRestOfTheLastHashLine) {
  EXPECT_EQ(extract_after_hash("work...\n#### 72"), Opt("72"));
  EXPECT_EQ(extract_after_hash("#### 1\n#### -3,000 \nmore text"), Opt("-3,000"));
  EXPECT_EQ(extract_after_hash("####   \n"), std::nullopt);
  EXPECT_EQ(extract_after_hash("#### "), std::nullopt);
  EXPECT_EQ(extract_after_hash("### 5"), std::nullopt);
  EXPECT_EQ(extract_after_hash("#####5"), Opt("5"));  // the last "####" starts at index 1
}

TEST(MathAnswer, LastNumberSignsCommasDecimalsFractions) {
  EXPECT_EQ(extract_last_number("The answer is 42."), Opt("42"));
  EXPECT_EQ(extract_last_number("It is -5"), Opt("-5"));
  EXPECT_EQ(extract_last_number("x=-5"), Opt("-5"));
  EXPECT_EQ(extract_last_number("3-4"), Opt("4"));    // binary minus
  EXPECT_EQ(extract_last_number("(2)-4"), Opt("4"));  // after a closing bracket too
  EXPECT_EQ(extract_last_number("total 1,234.50 dollars"), Opt("1,234.50"));
  EXPECT_EQ(extract_last_number("1,234,567"), Opt("1,234,567"));
  EXPECT_EQ(extract_last_number("values 3,45"), Opt("45"));  // not a thousands group
  EXPECT_EQ(extract_last_number("1, 2, 3"), Opt("3"));
  EXPECT_EQ(extract_last_number("12345,678"), Opt("678"));  // first group too long
  EXPECT_EQ(extract_last_number("ratio 3/4."), Opt("3/4"));
  EXPECT_EQ(extract_last_number("costs .5 each"), Opt(".5"));
  EXPECT_EQ(extract_last_number("temp \xE2\x88\x92"
                                "7 C"),
            Opt("\xE2\x88\x92"
                "7"));
  EXPECT_EQ(extract_last_number("v2 of H2O is 10 and 3.14159"), Opt("3.14159"));
  EXPECT_EQ(extract_last_number("no digits"), std::nullopt);
  EXPECT_EQ(extract_last_number(""), std::nullopt);
  EXPECT_EQ(extract_last_number("end 7,"), Opt("7"));
}

TEST(MathAnswer, OrderIsConfigurableAndFirstHitWins) {
  const std::string text = "#### 5\nbut really \\boxed{6} or 7";
  const std::vector<MathExtractor> boxed_first = default_math_extractors();
  EXPECT_EQ(extract_math_answer(text, boxed_first), Opt("6"));
  const std::vector<MathExtractor> hash_first = {MathExtractor::kHash, MathExtractor::kBoxed};
  EXPECT_EQ(extract_math_answer(text, hash_first), Opt("5"));
  const std::vector<MathExtractor> number = {MathExtractor::kLastNumber};
  EXPECT_EQ(extract_math_answer(text, number), Opt("7"));
  const std::vector<MathExtractor> boxed_only = {MathExtractor::kBoxed};
  EXPECT_EQ(extract_math_answer("the answer is 9", boxed_only), std::nullopt);
  // An empty box falls through to the next extractor.
  EXPECT_EQ(extract_math_answer("\\boxed{} 8", boxed_first), Opt("8"));
}

TEST(MathAnswer, ExtractorNamesRoundTripAndBadNameIsAnError) {
  for (MathExtractor e : default_math_extractors()) {
    absl::StatusOr<MathExtractor> back = parse_math_extractor(math_extractor_name(e));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, e);
  }
  absl::StatusOr<MathExtractor> bad = parse_math_extractor("regex");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("boxed, hash, last_number"), std::string::npos);
}

struct NormCase {
  std::string in;
  std::string out;
};

TEST(MathAnswer, NormalizesNumbersToOneCanonicalForm) {
  const std::vector<NormCase> cases = {
      {"42", "42"},
      {" +42 ", "42"},
      {"042", "42"},
      {"42.0", "42"},
      {"42.000", "42"},
      {"42.", "42"},
      {"1,234", "1234"},
      {"1,234.50", "1234.5"},
      {"$1,234.50", "1234.5"},
      {"-0", "0"},
      {"-0.0", "0"},
      {"-3", "-3"},
      {"\xE2\x88\x92"
       "3",
       "-3"},
      {".5", "0.5"},
      {"0.75", "0.75"},
      {"3/4", "0.75"},
      {"6/8", "0.75"},
      {"-3/4", "-0.75"},
      {"1/3", "1/3"},
      {"2/6", "1/3"},
      {"8/4", "2"},
      {"0/5", "0"},
      {"1/1024", "0.0009765625"},
      {"0.333", "0.333"},
      {"50%", "50"},
      {"50\\%", "50"},
      {"\\frac{3}{4}", "0.75"},
      {"\\dfrac{10}{4}", "2.5"},
      {"-\\frac{1}{3}", "-1/3"},
      {"\\text{ 18 }", "18"},
      {"\\textbf{7}", "7"},
      {"x = 5", "5"},
      {"1{,}000", "1000"},
      {"1\\,000", "1000"},
      {"$\\left(3\\right)$", "(3)"},
      {"123456789012345678901234567890", "123456789012345678901234567890"},
      // More than 36 digits: digits kept, zeros trimmed.
      {"0001234567890123456789012345678901234567890.500",
       "1234567890123456789012345678901234567890.5"},
      // Not numbers: compared with whitespace removed.
      {"x + 1", "x+1"},
      {"1/0", "1/0"},
      {"1,2", "1,2"},
      {"\\sqrt{2}", "\\sqrt{2}"},
      {"", ""},
  };
  for (const NormCase& c : cases) {
    EXPECT_EQ(normalize_math_answer(c.in), c.out) << "input: " << c.in;
  }
}

TEST(MathAnswer, EquivalentAnswersMatchAndDifferentOnesDoNot) {
  auto same = [](const std::string& a, const std::string& b) {
    return normalize_math_answer(a) == normalize_math_answer(b);
  };
  EXPECT_TRUE(same("3/4", "0.75"));
  EXPECT_TRUE(same("\\frac{3}{4}", ".75"));
  EXPECT_TRUE(same("1,000,000", "1000000.00"));
  EXPECT_TRUE(same("+7", "7.0"));
  EXPECT_FALSE(same("1/3", "0.333"));
  EXPECT_FALSE(same("1/3", "0.3333333333"));
  EXPECT_FALSE(same("-5", "5"));
  EXPECT_FALSE(same("1,234", "1.234"));
  EXPECT_FALSE(same("12", "120"));
  EXPECT_FALSE(same("0.1", "0.01"));
}

// Canonical forms must be a fixed point: normalizing twice changes nothing.
TEST(MathAnswer, NormalizationIsIdempotent) {
  for (const char* s :
       {"1,234.50", "3/4", "-\\frac{2}{6}", "$5", "1/7", "x+1", "-0.000", "100%", "\\text{12}."}) {
    const std::string once = normalize_math_answer(s);
    EXPECT_EQ(normalize_math_answer(once), once) << s;
  }
}

}  // namespace
}  // namespace fp8rl::rl
