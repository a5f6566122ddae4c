// Heartbeat-based worker table (see worker_registry.h).
#include "services/coordinator/worker_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/service/log.h"

namespace fp8rl::coordinator {

std::string_view worker_kind_name(WorkerKind kind) {
  switch (kind) {
    case WorkerKind::kGeneration:
      return "generation";
    case WorkerKind::kTrainer:
      return "trainer";
    case WorkerKind::kWeightSync:
      return "weight_sync";
  }
  return "generation";
}

WorkerRegistry::WorkerRegistry(std::chrono::milliseconds expiry,
                               std::chrono::milliseconds heartbeat_interval, Clock clock)
    : expiry_ms_(expiry.count()),
      heartbeat_interval_ms_(heartbeat_interval.count()),
      clock_(std::move(clock)) {
  if (!clock_) {
    clock_ = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
}

std::string WorkerRegistry::register_worker(WorkerKind kind, const std::string& address,
                                            const std::string& metrics_address,
                                            const std::string& name, int64_t weight_version,
                                            const std::string& instance) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_();
  const uint64_t seq = next_seq_++;
  WorkerInfo info;
  info.kind = kind;
  info.name = name.empty() ? absl::StrCat(std::string(worker_kind_name(kind)), "-", seq) : name;
  info.id = absl::StrCat(info.name, "#", seq);
  info.instance = instance;
  info.address = address;
  info.metrics_address = metrics_address;
  info.weight_version = weight_version;
  info.registered_ms = info.last_seen_ms = now;
  std::erase_if(workers_, [&](const auto& entry) {
    return entry.second.name == info.name || entry.second.address == address;
  });
  workers_[info.id] = info;
  return info.id;
}

bool WorkerRegistry::heartbeat(const std::string& id, int64_t weight_version, int queue_depth) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_();
  prune_locked(now);
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  it->second.last_seen_ms = now;
  it->second.weight_version = weight_version;
  it->second.queue_depth = queue_depth;
  return true;
}

void WorkerRegistry::deregister(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_.erase(id);
}

std::vector<WorkerInfo> WorkerRegistry::live(WorkerKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  prune_locked(clock_());
  std::vector<WorkerInfo> out;
  for (const auto& [id, info] : workers_) {
    if (info.kind == kind) out.push_back(info);
  }
  std::sort(out.begin(), out.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    return a.registered_ms != b.registered_ms ? a.registered_ms < b.registered_ms : a.id < b.id;
  });
  return out;
}

std::optional<WorkerInfo> WorkerRegistry::find(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  prune_locked(clock_());
  auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  return it->second;
}

bool WorkerRegistry::is_same_process_live(const WorkerInfo& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  prune_locked(clock_());
  if (workers_.contains(worker.id)) return true;
  if (worker.instance.empty()) return false;
  return std::any_of(workers_.begin(), workers_.end(), [&](const auto& entry) {
    const WorkerInfo& info = entry.second;
    return info.kind == worker.kind && info.name == worker.name && info.instance == worker.instance;
  });
}

void WorkerRegistry::prune_locked(int64_t now) {
  std::erase_if(workers_, [&](const auto& entry) {
    const WorkerInfo& info = entry.second;
    if (now - info.last_seen_ms <= expiry_ms_) return false;
    // One line per expiry: the only sign of a hung or cut-off worker whose sockets stay open.
    service::log_warn("registry", "worker expired: no heartbeat within the expiry",
                      {{"worker", info.id},
                       {"kind", std::string(worker_kind_name(info.kind))},
                       {"address", info.address},
                       {"silent_ms", absl::StrCat(now - info.last_seen_ms)}});
    if (on_expired_) on_expired_(info.kind);
    return true;
  });
}

std::vector<WorkerInfo> WorkerRegistry::trainer_group(int size) {
  std::vector<WorkerInfo> trainers = live(WorkerKind::kTrainer);
  if (size < 1 || std::ssize(trainers) < size) return {};
  std::stable_sort(trainers.begin(), trainers.end(),
                   [](const WorkerInfo& a, const WorkerInfo& b) { return a.name < b.name; });
  trainers.resize(static_cast<size_t>(size));
  return trainers;
}

}  // namespace fp8rl::coordinator
