// The service's memory: the latest K complete, verified versions, each held once and shared (by
// shared_ptr) with every Subscribe stream that is sending it, so memory stays bounded by K versions
// plus the ones still being streamed. Subscribe handlers block here until a newer version arrives,
// or starts arriving: a version being uploaded is announced as an ArrivingVersion, whose received
// prefix Subscribe streams push on while the rest of the upload comes in (cut-through).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
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

// A version while its upload is being received. Its StoredVersion (manifest, payload storage of
// the final size) is fixed from the start and becomes the stored version when the upload
// completes. The upload marks byte ranges final as they land (every tensor ending in them passed
// its CRC-32C): a single-part upload one growing prefix (advance), a parallel upload one range
// per part, landing in any order (add_ready). Readers forward in payload order, so what they may
// read is the prefix [0, ready): the lowest missing range holds them up. The last byte becomes
// ready only when the version is stored (finish(true)), so a reader never completes a version
// whose upload was refused at its end.
class ArrivingVersion {
 public:
  enum class State { kArriving, kComplete, kFailed };

  // `version`'s payload has its final size; the upload writes it through `data`.
  ArrivingVersion(StoredVersionPtr version, char* data)
      : version_(std::move(version)), data_(data) {}
  int64_t version() const { return version_->version(); }
  uint64_t total_bytes() const { return version_->payload.size(); }
  const StoredVersionPtr& stored() const { return version_; }
  char* data() const { return data_; }  // the upload's write pointer

  // The upload's side: bytes [0, min(ready, total - 1)) are final; then complete (stored: all of
  // it) or failed.
  void advance(uint64_t ready) { add_ready(0, ready); }
  // Bytes [begin, end) are final (ranges may arrive in any order, touch or repeat).
  void add_ready(uint64_t begin, uint64_t end);
  void finish(bool ok);

  // Waits up to `timeout` for ready >= bytes or the end of the upload; returns the state then and
  // the ready byte count in *ready.
  State wait(uint64_t bytes, std::chrono::milliseconds timeout, uint64_t* ready) const;

 private:
  const StoredVersionPtr version_;
  char* const data_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // notified by advance() and finish()
  uint64_t ready_ = 0;                  // guarded by mu_; the final prefix readers may read
  // Guarded by mu_: final ranges past the prefix, begin -> end, disjoint and not touching.
  std::map<uint64_t, uint64_t> ranges_;
  State state_ = State::kArriving;  // guarded by mu_
};

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
  // The version announced by begin_arrival() and not yet stored or withdrawn (0 when none).
  int64_t arriving_version() const;
  // A stored version or nullptr.
  StoredVersionPtr get(int64_t version) const;
  // Stored version numbers, oldest first.
  std::vector<int64_t> versions() const;

  // Waits until a version newer than `held` is stored (returns it), the store is closed or
  // `timeout` passes (both return nullptr).
  StoredVersionPtr wait_newer(int64_t held, std::chrono::milliseconds timeout) const;

  // An upload has started (its manifest passed the checks): waiters of wait_newer_or_arriving()
  // may push it while it arrives. The newest announced arrival is kept until add() stores it (or
  // a newer version) or end_arrival() withdraws it (the upload failed).
  void begin_arrival(std::shared_ptr<ArrivingVersion> arriving);
  void end_arrival(const ArrivingVersion* arriving);

  // wait_newer(), and also returns when a version newer than both `held` and every stored one is
  // arriving: then `arriving` is set and `stored` is null. Both null: closed or timed out.
  struct Newer {
    StoredVersionPtr stored;
    std::shared_ptr<ArrivingVersion> arriving;
  };
  Newer wait_newer_or_arriving(int64_t held, std::chrono::milliseconds timeout) const;

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
  std::deque<StoredVersionPtr> versions_;      // guarded by mu_; oldest first
  std::shared_ptr<ArrivingVersion> arriving_;  // guarded by mu_; newer than versions_.back()
  bool closed_ = false;                        // guarded by mu_
};

}  // namespace fp8rl::weight_sync
