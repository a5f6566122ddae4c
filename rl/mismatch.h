// Sampler/learner mismatch metrics, named and defined as in NeMo RL so users can compare runs
// (ARCHITECTURE.md, "Mismatch metrics"). Computed by the trainer on every step from the
// generation worker's logprobs (gen) and its own pre-update logprobs (prev) of the same tokens.
//
// Over the N valid response tokens (mask != 0), with d = prev - gen and w = exp(d):
//   token_mult_prob_error     mean(exp(|gen - prev|))                    (1 = identical)
//   gen_kl_error              mean(exp(d) - d - 1): the k3 estimator of KL(gen || train) for
//                             tokens sampled from gen; unbiased, and >= 0 per token
//   sampling_importance_ratio mean(w) before truncation (NaN/inf w counted as 0)
//   is_oob_ratio              fraction of tokens out of the truncation bounds (rl/importance.h)
//   probs_ratio_min / _max    min / max of w over tokens with a finite w
// Tokens with a non-finite d are left out of token_mult_prob_error, gen_kl_error and the
// min/max (they are counted in nonfinite_tokens) but count in sampling_importance_ratio (as 0)
// and is_oob_ratio. With N == 0 every metric is 0 (ratios 1).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "rl/importance.h"

namespace fp8rl::rl {

struct MismatchMetrics {
  double token_mult_prob_error = 1.0;
  double gen_kl_error = 0.0;
  double sampling_importance_ratio = 1.0;
  double is_oob_ratio = 0.0;
  double probs_ratio_min = 1.0;
  double probs_ratio_max = 1.0;
  int64_t valid_tokens = 0;
  int64_t nonfinite_tokens = 0;
};

absl::StatusOr<MismatchMetrics> mismatch_metrics(std::span<const float> prev_logprobs,
                                                 std::span<const float> gen_logprobs,
                                                 std::span<const uint8_t> mask, TokenLayout layout,
                                                 const IsConfig& is_config);

}  // namespace fp8rl::rl
