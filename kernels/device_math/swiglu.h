// SwiGLU's elementwise product, shared by the CPU reference and the CUDA kernel.
#pragma once

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// silu(g) * u = (g * sigmoid(g)) * u, sigmoid(g) = 1 / (1 + exp(-g)); the same expression as
// model/ops.cc swiglu_forward (exp differs by a few ulp between glibc and the device).
FP8RL_HD float swiglu(float g, float u) {
  const float sig = 1.0f / (1.0f + exp_f32(-g));
  return g * sig * u;
}

}  // namespace fp8rl::kernels::dm
