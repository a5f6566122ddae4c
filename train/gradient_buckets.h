// ZeRO-2's gradient storage per shard (docs/design/sharding.md "ZeRO-2 in the learner"): a
// model::GradientSink that hands the backward one buffer per bucket of whole parameter tensors,
// reduce-scatters each bucket from its buffer into this rank's shard of the summed gradient on a
// communication thread as soon as the backward says the bucket is final (in calls of at most the
// bucket size, also for a bucket of one larger tensor), and reuses the buffer once the collective
// is done with it. A sharded rank then holds its shard of the sum, the buckets the backward is
// writing (those of the decoder layer it is in, and a tied embedding's from the lm_head at the
// start to the token lookup at the end) and the buckets being reduce-scattered, never the whole
// gradient array.
//
// The sum of each element is the collective's (on Gloo: rank order, whatever the cut), so the
// shard equals the whole-array reduce-scatter's bit for bit (train/collectives_bucketed.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "model/gradient_sink.h"
#include "model/params.h"
#include "train/collectives.h"
#include "train/shard.h"

namespace fp8rl::train {

// The order of collectives that more than one thread runs on one group (ZeRO-3's prefetched unit
// gathers and the gradient buckets' reduce-scatters, train/unit_gather.h): a ticket is taken on
// the training thread at the point where the collective is decided, which is the same point of
// the same step on every rank, and the thread that runs the collective waits for its ticket's
// turn and passes it on when done. Every rank then runs them in ticket order.
class CollectiveOrder {
 public:
  int64_t take();
  void wait_turn(int64_t ticket);
  void done();  // the turn passes to the next ticket

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_ = 0, serving_ = 0;
};

class GradientBuckets final : public model::GradientSink {
 public:
  // One bucket of the flat gradient: elements [first, end).
  struct Bucket {
    int64_t first = 0, end = 0;
  };
  // The cut of `params` (the model's layout) into buckets of at most `bucket_elements` floats
  // (>= 1), at tensor boundaries, from the end of the array: bucket 0 holds the last tensors. A
  // tensor larger than a bucket is a bucket of its own (a linear's backward accumulates its whole
  // dW in place). The buckets cover [0, params.total()) without gaps.
  static std::vector<Bucket> cut(const model::ParamLayout& params, int64_t bucket_elements);

  // `group` and `layout` (non-owning) must outlive this object.
  GradientBuckets(Collectives* group, const ShardLayout& layout, const model::ParamLayout& params,
                  int64_t bucket_elements);
  ~GradientBuckets() override;  // waits for the bucket in flight, then stops the thread
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  Collectives* group() const { return group_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Starts one backward whose gradients are summed into `shard` (this rank's
  // [layout.begin(rank), layout.end(rank)) of the sum; alive and unmoved until finish()). `what`
  // names the collectives in errors. A layout that does not fit the group, the parameters or the
  // shard fails finish() with INVALID_ARGUMENT, after the same (skipped) buckets on every rank.
  void begin(std::span<float> shard, std::string what);
  // model::GradientSink. grad() takes a free buffer (the smallest that holds the bucket), or
  // waits for one while a launched bucket is still being reduce-scattered, or else allocates
  // one; it is zeroed to the bucket's size. A tensor asked for after its bucket was final is a
  // bug of the caller: it gets scratch storage and finish() returns INTERNAL naming it.
  float* grad(int64_t offset) override;
  void final_from(int64_t from) override;
  // Launches every bucket not launched yet (one the backward never wrote is sent as zeros, so
  // every rank runs the same collectives, also after a failed or empty backward), waits for all
  // of them and frees the buffers. The first failure, if any (later buckets are skipped after
  // one fails: the group is unusable then). Every begin() needs one finish().
  absl::Status finish();
  // Waits until every bucket made final so far has been reduce-scattered (returns at once when
  // none is in flight). ZeRO-3's unit gathers call it before they use the group
  // (train/unit_gather.h).
  void drain();
  // Takes a ticket of `order` (null: none) for each bucket as it becomes final, and runs its
  // reduce-scatter in that ticket's turn. Set between backwards.
  void set_order(CollectiveOrder* order) { order_ = order; }
  // Seconds the last finish() waited: the reduce-scatter time the backward did not hide.
  double last_wait_seconds() const { return last_wait_seconds_; }
  // The most bytes of bucket buffers (their capacities) held at once between the last begin()
  // and its finish(); 0 before the first.
  int64_t last_peak_bytes() const { return last_peak_bytes_; }

 private:
  static constexpr int kSent = -2;  // holder_ of a bucket whose buffer went back to the pool
  void run();                       // the communication thread
  // A zeroed buffer for bucket k (index into buffers_); `may_wait`: the backward's thread may
  // wait for a bucket in flight to give its buffer back.
  int acquire_locked(int64_t k, bool may_wait, std::unique_lock<std::mutex>& lock);
  int64_t bucket_of(int64_t offset) const;
  void ready_locked(int64_t upto);  // buckets [ready_, upto) are final: their tickets

  Collectives* const group_;
  const ShardLayout& layout_;
  const int64_t total_;
  const int64_t chunk_;  // floats per reduce-scatter call: the bucket size (see run)
  const std::vector<Bucket> buckets_;
  double last_wait_seconds_ = 0;  // only touched by the caller's thread
  int64_t last_peak_bytes_ = 0;   // only touched by the caller's thread
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_. Buckets [0, ready_) are final, [0, next_) taken by the thread, [0, done_)
  // done. holder_[k]: the buffer bucket k writes into, -1 before it has one, kSent after.
  std::vector<std::vector<float>> buffers_;
  std::vector<int> free_;  // indices into buffers_ not held by a bucket
  std::vector<int> holder_;
  std::vector<int64_t> ticket_;         // per bucket: its CollectiveOrder ticket (with order_)
  CollectiveOrder* order_ = nullptr;    // set between backwards
  int64_t bytes_ = 0, peak_bytes_ = 0;  // capacities of buffers_, now and at most
  std::span<float> shard_;
  std::string what_;
  std::vector<float> scratch_;  // a late tensor's storage (see grad)
  int64_t ready_ = 0, next_ = 0, done_ = 0;
  bool active_ = false;  // between begin() and finish()
  absl::Status status_;
  // A tensor asked for out of turn (see grad): reported by finish(), but the buckets still go
  // out, so every rank runs the same collectives.
  absl::Status misuse_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace fp8rl::train
