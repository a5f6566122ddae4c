// Importance-sampling (IS) correction between the sampler and the learner: the per-token weight
// w = exp(prev_logprobs - gen_logprobs) and its truncation rules (docs/design/rl-step.md "The RL
// step"). Used by the GRPO loss and the mismatch metrics alike, so the two always agree on which
// tokens were truncated.
//
// Layout: every per-token array is a padded batch of B sequences x L positions, row-major
// (index b * L + t); mask[i] != 0 marks a valid response token. Padding and prompt positions
// (mask 0) never contribute and always get weight 0.
//
// Rules (w is first sanitized: a NaN or infinite w becomes 0, as NeMo RL's nan_to_num):
//   none          weight 1 on every valid token: no correction (raw w is still reported)
//   tis           w clamped to [0, cap]                               (default cap 2)
//   icepop        w set to 0 where w is outside [lo, hi]              (default [0.5, 2])
//   seq_mask_tis  every token of a sequence set to 0 when the sequence's geometric-mean weight
//                 exp(mean over its valid tokens of (prev - gen)) is outside [lo, hi]; kept
//                 sequences keep their per-token (sanitized, untruncated) w. A non-finite
//                 log-ratio counts as 0 in that mean, as in NeMo RL.  (default [0.999, 1.002])
// The defaults differ per rule (default_is_config): a geometric mean over a whole response moves
// far less than single tokens, so seq_mask_tis takes NeMo RL's reference bounds [0.999, 1.002];
// with [0.5, 2] it would almost never trip.
// Bounds: 1 <= cap, 0 <= lo <= 1 <= hi, lo < hi (validate_is_config; 0 is a valid lo, not
// "unset"). Every bound brackets 1 so that on-policy tokens (w = 1) are never truncated.
// "Out of bounds" (IsWeights::oob): tis w > cap or non-finite; icepop w outside [lo, hi] or
// non-finite (NeMo RL counts a non-finite w as kept when lo = 0; we count it, since its weight
// is zeroed all the same); seq_mask_tis every valid token of a masked sequence (and seq_masked
// marks the sequence); none: never.
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

// The config a job gets when it names only the rule: cap 2, [lo, hi] = [0.5, 2], except
// seq_mask_tis, whose [lo, hi] is [0.999, 1.002].
IsConfig default_is_config(IsRule rule);
inline constexpr double kSeqMaskTisDefaultLo = 0.999;
inline constexpr double kSeqMaskTisDefaultHi = 1.002;

// Shape of a padded token batch: B sequences x L positions.
struct TokenLayout {
  int64_t batch = 0;
  int64_t length = 0;
  int64_t size() const { return batch * length; }
};

struct IsWeights {
  std::vector<double> raw;          // [B*L] sanitized w before truncation (0 where mask is 0)
  std::vector<double> truncated;    // [B*L] the weight the loss applies (0 where mask is 0)
  std::vector<uint8_t> oob;         // [B*L] 1 where the token is out of bounds (see above)
  std::vector<uint8_t> seq_masked;  // [B] seq_mask_tis: 1 where the sequence was masked
  int64_t valid_sequences = 0;      // sequences with at least one valid token
};

// Checks sizes (prev, gen, mask all B*L; B, L >= 0) and the config, then applies the rule.
absl::StatusOr<IsWeights> compute_is_weights(std::span<const float> prev_logprobs,
                                             std::span<const float> gen_logprobs,
                                             std::span<const uint8_t> mask, TokenLayout layout,
                                             const IsConfig& config);

// InvalidArgument unless 1 <= cap < inf and 0 <= lo <= 1 <= hi < inf with lo < hi (every rule's
// bounds are checked, used or not); messages start with "<prefix>.cap", "<prefix>.lo",
// "<prefix>.hi" (prefix e.g. "algorithm.is") and give the value.
absl::Status validate_is_config(const IsConfig& config, std::string_view prefix = "is");

}  // namespace fp8rl::rl
