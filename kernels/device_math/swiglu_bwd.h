// The backward of SwiGLU (device_math/swiglu.h), shared by the CPU reference and the CUDA kernel.
#pragma once

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// act = silu(g) u, silu(g) = g sig(g): du = dact silu(g), dg = dact u sig (1 + g (1 - sig)).
// model/ops.cc swiglu_backward's expressions (exp differs by a few ulp between host and device).
FP8RL_HD void swiglu_bwd(float g, float u, float dact, float* dg, float* du) {
  const float sig = 1.0f / (1.0f + exp_f32(-g));
  const float silu = g * sig;
  *du = dact * silu;
  *dg = dact * u * sig * (1.0f + g * (1.0f - sig));
}

}  // namespace fp8rl::kernels::dm
