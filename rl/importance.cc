// IS weights w = exp(prev - gen) and the truncation rules none | tis | icepop | seq_mask_tis.
#include "rl/importance.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace fp8rl::rl {

std::string_view is_rule_name(IsRule rule) {
  switch (rule) {
    case IsRule::kNone:
      return "none";
    case IsRule::kTis:
      return "tis";
    case IsRule::kIcepop:
      return "icepop";
    case IsRule::kSeqMaskTis:
      return "seq_mask_tis";
  }
  return "unknown";
}

absl::StatusOr<IsRule> parse_is_rule(std::string_view name) {
  for (IsRule rule : {IsRule::kNone, IsRule::kTis, IsRule::kIcepop, IsRule::kSeqMaskTis}) {
    if (name == is_rule_name(rule)) return rule;
  }
  return absl::InvalidArgumentError("must be one of none, tis, icepop, seq_mask_tis");
}

IsConfig default_is_config(IsRule rule) {
  IsConfig config;
  config.rule = rule;
  if (rule == IsRule::kSeqMaskTis) {
    config.lo = kSeqMaskTisDefaultLo;
    config.hi = kSeqMaskTisDefaultHi;
  }
  return config;
}

absl::Status validate_is_config(const IsConfig& config, std::string_view prefix) {
  const std::string p(prefix);
  // Written as negations so that NaN fails every check.
  if (!(config.cap >= 1.0) || !std::isfinite(config.cap)) {
    return absl::InvalidArgumentError(absl::StrCat(
        p, ".cap: must be >= 1 and finite (a cap below 1 truncates on-policy tokens), got ",
        config.cap));
  }
  if (!(config.lo >= 0.0 && config.lo <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".lo: must be in [0, 1], got ", config.lo));
  }
  if (!(config.hi >= 1.0) || !std::isfinite(config.hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, ".hi: must be >= 1 and finite, got ", config.hi));
  }
  if (!(config.lo < config.hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, ".hi: must be > lo (", config.lo, "), got ", config.hi));
  }
  return absl::OkStatus();
}

absl::StatusOr<IsWeights> compute_is_weights(std::span<const float> prev_logprobs,
                                             std::span<const float> gen_logprobs,
                                             std::span<const uint8_t> mask, TokenLayout layout,
                                             const IsConfig& config) {
  if (layout.batch < 0 || layout.length < 0) {
    return absl::InvalidArgumentError("layout: batch and length must be >= 0");
  }
  const size_t n = static_cast<size_t>(layout.size());
  if (prev_logprobs.size() != n || gen_logprobs.size() != n || mask.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("IS weights: prev_logprobs (", prev_logprobs.size(), "), gen_logprobs (",
                     gen_logprobs.size(), ") and mask (", mask.size(),
                     ") must all have batch * length = ", n, " entries"));
  }
  if (absl::Status s = validate_is_config(config); !s.ok()) return s;

  IsWeights out;
  out.raw.assign(n, 0.0);
  out.truncated.assign(n, 0.0);
  out.oob.assign(n, 0);
  out.seq_masked.assign(static_cast<size_t>(layout.batch), 0);
  for (int64_t b = 0; b < layout.batch; ++b) {
    const size_t row = static_cast<size_t>(b * layout.length);
    // Sequence-level geometric mean for seq_mask_tis: exp(mean log w) over valid tokens, with a
    // non-finite log w counted as 0.
    double log_sum = 0.0;
    int64_t valid = 0;
    for (int64_t t = 0; t < layout.length; ++t) {
      const size_t i = row + static_cast<size_t>(t);
      if (!mask[i]) continue;
      const double log_w = static_cast<double>(prev_logprobs[i]) - gen_logprobs[i];
      const double w = std::exp(log_w);
      const bool finite = std::isfinite(w);
      ++valid;
      if (std::isfinite(log_w)) log_sum += log_w;
      out.raw[i] = finite ? w : 0.0;
      switch (config.rule) {
        case IsRule::kNone:
          out.truncated[i] = 1.0;
          break;
        case IsRule::kTis:
          out.truncated[i] = std::min(out.raw[i], config.cap);
          out.oob[i] = !finite || w > config.cap;
          break;
        case IsRule::kIcepop: {
          const bool outside = !finite || w < config.lo || w > config.hi;
          out.truncated[i] = outside ? 0.0 : w;
          out.oob[i] = outside;
          break;
        }
        case IsRule::kSeqMaskTis:
          out.truncated[i] = out.raw[i];  // masked below once the sequence mean is known
          break;
      }
    }
    if (valid > 0) ++out.valid_sequences;
    if (config.rule == IsRule::kSeqMaskTis && valid > 0) {
      const double geo_mean = std::exp(log_sum / static_cast<double>(valid));
      if (!(geo_mean >= config.lo && geo_mean <= config.hi)) {
        out.seq_masked[static_cast<size_t>(b)] = 1;
        for (int64_t t = 0; t < layout.length; ++t) {
          const size_t i = row + static_cast<size_t>(t);
          if (!mask[i]) continue;
          out.truncated[i] = 0.0;
          out.oob[i] = 1;
        }
      }
    }
  }
  return out;
}

}  // namespace fp8rl::rl
