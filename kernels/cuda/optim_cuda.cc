// Argument checks and absl::Status for the optimizer kernels (optim_kernels.cu).
#include "kernels/cuda/optim_cuda.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/optim_launch.h"
#include "kernels/cuda/quantize_launch.h"

namespace fp8rl::kernels::cuda {
namespace {

cudaStream_t to_cuda(Stream s) { return s; }

absl::Status check_n(const char* fn, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(fn, ": n = ", n, " is negative"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> scale_and_sum_squares(float* g, int64_t n, float scale, void* workspace,
                                             Stream stream) {
  if (auto s = check_n("cuda::scale_and_sum_squares", n); !s.ok()) return s;
  if (n == 0) return 0.0;
  if (g == nullptr || workspace == nullptr) {
    return absl::InvalidArgumentError("cuda::scale_and_sum_squares: null pointer");
  }
  double* partials = static_cast<double*>(workspace);
  double* out = partials + internal::kSumSquaresMaxBlocks;
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_scale_and_sum_squares(g, n, scale, partials, out, to_cuda(stream)));
  double host = 0;
  if (auto s = copy_to_host(&host, out, sizeof(double), stream); !s.ok()) return s;
  return host;
}

absl::Status adamw_step(float* p, float* m, float* v, float* g, int64_t n, float clip, bool decay,
                        const dm::AdamWCoeffs& c, Stream stream) {
  if (auto s = check_n("cuda::adamw_step", n); !s.ok()) return s;
  if (n > 0 && (p == nullptr || m == nullptr || v == nullptr || g == nullptr)) {
    return absl::InvalidArgumentError("cuda::adamw_step: null pointer");
  }
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_adamw(p, m, v, g, n, clip, decay, c, to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status amax_into(const float* x, int64_t n, float* slot, Stream stream) {
  if (auto s = check_n("cuda::amax_into", n); !s.ok()) return s;
  if (slot == nullptr || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError("cuda::amax_into: null pointer");
  }
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_amax_into(x, n, slot, to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status amax_into_bf16(const uint16_t* x, int64_t n, float* slot, Stream stream) {
  if (auto s = check_n("cuda::amax_into_bf16", n); !s.ok()) return s;
  if (slot == nullptr || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError("cuda::amax_into_bf16: null pointer");
  }
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_amax_into_bf16(x, n, slot, to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status round_bf16(const float* x, int64_t n, uint16_t* out, Stream stream) {
  if (auto s = check_n("cuda::round_bf16", n); !s.ok()) return s;
  if (n > 0 && (x == nullptr || out == nullptr)) {
    return absl::InvalidArgumentError("cuda::round_bf16: null pointer");
  }
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_round_bf16(x, n, out, to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status transpose_blocks_into(const Fp8DeviceView& w, uint8_t* t, float* t_scales,
                                   Stream stream) {
  constexpr const char* kFn = "cuda::transpose_blocks_into";
  if (w.mode != ScalingMode::kBlock128x128) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": w must be block_128x128"));
  }
  if (w.rows < 1 || w.cols < 1 || ceil_div(w.rows, 32) > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": w is [", w.rows, ", ", w.cols, "], outside the kernel's grid"));
  }
  if (w.data == nullptr || w.scale_inv == nullptr || t == nullptr || t_scales == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": null pointer"));
  }
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_transpose_blocks(
      w.data, w.scale_inv, w.rows, w.cols, gemm_scale_ld(w.mode, w.rows, w.cols), t, t_scales,
      gemm_scale_ld(ScalingMode::kBlock128x128, w.cols, w.rows), to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status fill_zero(void* dst, int64_t bytes, Stream stream) {
  if (bytes < 0) return absl::InvalidArgumentError("cuda::fill_zero: negative size");
  if (bytes == 0) return absl::OkStatus();
  FP8RL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), to_cuda(stream)));
  return absl::OkStatus();
}

}  // namespace fp8rl::kernels::cuda
