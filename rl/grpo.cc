// GRPO group advantages, the IS-corrected PPO-clip + k3-KL policy loss with its per-token
// gradient, and the SFT token NLL (formulas in grpo.h).
#include "rl/grpo.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace fp8rl::rl {

absl::StatusOr<std::vector<float>> group_advantages(std::span<const float> rewards,
                                                    int64_t group_size) {
  if (group_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("advantages: group_size must be >= 2, got ", group_size));
  }
  const auto g = static_cast<size_t>(group_size);
  if (rewards.size() % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "advantages: ", rewards.size(), " rewards are not a multiple of group_size ", group_size));
  }
  for (size_t i = 0; i < rewards.size(); ++i) {
    if (!std::isfinite(rewards[i])) {
      return absl::InvalidArgumentError(absl::StrCat("advantages: reward ", i, " is not finite"));
    }
  }
  std::vector<float> advantages(rewards.size(), 0.0f);
  for (size_t start = 0; start < rewards.size(); start += g) {
    double mean = 0.0;
    for (size_t j = 0; j < g; ++j) mean += rewards[start + j];
    mean /= static_cast<double>(g);
    double var = 0.0;
    bool all_equal = true;
    for (size_t j = 0; j < g; ++j) {
      const double d = rewards[start + j] - mean;
      var += d * d;
      all_equal = all_equal && rewards[start + j] == rewards[start];
    }
    if (all_equal) continue;  // std 0: not scaled, advantages stay exactly 0
    const double std_dev = std::sqrt(var / static_cast<double>(g - 1));
    for (size_t j = 0; j < g; ++j) {
      advantages[start + j] =
          static_cast<float>((rewards[start + j] - mean) / (std_dev + kAdvantageStdEpsilon));
    }
  }
  return advantages;
}

namespace {

absl::Status check_size(std::string_view what, size_t got, size_t want) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("policy loss: ", std::string(what), " has ", got, " entries, expected ", want));
}

absl::Status check_finite(std::string_view what, std::span<const float> values,
                          std::span<const uint8_t> mask) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (mask[i] && !std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat("policy loss: ", std::string(what), "[", i,
                                                     "] is not finite at a valid token"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PolicyLossResult> grpo_policy_loss(const PolicyLossInput& input,
                                                  const PolicyLossConfig& config) {
  const TokenLayout layout = input.layout;
  if (layout.batch < 0 || layout.length < 0) {
    return absl::InvalidArgumentError("policy loss: layout batch and length must be >= 0");
  }
  if (!(config.clip_eps > 0.0 && config.clip_eps < 1.0)) {
    return absl::InvalidArgumentError("policy loss: clip_eps must be in (0, 1)");
  }
  if (!(config.kl_beta >= 0.0) || !std::isfinite(config.kl_beta)) {
    return absl::InvalidArgumentError("policy loss: kl_beta must be >= 0");
  }
  if (config.token_normalizer < 0) {
    return absl::InvalidArgumentError("policy loss: token_normalizer must be >= 0");
  }
  const auto n = static_cast<size_t>(layout.size());
  const bool use_kl = config.kl_beta > 0.0;
  for (const absl::Status& s :
       {check_size("cur_logprobs", input.cur_logprobs.size(), n),
        check_size("prev_logprobs", input.prev_logprobs.size(), n),
        check_size("gen_logprobs", input.gen_logprobs.size(), n),
        check_size("mask", input.mask.size(), n),
        check_size("advantages", input.advantages.size(), static_cast<size_t>(layout.batch)),
        check_size("ref_logprobs", input.ref_logprobs.size(), use_kl ? n : 0)}) {
    if (!s.ok()) return s;
  }
  for (const absl::Status& s : {check_finite("cur_logprobs", input.cur_logprobs, input.mask),
                                check_finite("prev_logprobs", input.prev_logprobs, input.mask)}) {
    if (!s.ok()) return s;
  }
  if (use_kl) {
    if (absl::Status s = check_finite("ref_logprobs", input.ref_logprobs, input.mask); !s.ok()) {
      return s;
    }
  }
  for (size_t b = 0; b < input.advantages.size(); ++b) {
    if (!std::isfinite(input.advantages[b])) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy loss: advantages[", b, "] is not finite"));
    }
  }
  absl::StatusOr<IsWeights> weights =
      compute_is_weights(input.prev_logprobs, input.gen_logprobs, input.mask, layout, config.is);
  if (!weights.ok()) return weights.status();

  PolicyLossResult result;
  result.dloss_dcur.assign(n, 0.0f);
  int64_t valid = 0;
  for (size_t i = 0; i < n; ++i) valid += input.mask[i] ? 1 : 0;
  result.stats.valid_tokens = valid;
  if (valid == 0) return result;
  const double norm =
      static_cast<double>(config.token_normalizer > 0 ? config.token_normalizer : valid);

  const double lo = 1.0 - config.clip_eps;
  const double hi = 1.0 + config.clip_eps;
  double pg_sum = 0.0, kl_sum = 0.0, w_sum = 0.0, r_sum = 0.0;
  double r_min = std::numeric_limits<double>::infinity();
  double r_max = -std::numeric_limits<double>::infinity();
  int64_t clipped = 0, zeroed = 0;
  for (int64_t b = 0; b < layout.batch; ++b) {
    const double a = input.advantages[static_cast<size_t>(b)];
    for (int64_t t = 0; t < layout.length; ++t) {
      const size_t i = static_cast<size_t>(b * layout.length + t);
      if (!input.mask[i]) continue;
      const double w = weights->truncated[i];
      const double r =
          std::exp(static_cast<double>(input.cur_logprobs[i]) - input.prev_logprobs[i]);
      const double unclipped = -a * r;
      const double clipped_term = -a * std::clamp(r, lo, hi);
      double grad = 0.0;
      if (unclipped >= clipped_term) {
        pg_sum += w * unclipped;
        grad = w * (-a) * r;
      } else {
        pg_sum += w * clipped_term;
        ++clipped;  // r is outside [lo, hi] and the clip wins: no gradient through r
      }
      if (use_kl) {
        const double d = static_cast<double>(input.ref_logprobs[i]) - input.cur_logprobs[i];
        const double e = std::exp(d);
        kl_sum += e - d - 1.0;
        grad += config.kl_beta * (1.0 - e);
      }
      result.dloss_dcur[i] = static_cast<float>(grad / norm);
      w_sum += w;
      r_sum += r;
      r_min = std::min(r_min, r);
      r_max = std::max(r_max, r);
      zeroed += w == 0.0 ? 1 : 0;
    }
  }
  const double count = static_cast<double>(valid);
  PolicyLossStats& stats = result.stats;
  stats.policy_loss = pg_sum / norm;
  stats.kl = kl_sum / count;
  stats.loss = stats.policy_loss + config.kl_beta * kl_sum / norm;
  stats.clip_fraction = static_cast<double>(clipped) / count;
  stats.is_weight_mean = w_sum / count;
  stats.is_zeroed_fraction = static_cast<double>(zeroed) / count;
  stats.ratio_mean = r_sum / count;
  stats.probs_ratio_min = r_min;
  stats.probs_ratio_max = r_max;
  result.loss = stats.loss;
  return result;
}

absl::StatusOr<SftLossResult> sft_nll_loss(std::span<const float> logprobs,
                                           std::span<const uint8_t> mask,
                                           int64_t token_normalizer) {
  if (logprobs.size() != mask.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sft loss: logprobs has ", logprobs.size(),
                                                   " entries but mask has ", mask.size()));
  }
  if (token_normalizer < 0) {
    return absl::InvalidArgumentError("sft loss: token_normalizer must be >= 0");
  }
  SftLossResult result;
  result.dloss_dlogp.assign(logprobs.size(), 0.0f);
  double sum = 0.0;
  for (size_t i = 0; i < logprobs.size(); ++i) {
    if (!mask[i]) continue;
    if (!std::isfinite(logprobs[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("sft loss: logprobs[", i, "] is not finite at a valid token"));
    }
    sum += logprobs[i];
    ++result.valid_tokens;
  }
  if (result.valid_tokens == 0) return result;
  const double norm =
      static_cast<double>(token_normalizer > 0 ? token_normalizer : result.valid_tokens);
  result.loss = -sum / norm;
  for (size_t i = 0; i < logprobs.size(); ++i) {
    if (mask[i]) result.dloss_dlogp[i] = static_cast<float>(-1.0 / norm);
  }
  return result;
}

}  // namespace fp8rl::rl
