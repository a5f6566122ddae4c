// Which workers are alive: workers register (kind, gRPC address, metrics address), heartbeat,
// and deregister; one silent for longer than the expiry is dropped, so the RL loop stops giving
// it work. The coordinator discovers its cluster only through this table.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace fp8rl::coordinator {

enum class WorkerKind { kGeneration, kTrainer, kWeightSync };
std::string_view worker_kind_name(WorkerKind kind);  // "generation", "trainer", "weight_sync"

struct WorkerInfo {
  std::string id;  // unique per registration ("gen-0#3"): a restarted worker gets a new id
  std::string name;
  std::string instance;  // RegisterWorkerRequest.instance: one per process start ("" when unsent)
  WorkerKind kind = WorkerKind::kGeneration;
  std::string address;
  std::string metrics_address;
  int64_t weight_version = 0;
  int queue_depth = 0;
  int64_t registered_ms = 0;
  int64_t last_seen_ms = 0;
};

class WorkerRegistry {
 public:
  using Clock = std::function<int64_t()>;  // milliseconds, monotonic

  explicit WorkerRegistry(std::chrono::milliseconds expiry,
                          std::chrono::milliseconds heartbeat_interval = std::chrono::seconds(1),
                          Clock clock = {});

  // Adds a worker and returns its id. A non-empty `name` already registered is replaced (the
  // old id stops being live). An empty name gets "<kind>-<n>".
  std::string register_worker(WorkerKind kind, const std::string& address,
                              const std::string& metrics_address, const std::string& name,
                              int64_t weight_version, const std::string& instance = "");
  // false when the id is unknown or expired (the worker must register again).
  bool heartbeat(const std::string& id, int64_t weight_version, int queue_depth);
  void deregister(const std::string& id);

  // Live workers of a kind, oldest registration first; expired entries are dropped.
  std::vector<WorkerInfo> live(WorkerKind kind);
  std::optional<WorkerInfo> find(const std::string& id);
  // A trainer group: the first `size` live trainers ordered by name (so "trainer-0" of a
  // StatefulSet is rank 0); empty while fewer are live.
  std::vector<WorkerInfo> trainer_group(int size);
  bool is_live(const std::string& id) { return find(id).has_value(); }
  // Whether the process behind registration `worker` is live: that registration, or a later one
  // with the same name and the same non-empty instance (the same process registered again after
  // it expired, e.g. after a partition). A restarted process (another instance) is not.
  bool is_same_process_live(const WorkerInfo& worker);

  // Called once per expired worker, with mu_ held (it must not call the registry): how the
  // coordinator counts expiries (fp8rl_coordinator_workers_expired_total). Set before use.
  void set_on_expired(std::function<void(WorkerKind)> on_expired) {
    on_expired_ = std::move(on_expired);
  }

  int64_t expiry_ms() const { return expiry_ms_; }
  int64_t heartbeat_interval_ms() const { return heartbeat_interval_ms_; }

 private:
  // Drops the workers silent for longer than the expiry. Caller holds mu_.
  void prune_locked(int64_t now);

  const int64_t expiry_ms_;
  const int64_t heartbeat_interval_ms_;
  Clock clock_;                                 // set in the constructor, then only called
  std::function<void(WorkerKind)> on_expired_;  // set before use, then only called
  std::mutex mu_;
  std::map<std::string, WorkerInfo> workers_;  // guarded by mu_; by id
  uint64_t next_seq_ = 0;                      // guarded by mu_
};

}  // namespace fp8rl::coordinator
