// ZeRO-3 in the CPU learner (trainer.shard params, docs/design/sharding.md "ZeRO-3 in the
// learner"): a rank keeps the working copies of its own shard only, as the three byte streams a
// sharded group all-gathers (model::Model::WorkingStreams: E4M3 codes, 128x128 block scales, bf16
// bits), and rebuilds one unit of the model (the embedding; a decoder layer; the final norm with
// the lm_head) from the ranks' pieces right before the training step runs it, freeing it after
// (engine::UnitWeights, set in engine::TrainStepOptions::units).
//
// Every rank must run the same collectives in the same order. The gathers run on the caller's
// thread, one after the other (no prefetch). ZeRO-2's gradient buckets reduce-scatter from their
// own communication thread on the same group while the backward goes on; a gather first waits
// for every bucket launched so far (GradientBuckets::drain), so the group never runs two
// collectives at once and the order is the backward's: a gather, the buckets that unit's backward
// made final, the next gather. A rank without a sequence in a minibatch runs the same sequence
// without data (idle_forward, idle_backward).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
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
  ShardedUnitWeights(const ShardedUnitWeights&) = delete;
  ShardedUnitWeights& operator=(const ShardedUnitWeights&) = delete;

  // The group the gathers run on (non-owning; null: every gather is FAILED_PRECONDITION). A group
  // of another size or rank than the layout's is refused at the next gather.
  void set_group(Collectives* group) { group_ = group; }
  // The gradient buckets whose communication thread shares the group (null: none).
  void set_buckets(GradientBuckets* buckets) { buckets_ = buckets; }

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
  // FNV-1a over the ranks' stream hashes in rank order (the same on every rank after refresh).
  uint64_t hash() const { return hash_; }
  const ShardLayout& layout() const { return layout_; }

 private:
  // The flat ranges of unit `unit` (a tied head: the final norm and the embedding table).
  std::vector<std::pair<int64_t, int64_t>> ranges(int64_t unit) const;
  absl::Status check_group() const;
  // Gathers and installs [begin, end) (whole tensors). `what` names the collectives.
  absl::Status gather_range(int64_t begin, int64_t end, const std::string& what);
  void drain() const;

  model::Model* const model_;
  const ShardLayout layout_;
  const int rank_;
  Collectives* group_ = nullptr;
  GradientBuckets* buckets_ = nullptr;
  model::Model::WorkingStreams mine_;  // encode_working of this rank's shard
  uint64_t hash_ = 0;
  int all_held_ = 0;  // acquire_all depth
};

}  // namespace fp8rl::train
