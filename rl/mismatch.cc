// NeMo-RL-compatible sampler/learner mismatch metrics over valid response tokens (mismatch.h).
#include "rl/mismatch.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace fp8rl::rl {

absl::StatusOr<MismatchMetrics> mismatch_metrics(std::span<const float> prev_logprobs,
                                                 std::span<const float> gen_logprobs,
                                                 std::span<const uint8_t> mask, TokenLayout layout,
                                                 const IsConfig& is_config) {
  absl::StatusOr<IsWeights> weights =
      compute_is_weights(prev_logprobs, gen_logprobs, mask, layout, is_config);
  if (!weights.ok()) return weights.status();

  MismatchMetrics m;
  double mult_sum = 0.0, kl_sum = 0.0, w_sum = 0.0;
  int64_t finite = 0, oob = 0;
  double w_min = std::numeric_limits<double>::infinity();
  double w_max = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i]) continue;
    ++m.valid_tokens;
    w_sum += weights->raw[i];
    oob += weights->oob[i];
    const double d = static_cast<double>(prev_logprobs[i]) - gen_logprobs[i];
    const double w = std::exp(d);
    const double mult = std::exp(std::abs(d));
    if (!std::isfinite(d) || !std::isfinite(w) || !std::isfinite(mult)) {
      ++m.nonfinite_tokens;
      continue;
    }
    ++finite;
    mult_sum += mult;
    kl_sum += w - d - 1.0;
    w_min = std::min(w_min, w);
    w_max = std::max(w_max, w);
  }
  if (m.valid_tokens == 0) return m;
  const double count = static_cast<double>(m.valid_tokens);
  m.sampling_importance_ratio = w_sum / count;
  m.is_oob_ratio = static_cast<double>(oob) / count;
  if (finite > 0) {
    m.token_mult_prob_error = mult_sum / static_cast<double>(finite);
    m.gen_kl_error = kl_sum / static_cast<double>(finite);
    m.probs_ratio_min = w_min;
    m.probs_ratio_max = w_max;
  }
  return m;
}

}  // namespace fp8rl::rl
