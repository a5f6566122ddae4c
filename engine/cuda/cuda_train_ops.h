// The CUDA implementation of the training step's ops (engine/train_step.h): the training
// forward and backward of a dense decoder on one GPU, one CUDA stream. Linears run in the
// policy's training GEMM formats:
//   FP8 layers  cuBLASLt block-scaled E4M3 (kernels/cuda/fp8_cuda.h): fprop X . W^T with 1x128
//               activation tiles x 128x128 weight blocks; dgrad dY . W with 1x128 dY tiles x the
//               transposed 128x128 blocks (exact block transpose, no requantization); wgrad
//               dY^T . X with both operands tiled 1x128 along the tokens (transposed on the
//               device, tokens zero-padded to 16), accumulated into the fp32 gradient; every
//               gradient operand quantized in 1x128 tiles.
//   BF16 layers cuBLASLt BF16 with fp32 accumulation (dY and the wgrad operands rounded to bf16:
//   and lm_head the recipe's BF16 GEMMs; the CPU reference keeps dY in fp32 there).
//   fp32        a float64-accumulated GEMM (also the fallback for BF16 shapes cuBLASLt refuses).
// Everything else runs the kernels of kernels/cuda (decoder_cuda.h forward, train_cuda.h
// backward). Weights are uploaded from a host Model (its working copies: FP8 codes + block scales
// and their transposed blocks, bf16 values, fp32 masters, norms, biases, embedding, RoPE tables,
// KV scales); the device optimizer (helper-owned engine/train_state.*) can re-upload them
// with upload_weights() after an update.
//
// Ran on an H200 (docs/results/gpu-check-*.md): tests/gpu/train_ops_cuda_test.cc compares ops
// and a whole forward + backward with the CPU ops' when an sm_90 device is present; the step
// it runs is tested on the CPU through CpuTrainOps (tests/unit/engine/train_step_test.cc).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/train_step.h"
#include "kernels/cuda/fp8_cuda.h"
#include "model/model.h"

namespace fp8rl::engine {

class CudaTrainOps : public TrainOps {
 public:
  // Needs an sm_90 device (FailedPrecondition otherwise), a dense model (FailedPrecondition for
  // MoE) and FP8 linears whose in/out are multiples of 16 (FailedPrecondition naming the layer).
  static absl::StatusOr<std::unique_ptr<CudaTrainOps>> Create(const model::Model& model);
  // Copies the model's current weights (after Model::refresh()) and KV scales to the device.
  virtual absl::Status upload_weights(const model::Model& model) = 0;
  // Re-derives every working copy on the device from fp32 master weights already there (device
  // pointer, ParamLayout order, e.g. DeviceTrainState::master() after an optimizer step), as
  // Model::refresh() does on the host: FP8 linears re-quantized in 128x128 blocks (bit-exact with
  // kernels::quantize) plus their block transposes, BF16 linears, embedding, lm_head, norms and
  // biases rounded to bf16 where the policy rounds them, fp32 ones copied. No host copy involved.
  virtual absl::Status refresh_from_device(const float* master) = 0;
  virtual absl::Status set_kv_scales(const model::KvScales& scales) = 0;
  // ZeRO-2 (a sharded trainer group): sets every working copy from the whole streams the group
  // gathered (model::Model::WorkingStreams: FP8 codes and 128x128 block scales in the CPU layout,
  // bf16 bits of everything else), bit for bit what refresh_from_device derives from the whole
  // master: codes copied and their scales moved to the GEMM layout, the block transposes made on
  // the device; bf16 values converted on the host. InvalidArgument when a stream's size does not
  // match the layout. Compiled only; never run on a GPU.
  virtual absl::Status install_working(const model::Model::WorkingStreams& all) = 0;
  // Zeroed device memory of `floats` floats owned by these ops (alive as long as they are).
  virtual absl::StatusOr<float*> allocate(int64_t floats) = 0;
  virtual kernels::cuda::Stream stream() const = 0;
};

// One micro-batch on the device: tables, buffers (grown as batches grow) and a device gradient
// array of num_params floats in ParamLayout order, accumulated over backward() calls. That array
// is allocated at the first backward() / zero_grads() / download_grads(): a caller that only uses
// backward_into (the training backend, into DeviceTrainState::grads()) never pays for it.
class CudaTrainStep {
 public:
  static absl::StatusOr<std::unique_ptr<CudaTrainStep>> Create(const model::Model& model);
  absl::StatusOr<model::TokenValues> forward(const model::Model& model,
                                             const model::TokenBatch& batch,
                                             const TrainStepOptions& opts);
  absl::Status backward(const model::Model& model, const model::TokenValues& dlogp,
                        const model::GradientsFinal& on_final = {});
  // The same into another device gradient array of num_params floats (e.g. the device
  // optimizer's DeviceTrainState::grads()).
  absl::Status backward_into(const model::Model& model, const model::TokenValues& dlogp,
                             float* device_grads, const model::GradientsFinal& on_final = {});
  // The same into a gradient sink whose storage is device memory (engine::train_backward's sink
  // form: a sharded trainer's staged gradients).
  absl::Status backward_to_sink(const model::Model& model, const model::TokenValues& dlogp,
                                model::GradientSink& sink);
  float* grads() const { return grads_; }  // device; nullptr before the first backward()
  absl::Status zero_grads();
  absl::Status download_grads(std::vector<float>* out);
  CudaTrainOps& ops() { return *ops_; }

 private:
  absl::Status ensure_grads();
  std::unique_ptr<CudaTrainOps> ops_;
  float* grads_ = nullptr;
  int64_t num_params_ = 0;
  kernels::cuda::DeviceBuffer storage_;  // the step's buffers, grown as batches grow
  TrainStepOptions opts_;
  TrainTables tables_;
  TrainBuffers buffers_;
};

}  // namespace fp8rl::engine
