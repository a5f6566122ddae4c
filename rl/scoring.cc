// Rewards, accuracy and group advantages of a rollout (see scoring.h).
#include "rl/scoring.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "rl/grpo.h"

namespace fp8rl::rl {

absl::StatusOr<RolloutScores> score_rollout(const Task& task, std::span<const Example> prompts,
                                            std::span<const std::vector<int32_t>> responses,
                                            int64_t group_size, const PromptFormat& format) {
  if (responses.empty()) return absl::InvalidArgumentError("responses: empty");
  if (group_size < 1 || responses.size() != prompts.size() * static_cast<size_t>(group_size)) {
    return absl::InvalidArgumentError(absl::StrCat("responses: ", responses.size(),
                                                   " responses for ", prompts.size(), " prompts x ",
                                                   group_size, " samples (group_size)"));
  }
  RolloutScores out;
  out.rewards.resize(responses.size());
  double reward_sum = 0.0, correct = 0.0, length_sum = 0.0;
  for (size_t i = 0; i < responses.size(); ++i) {
    const Example& example = prompts[i / static_cast<size_t>(group_size)];
    const std::string completion = decode_completion(responses[i], format);
    out.rewards[i] = static_cast<float>(task.reward(example, completion));
    reward_sum += out.rewards[i];
    correct += task.correct(example, completion) ? 1.0 : 0.0;
    length_sum += static_cast<double>(responses[i].size());
  }
  absl::StatusOr<std::vector<float>> advantages = group_advantages(out.rewards, group_size);
  if (!advantages.ok()) return advantages.status();
  out.advantages = *std::move(advantages);
  const double n = static_cast<double>(responses.size());
  out.reward_mean = reward_sum / n;
  out.accuracy = correct / n;
  out.response_length_mean = length_sum / n;
  double var = 0.0;
  for (float r : out.rewards) var += (r - out.reward_mean) * (r - out.reward_mean);
  out.reward_std = std::sqrt(var / n);
  return out;
}

}  // namespace fp8rl::rl
