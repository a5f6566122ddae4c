// NeMo-RL-compatible sampler/learner mismatch metrics over valid response tokens (mismatch.h).
#include "rl/mismatch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace fp8rl::rl {

absl::StatusOr<MismatchMetrics> mismatch_metrics(std::span<const float> prev_logprobs,
                                                 std::span<const float> gen_logprobs,
                                                 std::span<const uint8_t> mask, TokenLayout layout,
                                                 const IsConfig& is_config,
                                                 std::span<const float> gen_full_logprobs) {
  absl::StatusOr<IsWeights> weights =
      compute_is_weights(prev_logprobs, gen_logprobs, mask, layout, is_config);
  if (!weights.ok()) return weights.status();
  const bool has_full = !gen_full_logprobs.empty();
  if (has_full && gen_full_logprobs.size() != mask.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mismatch metrics: gen_full_logprobs has ",
                                                   gen_full_logprobs.size(),
                                                   " entries, expected 0 or ", mask.size()));
  }

  MismatchMetrics m;
  double mult_sum = 0.0, kl_sum = 0.0, w_sum = 0.0, kept_sum = 0.0, full_mult_sum = 0.0;
  int64_t finite = 0, full_finite = 0, oob_tokens = 0;
  double w_min = std::numeric_limits<double>::infinity();
  double w_max = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i]) continue;
    ++m.valid_tokens;
    w_sum += is_config.rule == IsRule::kNone ? weights->raw[i] : weights->truncated[i];
    oob_tokens += weights->oob[i];
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
    if (has_full) {
      const double kept = std::exp(static_cast<double>(gen_full_logprobs[i]) - gen_logprobs[i]);
      const double full_mult =
          std::exp(std::abs(static_cast<double>(gen_full_logprobs[i]) - prev_logprobs[i]));
      if (std::isfinite(kept) && std::isfinite(full_mult)) {
        ++full_finite;
        kept_sum += kept;
        full_mult_sum += full_mult;
      }
    }
  }
  if (m.valid_tokens == 0) return m;
  const double count = static_cast<double>(m.valid_tokens);
  m.sampling_importance_ratio = w_sum / count;
  if (is_config.rule == IsRule::kSeqMaskTis) {
    int64_t masked = 0;
    for (uint8_t s : weights->seq_masked) masked += s;
    m.is_oob_ratio =
        weights->valid_sequences > 0
            ? static_cast<double>(masked) / static_cast<double>(weights->valid_sequences)
            : 0.0;
  } else {
    m.is_oob_ratio = static_cast<double>(oob_tokens) / count;
  }
  if (finite > 0) {
    m.token_mult_prob_error = mult_sum / static_cast<double>(finite);
    m.gen_kl_error = kl_sum / static_cast<double>(finite);
    m.is_weight_min = w_min;
    m.is_weight_max = w_max;
  }
  if (full_finite > 0) {
    m.sampling_kept_mass = kept_sum / static_cast<double>(full_finite);
    m.full_token_mult_prob_error = full_mult_sum / static_cast<double>(full_finite);
  }
  return m;
}

void fold_probs_ratio(const PolicyLossStats& update, MismatchMetrics* metrics) {
  if (update.valid_tokens == 0) return;
  metrics->probs_ratio_min = std::min(metrics->probs_ratio_min, update.probs_ratio_min);
  metrics->probs_ratio_max = std::max(metrics->probs_ratio_max, update.probs_ratio_max);
}

void append_values(const MismatchMetrics& m, MetricsValues* values) {
  (*values)["token_mult_prob_error"] = m.token_mult_prob_error;
  (*values)["gen_kl_error"] = m.gen_kl_error;
  (*values)["sampling_importance_ratio"] = m.sampling_importance_ratio;
  (*values)["is_oob_ratio"] = m.is_oob_ratio;
  (*values)["probs_ratio_min"] = m.probs_ratio_min;
  (*values)["probs_ratio_max"] = m.probs_ratio_max;
}

}  // namespace fp8rl::rl
