// ZeRO-3 in the CPU learner (trainer.shard params, docs/design/sharding.md "ZeRO-3 in the
// learner"): a rank keeps the working copies of its own shard only, as the three byte streams a
// sharded group all-gathers (model::Model::WorkingStreams: E4M3 codes, 128x128 block scales, bf16
// bits), and rebuilds one unit of the model (the embedding; a decoder layer; the final norm with
// the lm_head) from the ranks' pieces right before the training step runs it, freeing it after
// (engine::UnitWeights, set in engine::TrainStepOptions::units).
//
// Every rank must run the same collectives in the same order. Prefetch: when a unit is acquired,
// the gather of the unit the pass runs next (the next layer in a forward, the layer before in a
// backward) starts on this object's gather thread and runs while the caller computes the unit;
// its install waits for the caller's acquire. ZeRO-2's gradient buckets reduce-scatter from their
// own communication thread on the same group while the backward goes on. The two threads share a
// CollectiveOrder (train/gradient_buckets.h): a prefetch takes its ticket when it is issued, a
// bucket when the backward makes it final, both on the training thread at the same points of the
// step on every rank, and each collective runs in its ticket's turn, so every rank runs the same
// collectives in the same order and the group never runs two at once. Gathers that are not
// prefetched (the first unit of a pass, the export's, the hash after a step) run on the caller's
// thread after the prefetch and the buckets launched so far are done. A rank without a sequence
// in a minibatch runs the same sequence without data (idle_forward, idle_backward).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/train_step.h"
#include "model/model.h"
#include "train/collectives.h"
#include "train/gradient_buckets.h"
#include "train/shard.h"

namespace fp8rl::train {

class ShardedUnitWeights final : public engine::UnitWeights {
 public:
  // `model` (its master sharded to `layout`'s piece `rank`; non-owning, outlives this object).
  ShardedUnitWeights(model::Model* model, ShardLayout layout, int rank);
  ~ShardedUnitWeights() override;  // waits for a prefetch in flight, then stops the thread
  ShardedUnitWeights(const ShardedUnitWeights&) = delete;
  ShardedUnitWeights& operator=(const ShardedUnitWeights&) = delete;

  // The group the gathers run on (non-owning; null: every gather is FAILED_PRECONDITION). A group
  // of another size or rank than the layout's is refused at the next gather.
  void set_group(Collectives* group);
  // The gradient buckets whose communication thread shares the group (null: none); they take
  // their tickets from this object's CollectiveOrder. Set between passes.
  void set_buckets(GradientBuckets* buckets);

  // Re-derives this rank's streams from its master shard (model::Model::encode_working) and frees
  // every working copy of the model (norms and biases stay); once when sharding (`fingerprint`
  // false: no collective, so a rank may shard while the others are busy elsewhere) and after
  // every optimizer step, where `fingerprint` agrees with the group on a hash of the ranks'
  // streams (one 8-byte all-gather each: hash(), 0 until then).
  absl::Status refresh(std::string_view what, bool fingerprint);

  // engine::UnitWeights: all-gathers the unit's whole tensors (each rank sends the part of its
  // streams inside them; up to three all-gathers per range, one skipped on every rank when no
  // rank has bytes of that stream there) and installs them (model::Model::install_working_range);
  // release drops them. Both do nothing while acquire_all holds the whole model.
  absl::Status acquire(int64_t unit) override;
  void release(int64_t unit) override;

  // The gathers of a forward / backward this rank runs without data, in the step's order, so
  // every rank runs the same collectives. idle_backward tells `sink` (null: none) what a backward
  // would: the gradients from each unit on are final, then all (model::GradientSink::final_from;
  // GradientBuckets sends the buckets never written as zeros).
  absl::Status idle_forward();
  absl::Status idle_backward(model::GradientSink* sink);

  // Every unit held at once (an export of the whole working copies) until release_all(); the
  // units' own acquire / release do nothing meanwhile. Nested calls count.
  absl::Status acquire_all(std::string_view what);
  void release_all();

  // Bytes of this rank's own streams (the shard of the working copies it keeps between units).
  int64_t held_bytes() const;
  // Acquires served by a prefetched gather so far, and acquires in all (tests).
  int64_t prefetched() const { return prefetched_; }
  int64_t acquired() const { return acquired_; }
  // FNV-1a over the ranks' stream hashes in rank order (the same on every rank after refresh).
  uint64_t hash() const { return hash_; }
  const ShardLayout& layout() const { return layout_; }

 private:
  // The flat ranges of unit `unit` (a tied head: the final norm and the embedding table).
  std::vector<std::pair<int64_t, int64_t>> ranges(int64_t unit) const;
  absl::Status check_group() const;
  // Gathers and installs [begin, end) (whole tensors). `what` names the collectives.
  absl::Status gather_range(int64_t begin, int64_t end, const std::string& what);
  // The collectives of gather_range: every rank's streams of [begin, end), concatenated.
  absl::StatusOr<model::Model::WorkingStreams> collect_range(int64_t begin, int64_t end,
                                                             const std::string& what) const;
  // Waits for the buckets launched so far and a prefetch in flight (before a gather on the
  // caller's thread).
  void drain();
  // The unit a pass runs after `unit` given the one acquired before it (-1: none).
  int64_t next_unit(int64_t unit) const;
  void start_prefetch(int64_t unit);  // issues the gather of `unit` on the gather thread
  void wait_prefetch();               // until no prefetch is in flight
  void run();                         // the gather thread

  model::Model* const model_;
  const ShardLayout layout_;
  const int rank_;
  Collectives* group_ = nullptr;
  GradientBuckets* buckets_ = nullptr;
  model::Model::WorkingStreams mine_;  // encode_working of this rank's shard
  uint64_t hash_ = 0;
  int all_held_ = 0;  // acquire_all depth
  int64_t last_acquired_ = -1;
  int64_t prefetched_ = 0, acquired_ = 0;
  CollectiveOrder order_;
  // The prefetch: the unit whose gather was issued, its ticket, and its result once done.
  struct Prefetch {
    int64_t unit = -1;
    int64_t ticket = -1;
    std::string what;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    bool running = false, done = false;
    absl::Status status;
    std::vector<model::Model::WorkingStreams> streams;  // one per range
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Prefetch> prefetch_;  // guarded by mu_
  bool stop_ = false;                 // guarded by mu_
  std::thread thread_;                // last: starts after the members above exist
};

}  // namespace fp8rl::train
