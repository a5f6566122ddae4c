// Launchers of the optimizer kernels (optim_kernels.cu), kept free of absl so nvcc only sees plain
// C++; optim_cuda.cc validates arguments and turns the results into absl::Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/device_math/adamw.h"

namespace fp8rl::kernels::cuda::internal {

// Blocks of the first sum-of-squares pass for n elements: min(kSumSquaresMaxBlocks,
// ceil(n / 256)), a function of n alone, so the summation order is fixed by n.
inline constexpr int64_t kSumSquaresMaxBlocks = 1024;
int64_t sum_squares_blocks(int64_t n);

// g[i] *= scale; partials[b] = double sum of g[i]^2 of block b; *out = sum of the partials.
// partials holds sum_squares_blocks(n) doubles, out one (device memory).
cudaError_t launch_scale_and_sum_squares(float* g, int64_t n, float scale, double* partials,
                                         double* out, cudaStream_t stream);
// g[i] *= clip; adamw_update(g[i], decay, c, p[i], m[i], v[i]).
cudaError_t launch_adamw(float* p, float* m, float* v, float* g, int64_t n, float clip, bool decay,
                         dm::AdamWCoeffs c, cudaStream_t stream);
// *slot = max(*slot, |x[i]|), NaN skipped (atomic max over the bits of non-negative floats).
cudaError_t launch_amax_into(const float* x, int64_t n, float* slot, cudaStream_t stream);
// The same over bf16 bits.
cudaError_t launch_amax_into_bf16(const uint16_t* x, int64_t n, float* slot, cudaStream_t stream);
// out[i] = bf16 bits of x[i].
cudaError_t launch_round_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

}  // namespace fp8rl::kernels::cuda::internal
