// Importance-sampling (IS) correction between the sampler and the learner: the per-token weight
// w = exp(prev_logprobs - gen_logprobs) and its truncation rules (ARCHITECTURE.md, "One RL step"
// step 5 and "Mismatch metrics"). Used by the GRPO loss and the mismatch metrics alike, so the
// two always agree on which tokens were truncated.
//
// Layout: every per-token array is a padded batch of B sequences x L positions, row-major
// (index b * L + t); mask[i] != 0 marks a valid response token. Padding and prompt positions
// (mask 0) never contribute and always get weight 0.
//
// Rules (w is first sanitized: a NaN or infinite w becomes 0):
//   none          w unchanged
//   tis           w clamped to [0, cap]                               (cap: default 2)
//   icepop        w set to 0 where w is outside [lo, hi]              (default [0.5, 2])
//   seq_mask_tis  every token of a sequence set to 0 when the sequence's geometric-mean weight
//                 exp(mean over its valid tokens of (prev - gen)) is outside [lo, hi]; kept
//                 sequences keep their per-token w unchanged. A sequence with any non-finite
//                 log-ratio counts as outside.
// "Out of bounds" (is_oob_ratio): tis w > cap or non-finite; icepop w outside [lo, hi] or
// non-finite; seq_mask_tis every valid token of a masked sequence; none: never.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl::rl {

enum class IsRule { kNone, kTis, kIcepop, kSeqMaskTis };

// "none", "tis", "icepop", "seq_mask_tis" (the job-config spelling).
std::string_view is_rule_name(IsRule rule);
absl::StatusOr<IsRule> parse_is_rule(std::string_view name);

struct IsConfig {
  IsRule rule = IsRule::kTis;
  double cap = 2.0;  // tis: upper clamp C
  double lo = 0.5;   // icepop, seq_mask_tis: lower bound
  double hi = 2.0;   // icepop, seq_mask_tis: upper bound
  bool operator==(const IsConfig&) const = default;
};

// Shape of a padded token batch: B sequences x L positions.
struct TokenLayout {
  int64_t batch = 0;
  int64_t length = 0;
  int64_t size() const { return batch * length; }
};

struct IsWeights {
  std::vector<double> raw;        // [B*L] sanitized w before truncation (0 where mask is 0)
  std::vector<double> truncated;  // [B*L] after the rule (0 where mask is 0)
  std::vector<uint8_t> oob;       // [B*L] 1 where the token is out of bounds (see above)
};

// Checks sizes (prev, gen, mask all B*L; B, L >= 0) and the config, then applies the rule.
absl::StatusOr<IsWeights> compute_is_weights(std::span<const float> prev_logprobs,
                                             std::span<const float> gen_logprobs,
                                             std::span<const uint8_t> mask, TokenLayout layout,
                                             const IsConfig& config);

// InvalidArgument unless cap > 0 and 0 <= lo <= 1 <= hi with lo < hi; messages start with
// "<prefix>.cap", "<prefix>.lo", "<prefix>.hi" (prefix e.g. "algorithm.is").
absl::Status validate_is_config(const IsConfig& config, std::string_view prefix = "is");

}  // namespace fp8rl::rl
