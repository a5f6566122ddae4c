// Tests of rl/scoring.h: rewards, accuracy, lengths and group advantages of a rollout on random
// right, wrong-but-numeric and garbage responses, recomputed independently; bad shapes rejected.
#include "rl/scoring.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rl/grpo.h"
#include "rl/tokenizer.h"

namespace fp8rl::rl {
namespace {

constexpr double kFormatReward = 0.25;

Task addition_task(const std::vector<Example>& train) {
  return Task("addition", train, {}, AnswerMatch::kNumber, kFormatReward);
}

TEST(ScoreRollout, MatchesTheVerifierAndGroupAdvantagesOnRandomResponses) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> operand(0, 99), kind(0, 2);
  const int64_t prompts = 4, group = 5;
  std::vector<Example> examples;
  for (int64_t p = 0; p < prompts; ++p) {
    const int a = operand(rng), b = operand(rng);
    examples.push_back({absl::StrCat(a, "+", b, "="), absl::StrCat(a + b)});
  }
  const Task task = addition_task(examples);
  const ByteTokenizer tokenizer;
  std::vector<std::vector<int32_t>> responses;
  std::vector<double> expected_reward;
  std::vector<int> expected_right;
  for (int64_t p = 0; p < prompts; ++p) {
    for (int64_t g = 0; g < group; ++g) {
      const int k = kind(rng);
      std::string text;
      if (k == 0) text = examples[static_cast<size_t>(p)].answer;                     // right
      if (k == 1) text = absl::StrCat(examples[static_cast<size_t>(p)].answer, "1");  // wrong
      if (k == 2) text = "no number here";                                            // garbage
      responses.push_back(tokenizer.encode(text, false, /*add_eos=*/g % 2 == 0));
      expected_reward.push_back(k == 0 ? 1.0 : k == 1 ? kFormatReward : 0.0);
      expected_right.push_back(k == 0 ? 1 : 0);
    }
  }

  absl::StatusOr<RolloutScores> scores =
      score_rollout(task, examples, responses, group, byte_prompt_format());
  ASSERT_TRUE(scores.ok()) << scores.status();
  const size_t n = responses.size();
  ASSERT_EQ(scores->rewards.size(), n);
  double mean = 0.0, right = 0.0, length = 0.0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(scores->rewards[i], static_cast<float>(expected_reward[i])) << i;
    mean += expected_reward[i];
    right += expected_right[i];
    length += static_cast<double>(responses[i].size());
  }
  mean /= static_cast<double>(n);
  double var = 0.0;
  for (double r : expected_reward) var += (r - mean) * (r - mean);
  EXPECT_DOUBLE_EQ(scores->reward_mean, mean);
  EXPECT_DOUBLE_EQ(scores->reward_std, std::sqrt(var / static_cast<double>(n)));
  EXPECT_GT(scores->reward_std, 0.0);
  EXPECT_DOUBLE_EQ(scores->accuracy, right / static_cast<double>(n));
  EXPECT_DOUBLE_EQ(scores->response_length_mean, length / static_cast<double>(n));
  // Advantages are exactly group_advantages of the rewards, group by group.
  const std::vector<float> advantages = group_advantages(scores->rewards, group).value();
  EXPECT_EQ(scores->advantages, advantages);
  bool nonzero = false;
  for (float a : advantages) nonzero |= a != 0.0f;
  EXPECT_TRUE(nonzero);
}

TEST(ScoreRollout, ResponsesBelongToTheirGroupsPrompt) {
  // Two prompts with different answers: the same response is right for one group only.
  const std::vector<Example> examples = {{"1+1=", "2"}, {"2+3=", "5"}};
  const Task task = addition_task(examples);
  const ByteTokenizer tokenizer;
  std::vector<std::vector<int32_t>> responses(6, tokenizer.encode("5", false, true));
  responses[0] = tokenizer.encode("2", false, true);
  const RolloutScores scores =
      score_rollout(task, examples, responses, 3, byte_prompt_format()).value();
  const std::vector<float> want = {1.0f, 0.25f, 0.25f, 1.0f, 1.0f, 1.0f};
  EXPECT_EQ(scores.rewards, want);
  EXPECT_DOUBLE_EQ(scores.accuracy, 4.0 / 6.0);
  // The second group agrees: advantages exactly 0 there.
  EXPECT_GT(scores.advantages[0], 0.0f);
  EXPECT_EQ(scores.advantages[3], 0.0f);
  EXPECT_EQ(scores.advantages[5], 0.0f);
}

TEST(ScoreRollout, RejectsShapesThatDoNotMatch) {
  const std::vector<Example> examples = {{"1+1=", "2"}, {"2+3=", "5"}};
  const Task task = addition_task(examples);
  const std::vector<std::vector<int32_t>> five(5, std::vector<int32_t>{'2'});
  absl::StatusOr<RolloutScores> bad = score_rollout(task, examples, five, 3, byte_prompt_format());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("responses: 5 responses for 2 prompts x 3"),
            std::string::npos)
      << bad.status();
  EXPECT_EQ(score_rollout(task, examples, {}, 3, byte_prompt_format()).status().message(),
            "responses: empty");
  // group_size 1 has no group statistics (group_advantages rejects it).
  const std::vector<std::vector<int32_t>> two(2, std::vector<int32_t>{'2'});
  EXPECT_EQ(score_rollout(task, examples, two, 1, byte_prompt_format()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fp8rl::rl
