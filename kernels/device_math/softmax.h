// Log-softmax over a vocabulary row, shared by the CPU reference and the CUDA kernels (scoring
// logprobs and the sampler).
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// log(sum_i exp(z[i] * inv_t)) over n logits: fp32 max, float64 sum of exp in index order, as
// model/ops.cc logsumexp_scaled. log softmax(z / T)[i] = z[i] * inv_t - lse.
FP8RL_HD float logsumexp_scaled(const float* z, int64_t n, float inv_t) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float v = z[i] * inv_t;
    mx = mx < v ? v : mx;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += exp_f64(static_cast<double>(z[i] * inv_t - mx));
  return mx + static_cast<float>(log_f64(sum));
}

}  // namespace fp8rl::kernels::dm
