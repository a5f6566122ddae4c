// The backward of RMSNorm (device_math/rmsnorm.h), shared by the CPU reference and the CUDA
// kernels: the input gradient of one row, and the weight gradient of one column over rows.
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// Forward: y = x * inv * g, inv = (mean(x^2) + eps)^-1/2, so d inv / dx_i = -inv^3 x_i / h and
//   dx_i = dy_i g_i inv - (sum_j dy_j g_j x_j) inv^3 x_i / h.
// The sum runs in double in index order; the rest in fp32 (model/ops.cc rmsnorm_backward's
// arithmetic, value for value). x, g, dy, dx are [h].
FP8RL_HD void rmsnorm_bwd_row(const float* x, const float* g, float inv, const float* dy, int64_t h,
                              float* dx) {
  double s = 0.0;
  for (int64_t i = 0; i < h; ++i) s += static_cast<double>(dy[i]) * g[i] * x[i];
  const float c = static_cast<float>(s) * inv * inv * inv / static_cast<float>(h);
  for (int64_t i = 0; i < h; ++i) dx[i] = dy[i] * g[i] * inv - c * x[i];
}

// dg[col] += dy[r][col] * x[r][col] * inv[r] over rows r = 0..rows-1 in order (rows of width h):
// the accumulation order of model/ops.cc rmsnorm_backward, one column at a time.
FP8RL_HD void rmsnorm_bwd_dg_col(const float* x, const float* inv, const float* dy, int64_t rows,
                                 int64_t h, int64_t col, float* dg) {
  float acc = dg[col];
  for (int64_t r = 0; r < rows; ++r) acc += dy[r * h + col] * x[r * h + col] * inv[r];
  dg[col] = acc;
}

}  // namespace fp8rl::kernels::dm
