// Bookkeeping of a version uploaded in parts (see part_assembly.h).
#include "services/weight_sync/part_assembly.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/weight_sync/payload.h"

namespace fp8rl::weight_sync {
namespace {

v1::VersionManifest without_index(const v1::VersionManifest& m) {
  v1::VersionManifest out = m;
  out.set_part_index(0);
  return out;
}

}  // namespace

PartAssembly::PartAssembly(const v1::VersionManifest& first, std::shared_ptr<StoredVersion> version,
                           std::shared_ptr<ArrivingVersion> arriving,
                           std::chrono::steady_clock::time_point begin_deadline)
    : first_(without_index(first)),
      part_count_(std::max<uint32_t>(first.part_count(), 1)),
      stored_(std::move(version)),
      arriving_(std::move(arriving)),
      begin_deadline_(begin_deadline),
      begun_(part_count_, false),
      ended_(part_count_, false) {}

absl::Status PartAssembly::begin_part(const v1::VersionManifest& manifest) {
  const std::string field = manifest_difference(first_, without_index(manifest));
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) {
    return absl::AbortedError(absl::StrCat("version ", version(), " failed: ", failure_.message()));
  }
  if (!field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest.", field, ": part ", manifest.part_index(), " of version ", version(),
        " differs from the manifest of the first part (every part sends the same manifest)"));
  }
  // part_range() checked the index against part_count, which equals first_'s.
  const uint32_t index = manifest.part_index();
  if (begun_[index]) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.part_index: part ", index,
                                                   " of version ", version(),
                                                   " was already uploaded on another stream"));
  }
  begun_[index] = true;
  return absl::OkStatus();
}

bool PartAssembly::end_part(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index >= part_count_ || ended_[index]) return false;
  ended_[index] = true;
  return ++ended_count_ == part_count_ && failure_.ok();
}

void PartAssembly::complete(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok()) {
      stored_flag_ = true;
    } else if (failure_.ok()) {
      failure_ = status;
      failed_flag_.store(true, std::memory_order_release);
    }
  }
  cv_.notify_all();
}

bool PartAssembly::fail(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok() || stored_flag_) return false;
    failure_ = status;
    failed_flag_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  return true;
}

absl::Status PartAssembly::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

PartAssembly::Wait PartAssembly::wait(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return stored_flag_ || !failure_.ok(); });
  if (stored_flag_) return Wait::kStored;
  if (!failure_.ok()) return Wait::kFailed;
  if (std::chrono::steady_clock::now() >= begin_deadline_) {
    for (bool b : begun_) {
      if (!b) return Wait::kMissingParts;
    }
  }
  return Wait::kPending;
}

absl::Status PartAssembly::missing_parts_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint32_t> missing;
  for (uint32_t i = 0; i < part_count_; ++i) {
    if (!begun_[i]) missing.push_back(i);
  }
  return absl::DeadlineExceededError(absl::StrCat("version ", version(), ": part(s) ",
                                                  absl::StrJoin(missing, ", "), " of ", part_count_,
                                                  " did not begin before the part deadline"));
}

}  // namespace fp8rl::weight_sync
