// Retries of the job-store writes a running job cannot do without (a metrics row, the job's step,
// its latest checkpoint, its final state). A store that refuses a write answers UNAVAILABLE (a
// full or read-only disk, an I/O error, a lock held too long: nothing was written, job_store.h)
// and may take the same write a moment later; a write given up on must end the job with a reason
// that names it, never be dropped (docs/design/faults.md "Storage that fails while a job runs").
#pragma once

#include <chrono>
#include <functional>
#include <string_view>

#include "absl/status/status.h"

namespace fp8rl::coordinator {

class CoordinatorMetrics;

struct StoreRetry {
  // How long after the first refusal to keep trying; 0 tries once.
  std::chrono::milliseconds wait{std::chrono::seconds(10)};
  CoordinatorMetrics* metrics = nullptr;  // optional
  std::function<bool()> stop;             // optional: true ends the retries early
};

// Runs `write` until it succeeds, fails with a code other than UNAVAILABLE, `retry.stop` returns
// true or `retry.wait` has passed since the first refusal; between tries it sleeps 100 ms,
// doubling up to 1 s. Every refused try adds 1 to
// fp8rl_coordinator_store_write_failures_total{write=<label>}; the first one logs "job store
// refused a write; retrying". Giving up returns UNAVAILABLE "job store: cannot record <what>
// (refused N times in S s): <last error>"; stopping returns the last error as it was.
// `label` is one of a fixed set ("metrics_row", "step", "checkpoint", "state"); `what` says
// which record ("the metrics row of step 7").
absl::Status retry_store_write(std::string_view label, std::string_view what,
                               const StoreRetry& retry, const std::function<absl::Status()>& write);

}  // namespace fp8rl::coordinator
