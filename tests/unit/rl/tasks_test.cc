// Tests of rl/tasks.h: deterministic generated splits with held-out validation, answers checked
// by an independent evaluator, reward/extraction rules, the JSONL format and prompt sampling.
#include "rl/tasks.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

// Recursive-descent evaluator of "a+b*(c-d)=" written independently of the generator.
class Evaluator {
 public:
  explicit Evaluator(std::string_view s) : s_(s) {}
  int64_t run() {
    const int64_t v = sum();
    EXPECT_EQ(s_.substr(pos_), "=");
    return v;
  }

 private:
  int64_t sum() {
    int64_t v = product();
    while (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) {
      const char op = s_[pos_++];
      const int64_t rhs = product();
      v = op == '+' ? v + rhs : v - rhs;
    }
    return v;
  }
  int64_t product() {
    int64_t v = atom();
    while (pos_ < s_.size() && s_[pos_] == '*') {
      ++pos_;
      v *= atom();
    }
    return v;
  }
  int64_t atom() {
    if (s_[pos_] == '(') {
      ++pos_;
      const int64_t v = sum();
      EXPECT_EQ(s_[pos_], ')');
      ++pos_;
      return v;
    }
    int64_t v = 0;
    EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(s_[pos_]))) << s_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      v = v * 10 + (s_[pos_++] - '0');
    }
    return v;
  }
  std::string_view s_;
  size_t pos_ = 0;
};

TaskConfig config_for(const std::string& name) {
  TaskConfig c;
  c.name = name;
  c.seed = 99;
  c.train_size = 3000;
  c.val_size = 100;
  if (name == "multiplication") c.digits = 2;
  if (name == "arithmetic") c.terms = 4;
  return c;
}

class GeneratedTask : public ::testing::TestWithParam<std::string> {};

TEST_P(GeneratedTask, DeterministicHeldOutAndCorrect) {
  const TaskConfig c = config_for(GetParam());
  absl::StatusOr<Task> a = make_task(c);
  absl::StatusOr<Task> b = make_task(c);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->train(), b->train());
  EXPECT_EQ(a->validation(), b->validation());
  ASSERT_EQ(a->train().size(), 3000u);
  ASSERT_EQ(a->validation().size(), 100u);

  TaskConfig other = c;
  other.seed = 100;
  EXPECT_NE(make_task(other)->validation(), a->validation());

  std::set<std::string> val_prompts;
  for (const Example& ex : a->validation()) val_prompts.insert(ex.prompt);
  EXPECT_EQ(val_prompts.size(), 100u);  // distinct
  std::set<std::string> train_prompts;
  for (const Example& ex : a->train()) {
    EXPECT_FALSE(val_prompts.contains(ex.prompt)) << ex.prompt;  // held out
    train_prompts.insert(ex.prompt);
  }
  EXPECT_GT(train_prompts.size(), 1000u);  // varied

  bool saw_parens = false, saw_negative = false;
  for (const std::vector<Example>* split : {&a->train(), &a->validation()}) {
    for (const Example& ex : *split) {
      ASSERT_EQ(ex.prompt.back(), '=');
      EXPECT_EQ(ex.answer, std::to_string(Evaluator(ex.prompt).run())) << ex.prompt;
      EXPECT_EQ(a->reward(ex, ex.answer), 1.0);
      saw_parens = saw_parens || ex.prompt.find('(') != std::string::npos;
      saw_negative = saw_negative || ex.answer[0] == '-';
    }
  }
  if (GetParam() == "arithmetic") {
    EXPECT_TRUE(saw_parens);
    EXPECT_TRUE(saw_negative);
  }
}

INSTANTIATE_TEST_SUITE_P(Builtins, GeneratedTask,
                         ::testing::Values("addition", "multiplication", "arithmetic"));

TEST(Task, AdditionOperandsHaveConfiguredDigits) {
  TaskConfig c = config_for("addition");
  c.digits = 2;
  absl::StatusOr<Task> t = make_task(c);
  ASSERT_TRUE(t.ok());
  size_t longest = 0;
  for (const Example& ex : t->train()) {
    const size_t plus = ex.prompt.find('+');
    EXPECT_LE(plus, 2u);
    EXPECT_LE(ex.prompt.size() - plus - 2, 2u);
    longest = std::max(longest, plus);
  }
  EXPECT_EQ(longest, 2u);
}

TEST(Task, RewardRules) {
  const Task task("addition", {}, {}, AnswerMatch::kNumber, 0.0);
  const Example ex{"40+2=", "42"};
  EXPECT_EQ(task.reward(ex, "42"), 1.0);
  EXPECT_EQ(task.reward(ex, "  42"), 1.0);         // leading whitespace
  EXPECT_EQ(task.reward(ex, "42\n"), 1.0);         // trailing whitespace
  EXPECT_EQ(task.reward(ex, "42 and more"), 1.0);  // trailing text ignored
  EXPECT_EQ(task.reward(ex, "42+1"), 1.0);         // the number ends at the first non-digit
  EXPECT_EQ(task.reward(ex, "43"), 0.0);
  EXPECT_EQ(task.reward(ex, "420"), 0.0);
  EXPECT_EQ(task.reward(ex, "042"), 0.0);  // exact string match
  EXPECT_EQ(task.reward(ex, "x42"), 0.0);  // must start with the number
  EXPECT_EQ(task.reward(ex, ""), 0.0);
  EXPECT_EQ(task.reward({"1-3=", "-2"}, " -2"), 1.0);
  EXPECT_EQ(task.reward({"1-3=", "-2"}, "2"), 0.0);
  const Task shaped("addition", {}, {}, AnswerMatch::kNumber, 0.1);
  EXPECT_EQ(shaped.reward(ex, "41"), 0.1);  // well-formed but wrong
  EXPECT_EQ(shaped.reward(ex, "abc"), 0.0);
  EXPECT_EQ(shaped.reward(ex, "42"), 1.0);
  EXPECT_EQ(extract_answer(" \t-17xyz", AnswerMatch::kNumber), "-17");
  EXPECT_EQ(extract_answer("-", AnswerMatch::kNumber), std::nullopt);
  EXPECT_EQ(extract_answer("  Paris  \nLondon", AnswerMatch::kLine), "Paris");
  EXPECT_EQ(extract_answer(" \n ", AnswerMatch::kLine), std::nullopt);
}

class TempDir {
 public:
  TempDir() {
    path_ =
        std::filesystem::temp_directory_path() / ("fp8rl_tasks_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = (path_ / name).string();
    std::ofstream(p) << content;
    return p;
  }

 private:
  std::filesystem::path path_;
};

TEST(JsonlTask, ReadsSplitsAndScores) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 20; ++i) {
    lines += "{\"prompt\": \"capital " + std::to_string(i) + "?\", \"answer\": \"city " +
             std::to_string(i) + "\", \"id\": " + std::to_string(i) + "}\n";
    if (i == 5) lines += "\n";  // blank lines are skipped
  }
  TaskConfig c;
  c.name = "jsonl";
  c.train_path = dir.write("train.jsonl", lines);
  c.val_size = 5;
  absl::StatusOr<Task> t = make_task(c);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->train().size(), 15u);
  EXPECT_EQ(t->validation().size(), 5u);
  EXPECT_EQ(make_task(c)->validation(), t->validation());
  const Example& ex = t->validation()[0];
  EXPECT_EQ(t->reward(ex, "  " + ex.answer + "  \nmore lines"), 1.0);
  EXPECT_EQ(t->reward(ex, ex.answer + "x"), 0.0);

  c.val_path = dir.write("val.jsonl", "{\"prompt\": \"2+2=\", \"answer\": 4}\n");
  c.match = "number";
  absl::StatusOr<Task> with_val = make_task(c);
  ASSERT_TRUE(with_val.ok()) << with_val.status();
  EXPECT_EQ(with_val->train().size(), 20u);
  ASSERT_EQ(with_val->validation().size(), 1u);
  EXPECT_EQ(with_val->validation()[0].answer, "4");
  EXPECT_EQ(with_val->reward(with_val->validation()[0], "4 apples"), 1.0);
}

TEST(JsonlTask, BadLinesNameTheLine) {
  TempDir dir;
  TaskConfig c;
  c.name = "jsonl";
  c.val_size = 1;
  const std::string good = "{\"prompt\": \"a\", \"answer\": \"b\"}\n";
  auto error_for = [&](const std::string& bad) {
    c.train_path = dir.write("t.jsonl", good + good + bad + "\n" + good);
    return std::string(make_task(c).status().message());
  };
  c.train_path = dir.write("t.jsonl", good);  // error_for rewrites this same path
  EXPECT_EQ(error_for("{\"prompt\": \"a\"}"),
            c.train_path + ":3: \"answer\" must be a string or an integer");
  EXPECT_EQ(error_for("{\"answer\": \"b\"}"), c.train_path + ":3: \"prompt\" must be a string");
  EXPECT_EQ(error_for("[1, 2]"), c.train_path + ":3: must be a JSON object");
  EXPECT_EQ(error_for("{\"prompt\": \"\", \"answer\": \"b\"}"),
            c.train_path + ":3: \"prompt\" must not be empty");
  EXPECT_EQ(error_for("{\"prompt\": \"a\", \"answer\": \" \"}"),
            c.train_path + ":3: \"answer\" must not be empty");
  EXPECT_TRUE(error_for("{\"prompt\": \"a\",").starts_with(c.train_path + ":3: not valid JSON"));
  // A line that is not JSON (a password file given as the dataset) is never quoted back.
  EXPECT_EQ(error_for("root:x:0:0:root:/root:/bin/bash"),
            c.train_path + ":3: not valid JSON (parse error at byte 1)");
  c.train_path = dir.write("empty.jsonl", "\n\n");
  EXPECT_EQ(make_task(c).status().message(), c.train_path + ": no examples");
  c.train_path = dir.write("small.jsonl", good);
  EXPECT_EQ(make_task(c).status().message(), "task.val_size: must be < the 1 examples in " +
                                                 c.train_path + " (no task.params.val_path given)");
}

TEST(TaskConfigValidation, NamesTheField) {
  TaskConfig c = config_for("addition");
  c.digits = 10;
  EXPECT_EQ(validate_task_config(c).message(), "task.params.digits: must be in [1, 9]");
  c = config_for("addition");
  c.digits = 1;  // 100 problems: at most 50 held out
  c.val_size = 51;
  EXPECT_EQ(validate_task_config(c).message(),
            "task.val_size: must be <= 50 (half of the distinct problems for these params)");
  c.val_size = 50;
  absl::StatusOr<Task> small = make_task(c);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->validation().size(), 50u);
  c = config_for("arithmetic");
  c.terms = 9;
  EXPECT_EQ(validate_task_config(c).message(), "task.params.terms: must be in [2, 8]");
  c = config_for("nope");
  EXPECT_EQ(make_task(c).status().message(),
            "task.name: must be one of addition, multiplication, arithmetic, jsonl, math");
  c = config_for("jsonl");
  EXPECT_EQ(make_task(c).status().message(), "task.params.train_path: required");
}

TEST(Task, TokenizeExampleMarksAnswerTargets) {
  const ByteTokenizer tok;
  const Example ex{"7+8=", "15"};
  const TokenizedExample full = tokenize_example(ex, tok, /*with_answer=*/true);
  EXPECT_EQ(full.tokens, (std::vector<int32_t>{kBosId, '7', '+', '8', '=', '1', '5', kEosId}));
  EXPECT_EQ(full.target_mask, (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(full.prompt_length, 5);
  const TokenizedExample prompt = tokenize_example(ex, tok, /*with_answer=*/false);
  EXPECT_EQ(prompt.tokens, (std::vector<int32_t>{kBosId, '7', '+', '8', '='}));
  EXPECT_EQ(prompt.target_mask, std::vector<uint8_t>(5, 0));
  EXPECT_EQ(tok.decode(std::span(full.tokens).subspan(full.prompt_length)), "15");
}

TEST(PromptIndices, DeterministicEpochPermutations) {
  EXPECT_EQ(prompt_indices(50, 3, 4, 16), prompt_indices(50, 3, 4, 16));
  EXPECT_NE(prompt_indices(50, 3, 4, 16), prompt_indices(50, 3, 5, 16));
  EXPECT_NE(prompt_indices(50, 3, 0, 16), prompt_indices(50, 4, 0, 16));
  // 10 steps of 10 over a split of 50 = two epochs, each a permutation of 0..49.
  std::vector<int64_t> all;
  for (int64_t step = 0; step < 10; ++step) {
    const std::vector<int64_t> idx = prompt_indices(50, 3, step, 10);
    all.insert(all.end(), idx.begin(), idx.end());
  }
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen(all.begin() + epoch * 50, all.begin() + (epoch + 1) * 50);
    EXPECT_EQ(seen.size(), 50u);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 49);
  }
  EXPECT_NE(std::vector<int64_t>(all.begin(), all.begin() + 50),
            std::vector<int64_t>(all.begin() + 50, all.end()));
  EXPECT_TRUE(prompt_indices(0, 3, 0, 4).empty());
}

}  // namespace
}  // namespace fp8rl::rl
