// The training backend boundary: what the learner (train/learner.h) asks of the device that holds
// the policy under training -- the training forward (response logprobs, activations saved for the
// backward), the backward, the AdamW step with its re-quantization of the working copies, the KV
// scales and their calibration forward, the export for publishing and the optimizer state of a
// checkpoint. The learner keeps everything else (request validation, GRPO/SFT loss, minibatches,
// data-parallel collectives, versions) on the host, so one learner drives either backend.
//   - CPU (make_cpu_train_backend): the decoder engine's training step over its CPU ops
//     (engine/cpu/train_ops.h CpuTrainStep; the orchestration the CUDA backend runs over device
//     ops) for the forwards and backwards, model::Model + model::AdamW for the weights, optimizer,
//     export and KV scales; bit-identical to the separate model forward and backward it
//     replaced (tests/unit/train/learner_test.cc LearnerGolden, digests recorded before).
//   - CUDA (train/cuda_train_backend.h, with CUDA; ran on an H200): the device training
//     step and the device trainer state (docs/design/gpu-training.md "Training on the GPU").
//     Without CUDA in the build, or without an sm_90 device, asking for it is FAILED_PRECONDITION,
//     never a silent CPU fallback.
// A backend is not thread-safe: the learner serializes calls.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/inference_backend.h"  // model::Device
#include "model/model.h"
#include "model/optimizer.h"
#include "train/batch.h"
#include "train/collectives.h"
#include "train/shard.h"

namespace fp8rl::train {

class ShardedUnitWeights;  // train/unit_gather.h

// What a training forward kept for its backward; each backend has its own kind (the CPU one holds
// an engine::CpuTrainStep). Made by TrainBackend::new_forward_state().
class ForwardState {
 public:
  virtual ~ForwardState() = default;
  // Bytes of activations held (the memory the backward needs besides the weights).
  virtual int64_t activation_bytes() const = 0;
};

// How a backend's training forward keeps activations for the backward.
enum class Recompute {
  kNone,    // every intermediate of every layer (fastest backward, most memory)
  kLayers,  // only each decoder layer's input; the backward recomputes the layer first
};
// "none" | "layers"; INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<Recompute> parse_recompute(std::string_view text, std::string_view field);
std::string_view recompute_name(Recompute r);

class TrainBackend {
 public:
  virtual ~TrainBackend() = default;

  virtual model::Device device() const = 0;
  // The host-side description of the policy: config, precision policy, parameter layout, token
  // and routing checks (pack_sequences validates against it). On the CPU backend it is the model
  // that trains; other backends keep their weights on the device and this object holds no master.
  virtual const model::Model& host_model() const = 0;
  int64_t num_params() const { return host_model().num_params(); }

  // Activation recomputation of the training forwards (kNone by default).
  virtual void set_recompute(Recompute r) = 0;
  virtual Recompute recompute() const = 0;

  virtual std::unique_ptr<ForwardState> new_forward_state() const = 0;
  // Response-token logprobs of `batch`, [B*L] (0 at padding), as train/batch.h response_logprobs.
  // With `saved` (from new_forward_state), keeps what backward() needs; `calibrator` records the
  // K/V amax per sequence and layer; `routing` receives a mixture-of-experts forward's routing.
  virtual absl::StatusOr<std::vector<float>> logprobs(
      const PackedBatch& batch, ForwardState* saved, model::KvCalibrator* calibrator = nullptr,
      model::ForwardRouting* routing = nullptr) const = 0;
  // Adds dL/dparams into grads[num_params()] (host memory, the learner's all-reduce buffer) given
  // dL/dlogprob over the response tokens of the batch `saved` was computed on ([B*L]).
  // `on_final` (model::GradientsFinal): grads[from, num_params) are final.
  // grads == nullptr: into the backend's own gradient buffer instead (device memory on a device
  // backend: nothing crosses to the host), zeroed before the first backward after an optimizer
  // step and read in place by optimizer_step(nullptr). While that buffer holds gradients not yet
  // stepped, a backward or optimizer_step with a host buffer is FAILED_PRECONDITION; a failed
  // backward drops what it holds (the next one starts from zero).
  virtual absl::Status backward(const ForwardState& saved, const PackedBatch& batch,
                                std::span<const float> dloss_dlogp, float* grads,
                                const model::GradientsFinal& on_final = {}) = 0;

  // The same backward into `sink` (model/gradient_sink.h: storage handed out tensor by tensor,
  // ZeRO-2's buckets, train/gradient_buckets.h) instead of a whole host array; the values are the
  // same bit for bit. A device backend stages each tensor's gradient in device memory until the
  // backward makes it final, then adds it into the sink's host storage. FAILED_PRECONDITION
  // while the backend's own buffer holds gradients.
  virtual absl::Status backward_to_sink(const ForwardState& saved, const PackedBatch& batch,
                                        std::span<const float> dloss_dlogp,
                                        model::GradientSink& sink);

  // One AdamW step with `grads` (clipped in place), then the re-quantization of every working
  // copy (FP8 128x128 blocks, bf16 rounding) from the new master weights. grads == nullptr: the
  // backend's own buffer (see backward; zeros when no backward ran since the last step).
  virtual absl::StatusOr<model::OptimizerStepStats> optimizer_step(float* grads) = 0;

  // ZeRO-2 (trainer.shard grads_optimizer, docs/design/sharding.md): the CPU and the device
  // backends (ZeRO-3, shard_working, on the CPU backend only); the defaults are
  // FAILED_PRECONDITION naming the device.
  // Keeps the AdamW moments and the fp32 master of the flat parameters [begin, end) only
  // (model::AdamW::shard, model::Model::shard_master); optimizer_step() is then
  // FAILED_PRECONDITION, the optimizer state cannot be saved as one file, and exports that need
  // the whole master take it from export_weights_with_master.
  virtual absl::Status shard_optimizer(int64_t begin, int64_t end);
  // One AdamW step on the shard: `grads` are the shard's gradients summed over the group (clipped
  // in place), `grad_norm` the whole gradient's norm. Only the shard of the fp32 master changes;
  // nothing is re-quantized until gather_working().
  virtual absl::StatusOr<model::OptimizerStepStats> optimizer_step_shard(std::span<float> grads,
                                                                         double grad_norm);
  // Every rank calls it after optimizer_step_shard: derives the working copies of its own shard
  // (`layout`, cut as the optimizer was) and all-gathers every rank's over `group`
  // (model::Model::WorkingStreams: FP8 codes, block scales, bf16 bits), so every rank holds the
  // whole working model, bit for bit what one trainer's refresh gives. The collective's error is
  // returned as is.
  virtual absl::Status gather_working(Collectives& group, const ShardLayout& layout,
                                      std::string_view what);
  // ZeRO-3 (trainer.shard params): after shard_optimizer, keeps the working copies of the rank's
  // own shard only (train/unit_gather.h); every training forward and backward then gathers each
  // unit from the ranks as it runs. FAILED_PRECONDITION when the master is not sharded to
  // `layout`'s piece `rank`, when already sharded, or on a backend that cannot (the default).
  virtual absl::Status shard_working(const ShardLayout& layout, int rank);
  // The unit gathers after shard_working (null before, and on backends without ZeRO-3).
  virtual ShardedUnitWeights* sharded_units() const { return nullptr; }
  // The fp32 master this backend holds (its shard after shard_optimizer, else all of it) as a
  // host copy: what Learner::whole_master all-gathers.
  virtual absl::StatusOr<std::vector<float>> master_shard() const = 0;
  // export_weights with the whole fp32 master given (gathered by the caller from the ranks'
  // shards: train::Learner::whole_master), for a sharded backend's formats that need it.
  virtual absl::StatusOr<model::WeightSet> export_weights_with_master(
      model::WeightFormat format, int64_t version, std::span<const float> whole_master) const;
  // The AdamW moments and step count of the range the optimizer holds (its shard after
  // shard_optimizer, else every parameter): what a sharded checkpoint stores per rank, and what
  // restoring one sets (train/optimizer_shards.h). set_: INVALID_ARGUMENT on a size mismatch.
  virtual absl::StatusOr<model::AdamW::RangeState> optimizer_range_state() const;
  virtual absl::Status set_optimizer_range_state(model::AdamW::RangeState state);
  // Bytes of gradients copied between the host buffer and the device so far (0 on the CPU
  // backend; 0 on a device backend while the learner keeps gradients in the backend's buffer).
  virtual int64_t gradient_transfer_bytes() const = 0;
  // Bytes of device memory that stage a sharded backward's gradients until they are final
  // (device backends; 0 on the CPU backend, whose backward writes into the learner's buckets).
  virtual int64_t gradient_staging_bytes() const { return 0; }
  // The re-quantization alone (optimizer_step already runs it; benchmarks time it on its own).
  virtual void requantize() = 0;
  virtual const model::AdamWConfig& optimizer_config() const = 0;
  virtual int64_t optimizer_steps() const = 0;
  // model::AdamW::set_lr.
  virtual absl::Status set_learning_rate(double lr) = 0;

  virtual const model::KvScales& kv_scales() const = 0;
  virtual absl::Status set_kv_scales(const model::KvScales& scales) = 0;
  // A forward over `sequences` that records each layer's K/V amax into `calibrator` (the
  // calibration before any update; later ones ride on the update's own forward).
  virtual absl::Status calibration_forward(const model::TokenBatch& sequences,
                                           model::KvCalibrator* calibrator) const = 0;

  // The weights in checkpoint layout (kF32: the master weights; kBF16 / kFP8: the publishing
  // formats, FP8 codes and scales as re-quantized by the last optimizer step).
  virtual absl::StatusOr<model::WeightSet> export_weights(model::WeightFormat format,
                                                          int64_t version) const = 0;
  // train/data_parallel.h weight_hash of the fp32 master weights (the data-parallel check that
  // every rank holds the same weights): equal masters give equal values on every backend. The CPU
  // backend hashes its own storage; a device backend downloads the master in fixed-size chunks
  // (kFingerprintChunkFloats) and hashes them on the host, never holding a whole host copy.
  // Sharded (shard_optimizer), where no rank holds the whole master: the hash of the working
  // copies the last gather_working installed (working_weights_hash), the state every rank
  // shares.
  virtual absl::StatusOr<uint64_t> master_fingerprint() const = 0;
  static constexpr int64_t kFingerprintChunkFloats = int64_t{1} << 20;  // 4 MiB per download

  // The AdamW moments and step as one safetensors file (model::AdamW::save_state's layout, so a
  // checkpoint written by one backend loads into another).
  virtual absl::Status save_optimizer_state(const std::string& path) const = 0;
  virtual absl::Status load_optimizer_state(const std::string& path) = 0;
};

// The CPU backend over `model` with a new AdamW(config) on it.
std::unique_ptr<TrainBackend> make_cpu_train_backend(std::unique_ptr<model::Model> model,
                                                     const model::AdamWConfig& adamw);
// The CPU backend over an existing model and optimizer (built on that model).
std::unique_ptr<TrainBackend> make_cpu_train_backend(std::unique_ptr<model::Model> model,
                                                     std::unique_ptr<model::AdamW> optimizer);

// The FAILED_PRECONDITION of a host-buffer call while the backend's own buffer holds gradients.
absl::Status gradients_pending_error(std::string_view call);

// The shard of the flat parameters a device backend keeps the optimizer state of from the start:
// a rank of a sharded group that knows its shard when the policy is made (the trainer joins its
// group before InitPolicy) never allocates the whole fp32 master, moments and gradients on its
// device. shard_optimizer with the same range then completes the sharding. end < 0: none.
struct InitialShard {
  int64_t begin = 0;
  int64_t end = -1;
};

// Whether this build has the CUDA training backend, and why not when it does not.
bool cuda_train_backend_available();
std::string cuda_train_backend_unavailable_reason();

// A backend on `device` for the policy `model` (the initial master weights, host memory) with
// `adamw`; `memory_budget_bytes` bounds the device memory on cuda (0: unchecked). cpu: the CPU
// backend (`initial` is not used: it shards when the learner does). cuda: the CUDA backend
// (FAILED_PRECONDITION without CUDA in the build or without an sm_90 device), its optimizer state
// cut to `initial` from the start.
absl::StatusOr<std::unique_ptr<TrainBackend>> make_train_backend(
    model::Device device, std::unique_ptr<model::Model> model, const model::AdamWConfig& adamw,
    int64_t memory_budget_bytes = 0, InitialShard initial = {});

}  // namespace fp8rl::train
