// Worker versions and push latency bookkeeping (see worker_table.h).
#include "services/weight_sync/worker_table.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::weight_sync {

void WorkerTable::stream_opened(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerState& w = workers_[worker_id];
  w.worker_id = worker_id;
  ++w.open_streams;
}

std::optional<double> WorkerTable::stream_closed(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  if (it->second.open_streams > 0) --it->second.open_streams;
  if (it->second.open_streams == 0 && pending_workers_.erase(worker_id) > 0) {
    return maybe_complete_locked();
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<double>> WorkerTable::ack(const std::string& worker_id,
                                                       int64_t version, bool ok,
                                                       const std::string& error, int64_t unix_ms,
                                                       Clock::time_point now) {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker_id: empty");
  if (version <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("version: must be > 0, got ", version));
  }
  std::lock_guard<std::mutex> lock(mu_);
  WorkerState& w = workers_[worker_id];
  w.worker_id = worker_id;
  if (!ok) {
    w.last_error = error.empty() ? "rejected without a reason" : error;
    return std::optional<double>();
  }
  w.last_error.clear();
  if (version > w.version) {
    w.version = version;
    w.acked_unix_ms = unix_ms;
  }
  if (pending_version_ > 0 && version >= pending_version_ &&
      pending_workers_.erase(worker_id) > 0) {
    pending_last_ack_ = now;
    return maybe_complete_locked();
  }
  return std::optional<double>();
}

void WorkerTable::published(int64_t version, Clock::time_point arrived) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_version_ = version;
  pending_arrived_ = arrived;
  pending_last_ack_.reset();
  pending_workers_.clear();
  for (const auto& [id, w] : workers_) {
    if (w.open_streams > 0 && w.version < version) pending_workers_.insert(id);
  }
  if (pending_workers_.empty()) pending_version_ = 0;  // nobody to push to
}

std::optional<double> WorkerTable::maybe_complete_locked() {
  if (pending_version_ == 0 || !pending_workers_.empty()) return std::nullopt;
  pending_version_ = 0;
  if (!pending_last_ack_) return std::nullopt;  // every worker left without acknowledging
  return std::chrono::duration<double>(*pending_last_ack_ - pending_arrived_).count();
}

std::vector<WorkerState> WorkerTable::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerState> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

int WorkerTable::subscribed_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [id, w] : workers_) n += w.open_streams > 0 ? 1 : 0;
  return n;
}

}  // namespace fp8rl::weight_sync
