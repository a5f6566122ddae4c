// The staleness rule of asynchronous RL (docs/design/rl-step.md "Asynchronous RL"): with
// algorithm.max_staleness = K >= 1, the rollout of step s may be generated once the version
// published after step s-1-K exists, and a train step uses a sample only when the version it was
// generated with is at most K behind the version being trained; older samples are regenerated
// (never dropped: a GRPO group needs all of its G samples for its baseline, and the trainer's
// batch keeps its shape). Pure functions, so the rule is tested without workers.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::rl {

// The step whose published version the rollout of `step` must be generated with, at least:
// step - 1 - max_staleness (<= the first step of a run means the run's first version).
int64_t staleness_gate_step(int64_t step, int64_t max_staleness);

// What one train step does with its samples.
struct StalenessVerdict {
  std::vector<size_t> used;        // indices of samples at most max_staleness behind
  std::vector<size_t> regenerate;  // indices of older samples (to be generated again)
  // staleness (trained_version - sample version) -> number of used samples.
  std::map<int64_t, int64_t> histogram;
  int64_t max_used = 0;  // the largest staleness among the used samples
};

// Sorts samples by staleness = trained_version - sample_versions[i]. InvalidArgument when
// max_staleness < 0, FailedPrecondition when a sample claims a version newer than the trained
// one (no such version exists yet: a bookkeeping error, never trained on).
absl::StatusOr<StalenessVerdict> apply_staleness_bound(std::span<const int64_t> sample_versions,
                                                       int64_t trained_version,
                                                       int64_t max_staleness);

}  // namespace fp8rl::rl
