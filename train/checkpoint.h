// Trainer checkpoints: a folder with the policy's fp32 master weights (model.safetensors +
// config.json), optionally the AdamW state, the frozen reference policy when one is held, and
// trainer_state.json (versions, job id, precision, optimizer settings). Written atomically.
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
absl::StatusOr<SavedCheckpoint> save_checkpoint(const Learner& learner, const std::string& dir,
                                                bool include_optimizer);

struct LoadedCheckpoint {
  std::unique_ptr<Learner> learner;
  bool optimizer_restored = false;
};
// Reads a folder written by save_checkpoint (by any backend: the master weights and AdamW state
// are stored in one layout) into a learner placed by `placement` (its memory plan checked before
// the backend allocates); errors name the file and key.
absl::StatusOr<LoadedCheckpoint> load_checkpoint(const std::string& dir,
                                                 const TrainPlacement& placement = {});

// The "version" of the folder's trainer_state.json; 0 when the folder has none (a plain model
// checkpoint).
absl::StatusOr<int64_t> checkpoint_version(const std::string& dir);

}  // namespace fp8rl::train
