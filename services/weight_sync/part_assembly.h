// One version being uploaded as N parts on N concurrent UploadVersion streams (parallel upload
// from N trainer ranks; docs/design/weight-sync-fanout.md "Parallel upload"). The parts share one
// payload buffer (each writes its own byte range) and one ArrivingVersion; this class holds what
// they agree on: the first part's manifest, which parts have begun and ended, the deadline for the
// missing ones, and the first failure, which fails the whole version for every part.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "fp8rl/v1/weight_sync.pb.h"
#include "services/weight_sync/version_store.h"

namespace fp8rl::weight_sync {

class PartAssembly {
 public:
  // `first` is the manifest of the part that arrived first (validated, part fields checked);
  // `version` the StoredVersion the parts are assembled into (its manifest without part fields)
  // and `arriving` its ArrivingVersion. Every part must begin by `begin_deadline`.
  PartAssembly(const v1::VersionManifest& first, std::shared_ptr<StoredVersion> version,
               std::shared_ptr<ArrivingVersion> arriving,
               std::chrono::steady_clock::time_point begin_deadline);

  int64_t version() const { return stored_->version(); }
  uint32_t part_count() const { return part_count_; }
  uint64_t upload_id() const { return first_.upload_id(); }
  const std::shared_ptr<StoredVersion>& stored() const { return stored_; }
  const std::shared_ptr<ArrivingVersion>& arriving() const { return arriving_; }

  // A part's stream has its manifest: InvalidArgument naming the first field that differs from
  // the first part's manifest ("manifest.tensors[3].crc32c differs from part 0's"), or naming
  // part_index when that part already began; the failure (FAILED_PRECONDITION-wrapped reason)
  // when the version already failed. The caller fails the version on an error.
  absl::Status begin_part(const v1::VersionManifest& manifest);
  // The part ended with all its bytes verified; true when it was the last one (the caller then
  // stores the version and calls complete()).
  bool end_part(uint32_t index);
  // The version was stored (or could not be: `status`); wakes the waiting parts.
  void complete(const absl::Status& status);
  // Records the first failure (later ones are ignored) and wakes the waiting parts; true when
  // this call recorded it (the caller then withdraws the arrival).
  bool fail(const absl::Status& status);
  // The first failure (OK while none).
  absl::Status failure() const;
  bool failed() const { return failed_flag_.load(std::memory_order_acquire); }

  // Waits up to `timeout` for the version to be stored or to fail. kPending: neither yet;
  // kMissingParts: neither, and the begin deadline passed with a part that never began (the
  // caller fails the version with missing_parts_error()).
  enum class Wait { kStored, kFailed, kPending, kMissingParts };
  Wait wait(std::chrono::milliseconds timeout) const;
  absl::Status missing_parts_error() const;

 private:
  const v1::VersionManifest first_;  // part_index cleared, for comparisons
  const uint32_t part_count_;
  const std::shared_ptr<StoredVersion> stored_;
  const std::shared_ptr<ArrivingVersion> arriving_;
  const std::chrono::steady_clock::time_point begin_deadline_;

  // Guards the members below.
  mutable std::mutex mu_;
  // Waits for: the version stored or failed (wait()). Notified by complete() and fail().
  mutable std::condition_variable cv_;
  std::vector<bool> begun_;               // guarded by mu_; by part index
  std::vector<bool> ended_;               // guarded by mu_
  uint32_t ended_count_ = 0;              // guarded by mu_
  bool stored_flag_ = false;              // guarded by mu_
  absl::Status failure_;                  // guarded by mu_
  std::atomic<bool> failed_flag_{false};  // failure_ is set (read per chunk without the lock)
};

}  // namespace fp8rl::weight_sync
