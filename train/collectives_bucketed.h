// Bucketed gradient all-reduce that overlaps the backward (docs/design/training.md "Trainer
// groups"): the gradient array is cut into fixed buckets from its end, and a bucket is all-reduced
// (sum) on a communication thread as soon as the backward says its gradients are final, while the
// backward goes on with earlier layers. The result equals one all-reduce of the whole array up to
// the order in which each element's N rank terms are added (bit for bit with 2 ranks, where a + b =
// b + a); every rank still ends with bit-identical values (each bucket is one all-reduce of the
// backend).
//
// For sharded groups (docs/design/sharding.md) the same buckets can be reduce-scattered instead
// (begin_scatter): each bucket is one reduce_scatter whose pieces are the parts of the ranks'
// shards inside it, and each rank receives only its own shard of the sum. On Gloo every element
// is then summed in rank order, so the shard does not depend on the bucket size and, with 2
// ranks, equals the bucketed all-reduce's values bit for bit.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "train/collectives.h"
#include "train/shard.h"

namespace fp8rl::train {

// One bucket's reduce-scatter: `bucket` holds elements [first, first + size) of a rank's gradient
// array, and each rank r receives the sum of the part of its shard inside it
// (layout.begin(r)..layout.end(r)) at that part's place in `shard` (this rank's whole shard).
absl::Status reduce_scatter_bucket(Collectives& group, std::span<const float> bucket, int64_t first,
                                   const ShardLayout& layout, std::span<float> shard,
                                   const std::string& what);

class BucketedAllReduce {
 public:
  // `group` (non-owning) must outlive this object; bucket_elements >= 1 floats.
  BucketedAllReduce(Collectives* group, int64_t bucket_elements);
  ~BucketedAllReduce();  // waits for the bucket in flight, then stops the thread
  BucketedAllReduce(const BucketedAllReduce&) = delete;
  BucketedAllReduce& operator=(const BucketedAllReduce&) = delete;

  int64_t bucket_elements() const { return bucket_elements_; }

  // Starts one summed all-reduce of `data` (which must stay alive and unmoved until finish()).
  // `what` names it in errors ("minibatch 0: gradient all-reduce").
  void begin(std::span<float> data, std::string what);
  // Starts one summed reduce-scatter of `data` (this rank's whole array; only read) into `shard`
  // (layout.size(rank) floats: this rank's [layout.begin(rank), layout.end(rank)) of the sum).
  // `layout` (layout.ranks() == the group size, covering data.size()), `data` and `shard` must
  // stay alive and unmoved until finish(). A layout that does not fit is reported by finish() as
  // INVALID_ARGUMENT, after the same (skipped) buckets on every rank.
  void begin_scatter(std::span<const float> data, const ShardLayout& layout, std::span<float> shard,
                     std::string what);
  // data[from, size) is final (the training backward's on_final): launches every bucket inside it.
  void final_from(int64_t from);
  // Launches the remaining buckets and waits for all of them; the first failure, if any (later
  // buckets are skipped after one fails: the group is unusable then). Every begin() needs one
  // finish(), also when the backward failed, so all ranks run the same collectives.
  absl::Status finish();
  // Seconds the last finish() waited: the all-reduce time the backward did not hide.
  double last_wait_seconds() const { return last_wait_seconds_; }

 private:
  void run();  // the communication thread
  // One bucket of data_ starting at `first`: all-reduced in place (layout null), or
  // reduce-scattered into this rank's part of `shard`.
  absl::Status reduce_bucket(std::span<float> bucket, int64_t first, const ShardLayout* layout,
                             std::span<float> shard, const std::string& what);

  Collectives* const group_;
  const int64_t bucket_elements_;
  double last_wait_seconds_ = 0;  // only touched by the caller's thread
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_. Bucket k covers [max(0, n - (k + 1) B), n - k B) of data_, n = data_.size();
  // buckets [0, ready_) may be reduced, [0, next_) were taken by the thread, [0, done_) are done.
  std::span<float> data_;
  std::string what_;
  // Reduce-scatter mode (begin_scatter): the layout and this rank's shard; null layout_ otherwise.
  const ShardLayout* layout_ = nullptr;
  std::span<float> shard_;
  int64_t buckets_ = 0, ready_ = 0, next_ = 0, done_ = 0;
  absl::Status status_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace fp8rl::train
