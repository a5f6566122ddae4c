// A training backend over the device trainer state (engine/train_state.h DeviceTrainState:
// fp32 master, gradients, AdamW moments, re-quantization, export, optimizer checkpoints) and a
// step engine that runs the training forward and backward over the same device memory: the CUDA
// backend (train/cuda_train_backend.h: CudaTrainStep) and its host mirror (CpuTrainOps over a
// host model refreshed from the state's master, with the state on make_cpu_train_device), which
// runs the whole backend's logic on any machine. docs/design/gpu-training.md "Training on the GPU".
//
// Sharded (trainer.shard grads_optimizer): the state keeps the master and moments of the rank's
// shard; the backward's gradients are staged in device memory tensor by tensor and added into
// the learner's host sink (its reduce-scatter buckets) as the backward makes them final; the
// step updates the shard; the shard's working copies are encoded on the device, all-gathered on
// the host and installed in the state and the engine.
//
// Per minibatch: the forward runs on the engine (activations in its buffers, the K/V amax of each
// sequence into the learner's host calibrator); the backward accumulates into the state's
// gradient array. A learner alone leaves the gradients there (backward / optimizer_step with
// nullptr); in a trainer group they are added into the learner's host buffer for the all-reduce
// and copied back for the step. The optimizer step runs the state's AdamW (clipping, update,
// re-quantization) and has the engine re-derive its working copies from the state's master. The
// export reads the state (FP8 codes and scales, BF16 rounded on the device; fp32 master for
// checkpoints). The host keeps a description of the model only (host_model()); the weight check
// of a group hashes the master in chunks (master_fingerprint()).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/train_state.h"
#include "engine/train_step.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "train/train_backend.h"

namespace fp8rl::train {

// The training forward and backward on one device.
class DeviceStepEngine {
 public:
  virtual ~DeviceStepEngine() = default;
  // engine::train_forward over the engine's ops; keeps one forward's activations.
  virtual absl::StatusOr<model::TokenValues> forward(const model::Model& host,
                                                     const model::TokenBatch& batch,
                                                     const engine::TrainStepOptions& opts) = 0;
  // engine::train_backward of the last forward, accumulating into device_grads.
  virtual absl::Status backward_into(const model::Model& host, const model::TokenValues& dlogp,
                                     float* device_grads) = 0;
  // Re-derives the working copies the ops read from the state's master weights.
  virtual absl::Status refresh(const engine::DeviceTrainState& state) = 0;
  // engine::train_backward of the last forward into `sink`, whose grad(offset) is device memory
  // (the backend's staging of a sharded backward).
  virtual absl::Status backward_to_sink(const model::Model& host, const model::TokenValues& dlogp,
                                        model::GradientSink& sink) = 0;
  // ZeRO-2: the state now holds the master of [begin, end) only; the engine never reads the
  // state's master again (refresh is not called) and takes its working copies from
  // install_working. The host mirror drops the rest of its model's master (Model::shard_master).
  virtual absl::Status shard(int64_t begin, int64_t end) = 0;
  // Sets every working copy from the whole streams a sharded group gathered
  // (model::Model::WorkingStreams), bit for bit what refresh derives from the whole master.
  virtual absl::Status install_working(const model::Model::WorkingStreams& all) = 0;
  virtual absl::Status set_kv_scales(const model::KvScales& scales) = 0;
};

// The backend over `engine` and `state`; `kind` is what device() reports. Its host_model() is a
// description (model::Model::ForDescription of the state's config and policy, with the state's KV
// scales): no fp32 master and no working copies on the host.
absl::StatusOr<std::unique_ptr<TrainBackend>> make_device_train_backend(
    model::Device kind, std::unique_ptr<DeviceStepEngine> engine,
    std::unique_ptr<engine::DeviceTrainState> state);

// The host mirror: a DeviceTrainState on make_cpu_train_device() and an engine that owns `model`
// (its "device" weights: CpuTrainOps read it, and it is refreshed from the state's master after
// each step). device() reports kCpu; host_model() is the description, as on CUDA. Tests compare
// it with the CPU backend (it exercises the device backend's logic without a GPU).
absl::StatusOr<std::unique_ptr<TrainBackend>> make_host_mirror_train_backend(
    std::unique_ptr<model::Model> model, const model::AdamWConfig& adamw);

}  // namespace fp8rl::train
