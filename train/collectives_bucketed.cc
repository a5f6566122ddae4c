// The bucketed all-reduce of train/collectives_bucketed.h: one communication thread per group,
// fed bucket by bucket as the backward finalizes gradients from the end of the array.
#include "train/collectives_bucketed.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace fp8rl::train {

BucketedAllReduce::BucketedAllReduce(Collectives* group, int64_t bucket_elements)
    : group_(group),
      bucket_elements_(std::max<int64_t>(1, bucket_elements)),
      thread_([this] { run(); }) {}

BucketedAllReduce::~BucketedAllReduce() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BucketedAllReduce::begin(std::span<float> data, std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  data_ = data;
  what_ = std::move(what);
  const auto n = static_cast<int64_t>(data.size());
  buckets_ = (n + bucket_elements_ - 1) / bucket_elements_;
  ready_ = next_ = done_ = 0;
  status_ = absl::OkStatus();
}

void BucketedAllReduce::final_from(int64_t from) {
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto n = static_cast<int64_t>(data_.size());
    // Bucket k is final when its first element max(0, n - (k + 1) B) >= from.
    while (ready_ < buckets_ && std::max<int64_t>(0, n - (ready_ + 1) * bucket_elements_) >= from) {
      ++ready_;
      more = true;
    }
  }
  if (more) cv_.notify_all();
}

absl::Status BucketedAllReduce::finish() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  ready_ = buckets_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return done_ == buckets_; });
  last_wait_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  data_ = {};
  return status_;
}

void BucketedAllReduce::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || next_ < ready_; });
    if (next_ >= ready_) return;  // stop_ with nothing left
    const int64_t k = next_++;
    const auto n = static_cast<int64_t>(data_.size());
    const int64_t end = n - k * bucket_elements_;
    const int64_t first = std::max<int64_t>(0, end - bucket_elements_);
    const std::span<float> bucket =
        data_.subspan(static_cast<size_t>(first), static_cast<size_t>(end - first));
    const bool skip = !status_.ok();
    const std::string what = absl::StrCat(what_, " (bucket ", k + 1, " of ", buckets_, ")");
    lock.unlock();
    absl::Status s = skip ? absl::OkStatus() : group_->all_reduce(bucket, ReduceOp::kSum, what);
    lock.lock();
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace fp8rl::train
