// The CUDA training backend (train/train_backend.h), assembled from the device training step
// (engine/cuda/cuda_train_ops.h CudaTrainStep: forward and backward over TrainOps) and the device
// trainer state (engine/train_state.h DeviceTrainState: fp32 master, gradients, AdamW moments,
// re-quantization, export, optimizer checkpoints). Built only with CUDA (FP8RL_HAVE_CUDA); reached
// through make_train_backend(Device::kCuda, ...). Never run on a GPU.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "train/train_backend.h"

namespace fp8rl::train {

// FAILED_PRECONDITION without an sm_90 device, for a mixture-of-experts model, or for FP8 linear
// shapes the device GEMMs do not take (the device step's own errors); RESOURCE_EXHAUSTED when the
// device memory is not there.
absl::StatusOr<std::unique_ptr<TrainBackend>> make_cuda_train_backend_impl(
    std::unique_ptr<model::Model> model, const model::AdamWConfig& adamw, InitialShard initial);

}  // namespace fp8rl::train
