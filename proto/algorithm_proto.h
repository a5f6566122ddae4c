// The one proto <-> struct converter of the algorithm parameters: the job config's algorithm.*
// section (rl/job_config.h) to v1::OptimizerParams / v1::AlgorithmParams, and the IS rule both
// ways. Field names are the job config's keys (is.rule -> is_rule, is.lo -> is_lo, ...).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "fp8rl/v1/trainer.pb.h"
#include "rl/importance.h"
#include "rl/job_config.h"

namespace fp8rl {

v1::ImportanceSamplingRule is_rule_to_proto(rl::IsRule rule);
// IS_RULE_UNSPECIFIED is tis (the job config's default); InvalidArgument
// "algorithm.is_rule: unknown rule N" for a value this build does not know.
absl::StatusOr<rl::IsRule> is_rule_from_proto(v1::ImportanceSamplingRule rule);

// The rule and the bounds it uses: tis sends is_cap, icepop and seq_mask_tis send is_lo / is_hi.
void is_config_to_proto(const rl::IsConfig& is, v1::AlgorithmParams* params);
// tis reads is_cap, or is_hi from a sender that predates is_cap; an unset hi/cap takes the rule's
// default (rl::default_is_config). InvalidArgument names the field (negative or non-finite bound,
// a config rl::validate_is_config rejects).
absl::StatusOr<rl::IsConfig> is_config_from_proto(const v1::AlgorithmParams& params);

v1::OptimizerParams optimizer_to_proto(const rl::AlgorithmConfig& algorithm);
// RL step `step` (1-based): its learning rate is rl::learning_rate_at(algorithm, step).
v1::AlgorithmParams algorithm_to_proto(const rl::AlgorithmConfig& algorithm, int64_t step);

}  // namespace fp8rl
