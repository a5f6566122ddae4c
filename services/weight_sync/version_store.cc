// Bounded in-memory version store with blocking waits (see version_store.h).
#include "services/weight_sync/version_store.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace fp8rl::weight_sync {

VersionStore::VersionStore(int keep) : keep_(static_cast<size_t>(std::max(keep, 1))) {}

absl::Status VersionStore::add(StoredVersionPtr version) {
  if (version == nullptr) return absl::InvalidArgumentError("version store: null version");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!versions_.empty() && version->version() <= versions_.back()->version()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest.version: ", version->version(), " is not newer than the latest stored version ",
          versions_.back()->version()));
    }
    if (arriving_ != nullptr && arriving_->version() <= version->version()) arriving_.reset();
    versions_.push_back(std::move(version));
    while (versions_.size() > keep_) versions_.pop_front();
  }
  cv_.notify_all();
  return absl::OkStatus();
}

StoredVersionPtr VersionStore::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return versions_.empty() ? nullptr : versions_.back();
}

int64_t VersionStore::arriving_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return arriving_ != nullptr ? arriving_->version() : 0;
}

int64_t VersionStore::latest_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return versions_.empty() ? 0 : versions_.back()->version();
}

StoredVersionPtr VersionStore::get(int64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const StoredVersionPtr& v : versions_) {
    if (v->version() == version) return v;
  }
  return nullptr;
}

std::vector<int64_t> VersionStore::versions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  for (const StoredVersionPtr& v : versions_) out.push_back(v->version());
  return out;
}

StoredVersionPtr VersionStore::wait_newer(int64_t held, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(lock, timeout, [&] {
    return closed_ || (!versions_.empty() && versions_.back()->version() > held);
  });
  if (!ready || closed_) return nullptr;
  return versions_.back();
}

void ArrivingVersion::add_ready(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The last byte waits for finish(true): the upload can still be refused after its last chunk
    // (a message beyond the end, a store that took a newer version, a part that never came), and
    // no worker may complete a version that is not stored.
    const uint64_t total = version_->payload.size();
    const uint64_t cap = total > 0 ? total - 1 : 0;
    if (begin <= ready_) {
      ready_ = std::max(ready_, std::min(end, cap));
    } else {
      // Merge [begin, end) with the ranges it touches.
      auto it = ranges_.upper_bound(begin);
      if (it != ranges_.begin() && std::prev(it)->second >= begin) {
        --it;
        begin = it->first;
      }
      while (it != ranges_.end() && it->first <= end) {
        end = std::max(end, it->second);
        it = ranges_.erase(it);
      }
      ranges_.emplace(begin, end);
    }
    // Ranges the prefix now reaches join it.
    for (auto it = ranges_.begin(); it != ranges_.end() && it->first <= ready_;) {
      ready_ = std::max(ready_, std::min(it->second, cap));
      it = ranges_.erase(it);
    }
  }
  cv_.notify_all();
}

void ArrivingVersion::finish(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kArriving) return;
    state_ = ok ? State::kComplete : State::kFailed;
    if (ok) ready_ = version_->payload.size();
  }
  cv_.notify_all();
}

ArrivingVersion::State ArrivingVersion::wait(uint64_t bytes, std::chrono::milliseconds timeout,
                                             uint64_t* ready) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return ready_ >= bytes || state_ != State::kArriving; });
  *ready = ready_;
  return state_;
}

void VersionStore::begin_arrival(std::shared_ptr<ArrivingVersion> arriving) {
  if (arriving == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!versions_.empty() && arriving->version() <= versions_.back()->version()) return;
    if (arriving_ != nullptr && arriving_->version() >= arriving->version()) return;
    arriving_ = std::move(arriving);
  }
  cv_.notify_all();
}

void VersionStore::end_arrival(const ArrivingVersion* arriving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (arriving_.get() == arriving) arriving_.reset();
}

VersionStore::Newer VersionStore::wait_newer_or_arriving(int64_t held,
                                                         std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(lock, timeout, [&] {
    return closed_ || (!versions_.empty() && versions_.back()->version() > held) ||
           (arriving_ != nullptr && arriving_->version() > held);
  });
  if (!ready || closed_) return {};
  if (arriving_ != nullptr && arriving_->version() > held) return {nullptr, arriving_};
  return {versions_.back(), nullptr};
}

void VersionStore::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool VersionStore::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace fp8rl::weight_sync
