// Sampler/learner mismatch metrics, named and defined as in NeMo RL so users can compare runs
// (docs/design/mismatch.md, "Mismatch metrics"). Computed by the trainer on every step from the
// generation worker's logprobs (gen) and its own pre-update logprobs (prev) of the same tokens.
//
// Over the N valid response tokens (mask != 0), with d = prev - gen, w = exp(d) and w_rule the
// weight the loss applies (rl/importance.h):
//   token_mult_prob_error     mean(exp(|gen - prev|))                    (1 = identical)
//   gen_kl_error              mean(exp(d) - d - 1): the k3 estimator of KL(gen || train) for
//                             tokens sampled from gen; >= 0 per token
//   sampling_importance_ratio mean(w_rule): the weights AFTER truncation (a zeroed token counts
//                             as 0). For rule none, which applies weight 1, the mean of the
//                             sanitized raw w (NeMo RL reports the uncorrected weights there too)
//   is_oob_ratio              tis / icepop: fraction of tokens out of bounds; seq_mask_tis:
//                             fraction of sequences (with >= 1 valid token) masked; none: 0
//   is_weight_min / _max      min / max of w over tokens with a finite w (our name; the trainer's
//                             is_weight gauge)
//   probs_ratio_min / _max    min / max of the PPO ratio exp(cur - prev): not a function of gen,
//                             so mismatch_metrics() sets 1 (the ratio before any update, when cur
//                             == prev) and the trainer folds in each update's PolicyLossStats with
//                             fold_probs_ratio()
// With the generation worker's untruncated logprobs (gen_full, model/step_generator.h) the top-p /
// top-k truncation, a real mismatch that IS corrects, is separated from the precision mismatch:
//   sampling_kept_mass        mean(exp(gen_full - gen)): the mean mass M of the kept set (1 when
//                             nothing was truncated; then gen == gen_full)
//   full_token_mult_prob_error  mean(exp(|gen_full - prev|)): token_mult_prob_error as if the
//                             sampler had not truncated (precision/kernel mismatch only)
// Both are 1 when gen_full is not given.
//
// Where we deliberately differ from NeMo RL: tokens with a non-finite d are left out of
// token_mult_prob_error, gen_kl_error, the kept-mass metrics and is_weight_min/max, and counted
// in nonfinite_tokens (NeMo RL's means turn inf or NaN, which hides every other token of the
// step); they count in sampling_importance_ratio (with their weight, 0 unless rule none) and in
// is_oob_ratio. With N == 0 every metric is 0 (ratios and errors 1).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "rl/grpo.h"
#include "rl/importance.h"
#include "rl/step_metrics.h"

namespace fp8rl::rl {

struct MismatchMetrics {
  double token_mult_prob_error = 1.0;
  double gen_kl_error = 0.0;
  double sampling_importance_ratio = 1.0;
  double is_oob_ratio = 0.0;
  double is_weight_min = 1.0;
  double is_weight_max = 1.0;
  double probs_ratio_min = 1.0;
  double probs_ratio_max = 1.0;
  double sampling_kept_mass = 1.0;
  double full_token_mult_prob_error = 1.0;
  int64_t valid_tokens = 0;
  int64_t nonfinite_tokens = 0;
};

// gen_full_logprobs: empty, or [B*L] like the others (see above).
absl::StatusOr<MismatchMetrics> mismatch_metrics(std::span<const float> prev_logprobs,
                                                 std::span<const float> gen_logprobs,
                                                 std::span<const uint8_t> mask, TokenLayout layout,
                                                 const IsConfig& is_config,
                                                 std::span<const float> gen_full_logprobs = {});

// probs_ratio_min/max of a step = min/max over its updates: metrics->probs_ratio_min =
// min(itself, update.probs_ratio_min), likewise max. Skips an update with no valid tokens.
void fold_probs_ratio(const PolicyLossStats& update, MismatchMetrics* metrics);

// Adds the step metrics (rl/step_metric_schema.h) this struct holds to `values`, under their
// schema names: token_mult_prob_error, gen_kl_error, sampling_importance_ratio, is_oob_ratio,
// probs_ratio_min, probs_ratio_max.
void append_values(const MismatchMetrics& metrics, MetricsValues* values);

}  // namespace fp8rl::rl
