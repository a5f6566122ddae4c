// Trainer checkpoints: a folder with the policy's fp32 master weights (model.safetensors +
// config.json), optionally the AdamW state (one file, or one per rank of a sharded group), the
// frozen reference policy when one is held, and trainer_state.json (versions, job id, precision,
// optimizer settings). Written atomically.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "train/learner.h"

namespace fp8rl::train {

// Names inside a checkpoint folder (beside config.json and model.safetensors).
inline constexpr char kTrainerStateFile[] = "trainer_state.json";
inline constexpr char kOptimizerStateFile[] = "optimizer.safetensors";
inline constexpr char kReferenceDir[] = "reference";

struct SavedCheckpoint {
  std::string path;  // absolute
  uint64_t bytes = 0;
  int64_t version = 0;
};

// Writes `learner` to `dir` (created with its parents; replaced atomically when it exists).
// A learner sharded in a group of 2 or more (Learner::set_shard_mode grads_optimizer) is saved
// collectively: every rank calls this with the same `dir` at once; each writes the AdamW moments
// of its shard and rank 0 the folder, with optimizer_shards/ (train/optimizer_shards.h) instead of
// optimizer.safetensors; every rank returns rank 0's outcome (ABORTED on the others when it
// failed), and a rank that could not write its shard fails every rank before anything is written.
// FAILED_PRECONDITION while a loaded sharded optimizer state is not restored yet.
absl::StatusOr<SavedCheckpoint> save_checkpoint(const Learner& learner, const std::string& dir,
                                                bool include_optimizer);

struct LoadedCheckpoint {
  std::unique_ptr<Learner> learner;
  bool optimizer_restored = false;
};
// Reads a folder written by save_checkpoint (by any backend: the master weights and AdamW state
// are stored in one layout) into a learner placed by `placement` (its memory plan checked before
// the backend allocates); errors name the file and key. A sharded optimizer state (any group size)
// is checked here (its manifest) and restored by the learner once it knows its range
// (Learner::set_pending_optimizer_shards): optimizer_restored is then true.
absl::StatusOr<LoadedCheckpoint> load_checkpoint(const std::string& dir,
                                                 const TrainPlacement& placement = {});

// The "version" of the folder's trainer_state.json; 0 when the folder has none (a plain model
// checkpoint).
absl::StatusOr<int64_t> checkpoint_version(const std::string& dir);

}  // namespace fp8rl::train
