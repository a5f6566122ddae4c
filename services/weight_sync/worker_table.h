// Which generation worker holds which weight version: open Subscribe streams and acknowledgements
// per worker (GetStatus, fp8rl_weight_sync_worker_version), and how long each version took from
// its arrival until every worker subscribed at that moment acknowledged it (push latency).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl::weight_sync {

struct WorkerState {
  std::string worker_id;
  int64_t version = 0;        // last version acknowledged with ok
  int64_t acked_unix_ms = 0;  // when (0: never)
  int open_streams = 0;       // open Subscribe streams
  std::string last_error;     // last rejection reported by the worker ("" when none)
};

class WorkerTable {
 public:
  using Clock = std::chrono::steady_clock;

  void stream_opened(const std::string& worker_id);
  // Returns the push latency of the newest published version when this worker was the last one
  // it was waiting for (see published()).
  std::optional<double> stream_closed(const std::string& worker_id);

  // Records an acknowledgement. InvalidArgument for an empty worker id or a version <= 0.
  // Returns the push latency in seconds when this ack completes the newest published version.
  absl::StatusOr<std::optional<double>> ack(const std::string& worker_id, int64_t version, bool ok,
                                            const std::string& error, int64_t unix_ms,
                                            Clock::time_point now);

  // A new version arrived: its push completes when every worker with an open stream now has
  // acknowledged it (or a newer one) or disconnected. Replaces any earlier pending version.
  void published(int64_t version, Clock::time_point arrived);

  std::vector<WorkerState> snapshot() const;
  // Workers with at least one open Subscribe stream.
  int subscribed_workers() const;

 private:
  std::optional<double> maybe_complete_locked();  // mu_ held

  // std::mutex, not absl::Mutex: ThreadSanitizer sees a std::mutex (through its pthread
  // interceptors) but not the locking inside Debian's uninstrumented abseil library.
  mutable std::mutex mu_;  // guards every member below
  std::map<std::string, WorkerState> workers_;
  // The pending push: version, arrival, workers still to acknowledge.
  int64_t pending_version_ = 0;
  Clock::time_point pending_arrived_;
  std::optional<Clock::time_point> pending_last_ack_;
  std::set<std::string> pending_workers_;
};

}  // namespace fp8rl::weight_sync
