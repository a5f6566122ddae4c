// Upper bounds (and the lower bounds they pair with) for the numeric fields of a job config, so
// an absurd value is a submission error naming the field ("algorithm.learning_rate: must be in
// (0, 1], got 9.2e+18") instead of a job that diverges or never ends. validate_job_config runs
// these after its own rules; docs/guide.md "Job config reference" lists them.
#pragma once

#include "absl/status/status.h"
#include "rl/job_config.h"

namespace fp8rl::rl {

// The sane ranges (inclusive unless noted) of the numeric fields that have no tight rule of
// their own; exposed so tests and docs can enumerate them.
struct NumericLimit {
  const char* field;
  double lo;
  double hi;
  bool lo_open;  // true: lo itself is not allowed ("(0, 1]")
};
inline constexpr NumericLimit kJobNumericLimits[] = {
    {"algorithm.steps", 1, 1e6, false},
    {"algorithm.prompts_per_step", 1, 65536, false},
    {"algorithm.samples_per_prompt", 2, 1024, false},
    {"algorithm.temperature", 0, 100, true},
    {"algorithm.learning_rate", 0, 1, true},
    {"algorithm.warmup_steps", 0, 1e6, false},
    {"algorithm.weight_decay", 0, 10, false},
    {"algorithm.max_grad_norm", 0, 1e6, false},
    {"algorithm.kl_beta", 0, 100, false},
    {"algorithm.adam_epsilon", 0, 1, true},
    {"sft.steps", 1, 1e6, false},
    {"sft.learning_rate", 0, 1, true},
    {"sft.batch_size", 1, 65536, false},
    {"precision.bf16_first_layers", 0, 1024, false},
    {"precision.bf16_last_layers", 0, 1024, false},
    {"validation.every_steps", 0, 1e6, false},
    {"validation.num_prompts", 0, 1e6, false},
    {"checkpoint.every_steps", 0, 1e6, false},
};

// InvalidArgument naming the first field of kJobNumericLimits outside its range (NaN included).
absl::Status validate_job_limits(const JobConfig& config);

}  // namespace fp8rl::rl
