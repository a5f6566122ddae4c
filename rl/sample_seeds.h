// Sampling seeds of the RL loop's generation requests (docs/design/rl-step.md "The RL step", steps
// 1-2 and 8): a pure function of (job seed, step, prompt, sample), so a re-dispatched sample or a
// resumed job draws the same tokens, and the samples of one job never share a seed.
#pragma once

#include <cstdint>

namespace fp8rl::rl {

// Seed of sample `sample` of prompt `prompt` in the rollout of RL step `step` (>= 1):
// splitmix64 folded over the four values, job_seed first.
uint64_t sample_seed(uint64_t job_seed, int64_t step, int64_t prompt, int64_t sample);

// Seed of validation prompt `prompt` in the validation after step `step` (0: before training).
// It is sample_seed at the pseudo-step -(step + 1): negative, so no validation seed repeats a
// rollout's (their steps are >= 1). Validation decodes greedily today, so the seed only matters
// once a validation temperature exists; it is fixed so that change keeps old runs reproducible.
uint64_t validation_sample_seed(uint64_t job_seed, int64_t step, int64_t prompt);

}  // namespace fp8rl::rl
