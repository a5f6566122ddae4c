// The service's memory: the latest K complete, verified versions, each held once and shared (by
// shared_ptr) with every Subscribe stream that is sending it, so memory stays bounded by K versions
// plus the ones still being streamed. Subscribe handlers block here until a newer version arrives.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fp8rl/v1/weight_sync.pb.h"

namespace fp8rl::weight_sync {

// One complete version; immutable once stored.
struct StoredVersion {
  v1::VersionManifest manifest;
  std::string payload;
  std::chrono::steady_clock::time_point arrived;
  int64_t version() const { return manifest.version(); }
};
using StoredVersionPtr = std::shared_ptr<const StoredVersion>;

class VersionStore {
 public:
  // Keeps the newest `keep` versions (>= 1).
  explicit VersionStore(int keep);

  // Adds a version newer than every stored one (InvalidArgument otherwise), evicting the oldest
  // beyond `keep`, and wakes every waiter.
  absl::Status add(StoredVersionPtr version);

  // Newest version (nullptr when none) and its number (0 when none).
  StoredVersionPtr latest() const;
  int64_t latest_version() const;
  // A stored version or nullptr.
  StoredVersionPtr get(int64_t version) const;
  // Stored version numbers, oldest first.
  std::vector<int64_t> versions() const;

  // Waits until a version newer than `held` is stored (returns it), the store is closed or
  // `timeout` passes (both return nullptr).
  StoredVersionPtr wait_newer(int64_t held, std::chrono::milliseconds timeout) const;

  // Wakes every waiter; later waits return nullptr at once. For shutdown.
  void close();
  bool closed() const;

 private:
  const size_t keep_;
  // Guards versions_ and closed_.
  mutable std::mutex mu_;
  // Waits for (wait_newer()): a version newer than the caller's, or closed_. Notified by add()
  // and close().
  mutable std::condition_variable cv_;
  std::deque<StoredVersionPtr> versions_;  // guarded by mu_; oldest first
  bool closed_ = false;                    // guarded by mu_
};

}  // namespace fp8rl::weight_sync
