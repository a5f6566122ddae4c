// The bucket pool of train/gradient_buckets.h: buffers handed to the backward per bucket, one
// communication thread reduce-scattering the final buckets in order and giving their buffers back.
#include "train/gradient_buckets.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "train/collectives_bucketed.h"

namespace fp8rl::train {

int64_t CollectiveOrder::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_++;
}

void CollectiveOrder::wait_turn(int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return serving_ == ticket; });
}

void CollectiveOrder::done() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++serving_;
  }
  cv_.notify_all();
}

std::vector<GradientBuckets::Bucket> GradientBuckets::cut(const model::ParamLayout& params,
                                                          int64_t bucket_elements) {
  const int64_t limit = std::max<int64_t>(1, bucket_elements);
  std::vector<int64_t> starts;  // tensor offsets, ascending
  for (const model::ParamInfo& p : params.params()) starts.push_back(p.offset);
  std::sort(starts.begin(), starts.end());
  std::vector<Bucket> out;
  int64_t end = params.total();
  Bucket cur{end, end};
  // From the last tensor to the first: a tensor joins the open bucket while the bucket stays
  // within the limit; otherwise the open bucket closes at the tensor's end.
  for (auto it = starts.rbegin(); it != starts.rend(); ++it) {
    const int64_t start = *it;
    if (cur.end > cur.first && cur.end - start > limit) {
      out.push_back(cur);
      cur = Bucket{cur.first, cur.first};
    }
    cur.first = start;
  }
  if (cur.end > cur.first || out.empty()) {
    cur.first = 0;
    out.push_back(cur);
  } else {
    out.back().first = 0;
  }
  return out;
}

GradientBuckets::GradientBuckets(Collectives* group, const ShardLayout& layout,
                                 const model::ParamLayout& params, int64_t bucket_elements)
    : group_(group),
      layout_(layout),
      total_(params.total()),
      chunk_(std::max<int64_t>(1, bucket_elements)),
      buckets_(cut(params, bucket_elements)),
      thread_([this] { run(); }) {}

GradientBuckets::~GradientBuckets() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GradientBuckets::begin(std::span<float> shard, std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  shard_ = shard;
  what_ = std::move(what);
  buffers_.clear();
  free_.clear();
  holder_.assign(buckets_.size(), -1);
  ticket_.assign(buckets_.size(), -1);
  bytes_ = peak_bytes_ = 0;
  ready_ = next_ = done_ = 0;
  active_ = true;
  status_ = misuse_ = absl::OkStatus();
  const int rank = group_->rank();
  const bool fits = layout_.bounds.size() >= 2 && layout_.ranks() == group_->size() &&
                    layout_.bounds.front() == 0 && layout_.bounds.back() == total_ &&
                    std::ssize(shard) == layout_.size(rank);
  if (!fits) {
    // Every rank sees the same layout and sizes, so every rank skips the same buckets.
    status_ = absl::InvalidArgumentError(absl::StrCat(
        what_, ": the shard layout (", layout_.ranks(), " ranks over ",
        layout_.bounds.empty() ? 0 : layout_.bounds.back(), " elements) does not fit rank ", rank,
        " of ", group_->size(), " with ", total_, " parameters and a shard of ", shard.size()));
  }
}

int64_t GradientBuckets::bucket_of(int64_t offset) const {
  // Buckets descend: bucket k's first is above bucket k + 1's. The first bucket whose first <=
  // offset.
  auto it = std::partition_point(buckets_.begin(), buckets_.end(),
                                 [offset](const Bucket& b) { return b.first > offset; });
  return it - buckets_.begin();
}

int GradientBuckets::acquire_locked(int64_t k, bool may_wait, std::unique_lock<std::mutex>& lock) {
  const auto size = static_cast<size_t>(buckets_[k].end - buckets_[k].first);
  for (;;) {
    if (!free_.empty()) {
      // The smallest free buffer that holds the bucket, else the largest (it grows).
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        const size_t cap = buffers_[*it].capacity();
        if (best == free_.end()) {
          best = it;
          continue;
        }
        const size_t best_cap = buffers_[*best].capacity();
        const bool fits = cap >= size, best_fits = best_cap >= size;
        if ((fits && (!best_fits || cap < best_cap)) || (!fits && !best_fits && cap > best_cap)) {
          best = it;
        }
      }
      const int i = *best;
      free_.erase(best);
      std::vector<float>& buf = buffers_[static_cast<size_t>(i)];
      const auto before = static_cast<int64_t>(buf.capacity());
      buf.assign(size, 0.0f);
      bytes_ +=
          (static_cast<int64_t>(buf.capacity()) - before) * static_cast<int64_t>(sizeof(float));
      peak_bytes_ = std::max(peak_bytes_, bytes_);
      return i;
    }
    // A bucket in flight gives its buffer back without the backward going on; otherwise waiting
    // could never end (the buckets the backward holds are not final yet).
    if (may_wait && ready_ > done_) {
      cv_.wait(lock);
      continue;
    }
    buffers_.emplace_back(size, 0.0f);
    bytes_ += static_cast<int64_t>(buffers_.back().capacity() * sizeof(float));
    peak_bytes_ = std::max(peak_bytes_, bytes_);
    return static_cast<int>(buffers_.size()) - 1;
  }
}

float* GradientBuckets::grad(int64_t offset) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t k = bucket_of(offset);
  if (!active_ || offset < 0 || offset >= total_ || k < ready_) {
    // Not a bug a caller can recover from here: keep the backward running on scratch storage and
    // fail the reduction (finish) instead of writing into a buffer being sent.
    if (misuse_.ok()) {
      misuse_ =
          absl::InternalError(absl::StrCat(what_, ": the gradient of parameter offset ", offset,
                                           active_ ? " was asked for after its bucket was final"
                                                   : " was asked for outside a backward"));
    }
    scratch_.assign(static_cast<size_t>(total_), 0.0f);
    return scratch_.data() + std::clamp<int64_t>(offset, 0, total_);
  }
  const Bucket& b = buckets_[static_cast<size_t>(k)];
  int& holder = holder_[static_cast<size_t>(k)];
  if (holder < 0) holder = acquire_locked(k, /*may_wait=*/true, lock);
  return buffers_[static_cast<size_t>(holder)].data() + (offset - b.first);
}

void GradientBuckets::final_from(int64_t from) {
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t upto = ready_;
    while (upto < std::ssize(buckets_) && buckets_[static_cast<size_t>(upto)].first >= from) {
      ++upto;
    }
    more = upto > ready_;
    ready_locked(upto);
  }
  if (more) cv_.notify_all();
}

absl::Status GradientBuckets::finish() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  ready_locked(std::ssize(buckets_));
  cv_.notify_all();
  cv_.wait(lock, [&] { return done_ == std::ssize(buckets_); });
  last_wait_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  last_peak_bytes_ = peak_bytes_;
  buffers_.clear();
  buffers_.shrink_to_fit();
  free_.clear();
  scratch_ = {};
  bytes_ = 0;
  shard_ = {};
  active_ = false;
  return status_.ok() ? misuse_ : status_;
}

void GradientBuckets::ready_locked(int64_t upto) {
  for (; ready_ < upto; ++ready_) {
    if (order_ != nullptr) ticket_[static_cast<size_t>(ready_)] = order_->take();
  }
}

void GradientBuckets::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ == ready_; });
}

void GradientBuckets::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || next_ < ready_; });
    if (next_ >= ready_) return;  // stop_ with nothing left
    const int64_t k = next_++;
    int& holder = holder_[static_cast<size_t>(k)];
    if (holder < 0) holder = acquire_locked(k, /*may_wait=*/false, lock);  // never written: zeros
    const int buffer = holder;
    const std::span<const float> data(buffers_[static_cast<size_t>(buffer)]);
    const int64_t first = buckets_[static_cast<size_t>(k)].first;
    const std::span<float> shard = shard_;
    const bool skip = !status_.ok();
    const std::string what = absl::StrCat(what_, " (bucket ", k + 1, " of ", buckets_.size(), ")");
    const int64_t ticket = ticket_[static_cast<size_t>(k)];
    CollectiveOrder* order = ticket >= 0 ? order_ : nullptr;
    lock.unlock();
    if (order != nullptr) order->wait_turn(ticket);
    // One collective per chunk of at most a bucket's size: a bucket of one large tensor (the
    // embedding) sent whole would make its owner's Gloo receive buffer ranks x the tensor. Each
    // element's sum does not depend on the cut.
    absl::Status s;
    for (int64_t at = 0; !skip && s.ok() && at < std::ssize(data); at += chunk_) {
      const int64_t n = std::min<int64_t>(chunk_, std::ssize(data) - at);
      s = reduce_scatter_bucket(*group_,
                                data.subspan(static_cast<size_t>(at), static_cast<size_t>(n)),
                                first + at, layout_, shard, what);
    }
    if (order != nullptr) order->done();
    lock.lock();
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    holder_[static_cast<size_t>(k)] = kSent;
    free_.push_back(buffer);
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace fp8rl::train
