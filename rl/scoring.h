// Scoring of one RL step's rollout (docs/design/rl-step.md "The RL step", step 3): every response
// is decoded (decode_completion: up to the first stop id, with the job's tokenizer) and judged by
// the task's verifier, and the rewards become group-relative advantages. Pure: the same inputs give
// the same scores, bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "rl/prompt_format.h"
#include "rl/tasks.h"

namespace fp8rl::rl {

// Samples are group-major: sample g of prompt p is at index p * group_size + g.
struct RolloutScores {
  std::vector<float> rewards;     // [P*G] Task::reward of each decoded response, in [0, 1]
  std::vector<float> advantages;  // [P*G] group_advantages(rewards, G) (rl/grpo.h)
  double reward_mean = 0.0;       // mean reward over the P*G samples
  double reward_std = 0.0;        // population standard deviation (divides by P*G) of the rewards
  double accuracy = 0.0;          // fraction of samples whose answer is exactly right
  double response_length_mean = 0.0;  // mean response length in tokens (a final EOS included)
};

// prompts: the P examples of the step; responses: [P*G] generated token ids, the response only
// (no prompt), decoded with decode_completion(response, format). InvalidArgument naming the
// argument when responses is empty or its size is not prompts.size() * group_size, or when
// group_advantages rejects group_size (< 2).
absl::StatusOr<RolloutScores> score_rollout(const Task& task, std::span<const Example> prompts,
                                            std::span<const std::vector<int32_t>> responses,
                                            int64_t group_size, const PromptFormat& format);

}  // namespace fp8rl::rl
