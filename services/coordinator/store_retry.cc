// Bounded retries of refused job-store writes (see store_retry.h).
#include "services/coordinator/store_retry.h"

#include <algorithm>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/service/log.h"
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {

namespace {
constexpr char kLog[] = "jobs";
}  // namespace

absl::Status retry_store_write(std::string_view label, std::string_view what,
                               const StoreRetry& retry,
                               const std::function<absl::Status()>& write) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  std::chrono::milliseconds pause(100);
  int refusals = 0;
  while (true) {
    absl::Status status = write();
    if (status.ok() || status.code() != absl::StatusCode::kUnavailable) return status;
    ++refusals;
    if (retry.metrics != nullptr) {
      retry.metrics->store_write_failures->with({std::string(label)}).inc();
    }
    if (refusals == 1) {
      service::log_warn(kLog, "job store refused a write; retrying",
                        {{"write", std::string(what)},
                         {"error", std::string(status.message())},
                         {"retry_seconds", absl::StrCat(retry.wait.count() / 1000.0)}});
    }
    const Clock::duration spent = Clock::now() - start;
    if ((retry.stop && retry.stop()) || spent + pause > retry.wait) {
      if (retry.stop && retry.stop()) return status;
      std::string reason(status.message());
      if (reason.starts_with("job store: ")) reason.erase(0, 11);
      const std::string message = absl::StrFormat(
          "job store: cannot record %s (refused %d time%s in %.1f s): %s", what, refusals,
          refusals == 1 ? "" : "s", std::chrono::duration<double>(spent).count(), reason);
      service::log_error(kLog, "job store write given up", {{"error", message}});
      return absl::UnavailableError(message);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(1));
  }
}

}  // namespace fp8rl::coordinator
