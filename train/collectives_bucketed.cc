// The bucketed all-reduce of train/collectives_bucketed.h: one communication thread per group,
// fed bucket by bucket as the backward finalizes gradients from the end of the array.
#include "train/collectives_bucketed.h"

#include <algorithm>
#include <chrono>
#include <vector>

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
  layout_ = nullptr;
  shard_ = {};
  const auto n = static_cast<int64_t>(data.size());
  buckets_ = (n + bucket_elements_ - 1) / bucket_elements_;
  ready_ = next_ = done_ = 0;
  status_ = absl::OkStatus();
}

void BucketedAllReduce::begin_scatter(std::span<const float> data, const ShardLayout& layout,
                                      std::span<float> shard, std::string what) {
  // The data is only read in this mode (reduce_bucket passes it as the reduce-scatter's input).
  begin(std::span<float>(const_cast<float*>(data.data()), data.size()), std::move(what));
  std::lock_guard<std::mutex> lock(mu_);
  layout_ = &layout;
  shard_ = shard;
  const int rank = group_->rank();
  const bool fits = layout.bounds.size() >= 2 && layout.ranks() == group_->size() &&
                    layout.bounds.front() == 0 && layout.bounds.back() == std::ssize(data) &&
                    std::ssize(shard) == layout.size(rank);
  if (!fits) {
    // Every rank sees the same layout and sizes, so every rank skips the same buckets.
    status_ = absl::InvalidArgumentError(absl::StrCat(
        what_, ": the shard layout (", layout.ranks(), " ranks over ",
        layout.bounds.empty() ? 0 : layout.bounds.back(), " elements) does not fit rank ", rank,
        " of ", group_->size(), " with ", data.size(), " elements and a shard of ", shard.size()));
  }
}

absl::Status reduce_scatter_bucket(Collectives& group, std::span<const float> bucket, int64_t first,
                                   const ShardLayout& layout, std::span<float> shard,
                                   const std::string& what) {
  // Piece r of this bucket: rank r's shard inside [first, end).
  const int64_t end = first + std::ssize(bucket);
  std::vector<int64_t> counts;
  for (int r = 0; r < layout.ranks(); ++r) {
    counts.push_back(
        std::max<int64_t>(0, std::min(end, layout.end(r)) - std::max(first, layout.begin(r))));
  }
  const int rank = group.rank();
  const int64_t mine = counts[static_cast<size_t>(rank)];
  const int64_t at = std::max(first, layout.begin(rank)) - layout.begin(rank);
  const std::span<float> out =
      mine > 0 ? shard.subspan(static_cast<size_t>(at), static_cast<size_t>(mine))
               : std::span<float>();
  return group.reduce_scatter(bucket, out, counts, what);
}

absl::Status BucketedAllReduce::reduce_bucket(std::span<float> bucket, int64_t first,
                                              const ShardLayout* layout, std::span<float> shard,
                                              const std::string& what) {
  if (layout == nullptr) return group_->all_reduce(bucket, ReduceOp::kSum, what);
  return reduce_scatter_bucket(*group_, bucket, first, *layout, shard, what);
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
  layout_ = nullptr;
  shard_ = {};
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
    const ShardLayout* layout = layout_;
    const std::span<float> shard = shard_;
    const bool skip = !status_.ok();
    const std::string what = absl::StrCat(what_, " (bucket ", k + 1, " of ", buckets_, ")");
    lock.unlock();
    absl::Status s = skip ? absl::OkStatus() : reduce_bucket(bucket, first, layout, shard, what);
    lock.lock();
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace fp8rl::train
