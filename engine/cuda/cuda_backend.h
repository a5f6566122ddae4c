// The CUDA implementation of model/inference_backend.h (docs/design/gpu.md "GPU engine"): weights
// copied to the device as the model holds them (FP8 linears: the E4M3 codes and 128x128 block
// scales of the payload, never re-quantized; BF16/F32 tensors as BF16/F32) through two pinned
// staging buffers, one compute stream, one cudaMalloc of the byte budget carved by ArenaPlan into
// weights (one or two slots: BackendOptions::weight_slots; with two, the next version is copied
// into the idle slot on a copy stream while the other serves, and set_model flips), step scratch
// and a paged KV pool (the rest), and decoder_step() over device ops: cuBLASLt block-scaled FP8
// (1x128 x 128x128) for FP8 linears, cuBLASLt BF16 for BF16 linears and lm_head, a
// double-accumulating fp32 GEMM for fp32 linears, the kernels of kernels/cuda for everything else,
// sampling on the device.
//
// Ran on an H200 (2026-12-04): tests/gpu/model_cuda_test.cc compares it with the CPU when sm_90
// device is present; the orchestration it shares with the CPU mirror is tested on the CPU
// (tests/unit/engine/decoder_step_test.cc).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/inference_backend.h"

namespace fp8rl::engine {

struct CudaBackendExtras {
  // BF16 linears (and lm_head) through the double-accumulating GEMM the CPU uses instead of
  // cuBLASLt, so tests can separate "same recipe" from "different summation order".
  bool exact_bf16_linears = false;
};

class CudaBackend : public model::InferenceBackend {
 public:
  // forward() that also copies every decoder layer's output x [rows, hidden] to the host (the
  // rows of all segments in order), for layer-by-layer comparison with the CPU.
  virtual absl::Status forward_layers(const std::vector<model::BackendSegment>& segments,
                                      float* logits, std::vector<std::vector<float>>* layers) = 0;
};

absl::StatusOr<std::unique_ptr<CudaBackend>> create_cuda_backend(
    std::shared_ptr<const model::Model> model, const model::BackendOptions& options,
    const CudaBackendExtras& extras = {});

}  // namespace fp8rl::engine
