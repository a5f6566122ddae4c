// AdamW on the fp32 master weights with decoupled weight decay, global grad-norm clipping and a
// warmup + constant/cosine learning-rate schedule; plus training checkpoints (HF folder with the
// optimizer state beside the weights) so a trainer can stop and resume.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"

namespace fp8rl::model {

enum class LrSchedule { kConstant, kCosine };
absl::StatusOr<LrSchedule> parse_lr_schedule(std::string_view name);  // constant | cosine

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;   // matrices only (not norms or biases)
  double max_grad_norm = 1.0;  // 0: no clipping
  int64_t warmup_steps = 0;    // linear warmup from lr / warmup_steps
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t total_steps = 0;  // cosine: decays to min_lr_ratio * lr at total_steps
  double min_lr_ratio = 0.0;
};
absl::Status validate_adamw_config(const AdamWConfig& config);  // errors name the field
// Learning rate of 0-based step `step` under `config`'s warmup and schedule (AdamW::lr_at).
double adamw_lr_at(const AdamWConfig& config, int64_t step);
// Whether weight decay applies to a parameter of this kind: matrices (linear, embedding, lm_head,
// router), not norms or biases.
bool adamw_decays(ParamKind kind);

struct OptimizerStepStats {
  int64_t step = 0;  // steps taken, this one included
  double lr = 0;
  double grad_norm = 0;  // before clipping (after grad_scale)
  bool clipped = false;
};

class AdamW {
 public:
  AdamW(const Model& model, const AdamWConfig& config);

  // Learning rate of 0-based step `step`.
  double lr_at(int64_t step) const;
  // grads (num_params, accumulated over micro-batches) times grad_scale is the gradient; clips it,
  // updates the model's master weights and refresh()es its working copies. Non-finite gradients
  // fail without touching the model. grads is left scaled/clipped.
  absl::StatusOr<OptimizerStepStats> step(Model& model, float* grads, float grad_scale = 1.0f);
  int64_t steps() const { return step_; }

  // ZeRO-2 (docs/design/sharding.md): keeps m, v (and the decay mask) for the parameters
  // [begin, end) of the flat layout only and frees the rest; the step count is kept. After this,
  // step() is FAILED_PRECONDITION and step_shard() takes the shard's gradients; save_state() and
  // load_state() (one whole file) are FAILED_PRECONDITION: a sharded optimizer is checkpointed per
  // rank through range_state() / set_range_state() (train/optimizer_shards.h). INVALID_ARGUMENT
  // unless 0 <= begin <= end <= the current range's size and the optimizer is not sharded yet.
  absl::Status shard(int64_t begin, int64_t end);
  bool sharded() const { return sharded_; }
  int64_t shard_begin() const { return begin_; }
  int64_t shard_size() const { return static_cast<int64_t>(m_.size()); }
  // One AdamW step on the shard: `grads` are the shard's summed gradients (shard_size() floats,
  // clipped in place), `grad_norm` the norm of the whole gradient (every rank's shard), which sets
  // the clip factor exactly as step() does; `params` is the fp32 master from flat parameter
  // `params_begin` on (the whole master, or a sharded model's shard: Model::shard_master), and
  // must cover the shard; only the shard's values change. The caller re-derives the working
  // copies of the shard and gathers them. Non-finite grad_norm fails without a change.
  absl::StatusOr<OptimizerStepStats> step_shard(std::span<float> params, std::span<float> grads,
                                                double grad_norm, int64_t params_begin = 0);
  const AdamWConfig& config() const { return config_; }
  // Changes the base learning rate (config().lr) for every later step; the warmup and cosine
  // schedule apply on top of it exactly as for the constructor's lr, and m, v and the step count
  // are kept, so this equals rebuilding the optimizer with the new lr and loading the saved state.
  // InvalidArgument naming "lr" unless lr is finite and > 0 (the optimizer is then unchanged).
  absl::Status set_lr(double lr);

  // Optimizer state as one safetensors file (m, v, step).
  absl::Status save_state(const std::string& path) const;
  absl::Status load_state(const std::string& path);
  // The moments of the range the optimizer holds ([shard_begin(), shard_begin() + shard_size()):
  // the whole layout unless sharded) and the step count.
  struct RangeState {
    std::vector<float> m, v;
    int64_t step = 0;
  };
  RangeState range_state() const;
  // Replaces them (a checkpoint's sharded state, re-cut to this range): INVALID_ARGUMENT unless m
  // and v hold shard_size() values each and step >= 0; the optimizer is then unchanged.
  absl::Status set_range_state(RangeState state);

 private:
  // Clips grads[0, n) by the norm `grad_norm` and updates params[0, n) with m_, v_, decay_ from 0.
  OptimizerStepStats apply(float* params, float* grads, int64_t n, double grad_norm);

  AdamWConfig config_;
  bool sharded_ = false;
  int64_t begin_ = 0;           // the first parameter m_[0] belongs to (sharded)
  std::vector<uint8_t> decay_;  // per parameter element: 1 when weight decay applies
  std::vector<float> m_, v_;
  int64_t step_ = 0;
};

// The optimizer state file (AdamW::save_state's format, shared by the CPU and the device trainer):
// F32 tensors "adamw.exp_avg" and "adamw.exp_avg_sq" [num_params] in ParamLayout order and the
// metadata "step" (steps taken).
struct AdamWState {
  std::vector<float> m, v;
  int64_t step = 0;
};
absl::Status save_adamw_state(const std::string& path, const std::vector<float>& m,
                              const std::vector<float>& v, int64_t step);
// InvalidArgument when the sizes differ from num_params or "step" is missing or negative.
absl::StatusOr<AdamWState> load_adamw_state(const std::string& path, int64_t num_params);

// A training checkpoint: the HF folder (F32 weights + k/v scales) with optimizer.safetensors,
// written atomically.
absl::Status save_training_checkpoint(const std::string& dir, const Model& model,
                                      const AdamW& optimizer);
// The same folder from weights already exported (WeightFormat::kF32) and a function that writes
// the optimizer state file to a given path (the device trainer passes its own).
absl::Status write_training_checkpoint(
    const std::string& dir, const WeightSet& f32_weights,
    const std::function<absl::Status(const std::string& path)>& save_optimizer_state);
// Loads the weights into a new model and the optimizer state into `optimizer` (built for a model
// of the same config).
absl::StatusOr<std::unique_ptr<Model>> load_training_checkpoint(const std::string& dir,
                                                                const PrecisionPolicy& policy,
                                                                AdamW* optimizer);

}  // namespace fp8rl::model
