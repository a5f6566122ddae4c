// The backward of the temperature log-softmax at a target (the token logprob), and the KV cache
// format round trip of the training forward, shared by the CPU reference and the CUDA kernels.
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// logprob = z[target] / T - lse, lse = log sum_j exp(z[j] / T). With upstream gradient g:
//   dz[j] = -g exp(z[j] / T - lse) / T  (+ g / T at the target)
// the training backward's lm_head expressions (inv_t = 1 / T).
FP8RL_HD float logprob_dlogit(float z, bool is_target, float g, float inv_t, float lse) {
  float d = -g * exp_f32(z * inv_t - lse) * inv_t;
  if (is_target) d += g * inv_t;
  return d;
}

// x through a KV cache element of `dtype` and back (model/kv_cache.h kv_round_trip): fp8 as
// e4m3(x / scale) * scale, bf16 rounded, fp32 unchanged.
FP8RL_HD float kv_round_trip(float x, KvDtype dtype, float scale) {
  switch (dtype) {
    case KvDtype::kBF16:
      return round_bf16(x);
    case KvDtype::kFP8:
      return e4m3_to_float(float_to_e4m3(x / scale)) * scale;
    default:
      return x;
  }
}

}  // namespace fp8rl::kernels::dm
