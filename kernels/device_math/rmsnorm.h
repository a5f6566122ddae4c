// RMSNorm of one row, shared by the CPU reference and the CUDA kernel.
#pragma once

#include <cstdint>

#include "kernels/device_math/dot.h"
#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// y[i] = x[i] * inv * g[i], inv = 1 / sqrt(dot8(x, x) / h + eps); x, y, g are [h]. Returns inv.
// round_bf16: y is rounded to BF16 afterwards (the bf16-activation policy's rounding point).
// Bit-identical to model/ops.cc rmsnorm_forward (+ round_bf16_inplace).
FP8RL_HD float rmsnorm_row(const float* x, const float* g, int64_t h, float eps, bool to_bf16,
                           float* y) {
  const float ms = dot8(x, FloatRow{x}, h) / static_cast<float>(h);
  const float inv = 1.0f / sqrt_f32(ms + eps);
  for (int64_t i = 0; i < h; ++i) {
    const float v = x[i] * inv * g[i];
    y[i] = to_bf16 ? round_bf16(v) : v;
  }
  return inv;
}

}  // namespace fp8rl::kernels::dm
