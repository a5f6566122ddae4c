// GRPO on the CPU side of the RL loop: group-relative advantages (coordinator) and the
// IS-corrected PPO-clip policy loss with the k3 KL penalty and its gradient with respect to the
// current policy's per-token logprobs (trainer; the model engine backpropagates that gradient
// through the network). Also the SFT token-NLL loss used for warm starts.
//
// Policy loss (docs/design/rl-step.md "The RL step"), over the N valid tokens of a batch:
//   w_t   = IS weight of token t after the truncation rule (rl/importance.h), detached
//   r_t   = exp(cur_t - prev_t)
//   pg_t  = w_t * max(-A * r_t, -A * clip(r_t, 1 - eps, 1 + eps))     (A: the sequence advantage)
//   k3_t  = exp(ref_t - cur_t) - (ref_t - cur_t) - 1
//           (Schulman's k3 with ratio ref/cur; for tokens sampled from the policy, ~cur, its mean
//           estimates KL(cur || ref), the reverse KL that NeMo RL also penalizes)
//   loss  = sum_t pg_t / N + beta * sum_t k3_t / N
// Gradient per token:
//   dpg/dcur  = w * (-A) * r   when the unclipped branch is active (ties count as unclipped:
//               inside [1-eps, 1+eps] both branches are equal), 0 when the clipped branch wins
//   dk3/dcur  = 1 - exp(ref - cur)
//   dloss/dcur_t = (dpg/dcur + beta * dk3/dcur) / N, and 0 for masked positions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "rl/importance.h"

namespace fp8rl::rl {

inline constexpr double kAdvantageStdEpsilon = 1e-6;

// rewards: [num_groups * group_size], group-major (the G samples of prompt p at p*G .. p*G+G-1).
// A = (r - mean_group) / (std_group + 1e-6), std the unbiased (n - 1) sample standard deviation
// (torch.std's default); a group whose rewards are all equal gets advantages exactly 0.
// InvalidArgument if group_size < 2, rewards.size() is not a multiple of it, or a reward is not
// finite.
absl::StatusOr<std::vector<float>> group_advantages(std::span<const float> rewards,
                                                    int64_t group_size);

struct PolicyLossConfig {
  double clip_eps = 0.2;  // PPO clip epsilon, in (0, 1)
  double kl_beta = 0.0;   // weight of the k3 estimate of KL(cur || ref); 0 disables it (ref may
                          // then be empty)
  IsConfig is;            // IS truncation rule and bounds
  // Normalizer N. 0: the number of valid tokens in this call. > 0: use this count instead, so a
  // trainer that splits one minibatch into several calls can normalize by the whole minibatch.
  int64_t token_normalizer = 0;
};

// Per-token arrays are [B*L] in the TokenLayout of rl/importance.h; advantages are per sequence.
struct PolicyLossInput {
  TokenLayout layout;
  std::span<const float> cur_logprobs;   // [B*L] current policy (the gradient flows into these)
  std::span<const float> prev_logprobs;  // [B*L] trainer policy at the rollout version, pre-update
  std::span<const float> gen_logprobs;   // [B*L] what the generation worker reported
  std::span<const float> ref_logprobs;   // [B*L] frozen reference policy; empty iff kl_beta == 0
  std::span<const uint8_t> mask;         // [B*L] 1 = valid response token
  std::span<const float> advantages;     // [B]
};

struct PolicyLossStats {
  double loss = 0.0;            // total (policy + beta * kl)
  double policy_loss = 0.0;     // sum pg / N
  double kl = 0.0;              // mean k3 over valid tokens (unweighted by beta): KL(cur || ref)
  double clip_fraction = 0.0;   // fraction of valid tokens where the clipped branch wins strictly
  double is_weight_mean = 0.0;  // mean applied w over valid tokens (1 for rule none)
  double is_zeroed_fraction = 0.0;  // fraction of valid tokens whose truncated w is 0
  double ratio_mean = 0.0;          // mean r over valid tokens
  // NeMo RL's probs_ratio_min / _max: min / max of the PPO ratio r = exp(cur - prev) over valid
  // tokens (1 when there are none). 1 on a step's first update, when cur == prev.
  double probs_ratio_min = 1.0;
  double probs_ratio_max = 1.0;
  int64_t valid_tokens = 0;
};

struct PolicyLossResult {
  double loss = 0.0;
  std::vector<float> dloss_dcur;  // [B*L], 0 at masked positions
  PolicyLossStats stats;
};

// InvalidArgument on size mismatches, a bad config, or non-finite cur/prev/ref at a valid token
// (message names the array and the flat index). No valid tokens: loss 0 and an all-zero gradient.
absl::StatusOr<PolicyLossResult> grpo_policy_loss(const PolicyLossInput& input,
                                                  const PolicyLossConfig& config);

// SFT: loss = -sum_t mask_t * logp_t / N, N = number of valid tokens (or token_normalizer if > 0),
// dloss/dlogp_t = -mask_t / N. logprobs are the model's log-probabilities of the target tokens.
struct SftLossResult {
  double loss = 0.0;
  std::vector<float> dloss_dlogp;
  int64_t valid_tokens = 0;
};
absl::StatusOr<SftLossResult> sft_nll_loss(std::span<const float> logprobs,
                                           std::span<const uint8_t> mask,
                                           int64_t token_normalizer = 0);

}  // namespace fp8rl::rl
