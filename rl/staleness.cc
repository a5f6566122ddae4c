// The staleness rule of asynchronous RL (see staleness.h).
#include "rl/staleness.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fp8rl::rl {

int64_t staleness_gate_step(int64_t step, int64_t max_staleness) {
  return step - 1 - max_staleness;
}

absl::StatusOr<StalenessVerdict> apply_staleness_bound(std::span<const int64_t> sample_versions,
                                                       int64_t trained_version,
                                                       int64_t max_staleness) {
  if (max_staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness: must be >= 0, got ", max_staleness));
  }
  StalenessVerdict out;
  for (size_t i = 0; i < sample_versions.size(); ++i) {
    const int64_t staleness = trained_version - sample_versions[i];
    if (staleness < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("sample ", i, " was generated with weight version ", sample_versions[i],
                       ", newer than the trained version ", trained_version));
    }
    if (staleness > max_staleness) {
      out.regenerate.push_back(i);
      continue;
    }
    out.used.push_back(i);
    ++out.histogram[staleness];
    out.max_used = std::max(out.max_used, staleness);
  }
  return out;
}

}  // namespace fp8rl::rl
