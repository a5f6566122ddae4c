// The backward of the rotary embedding (device_math/rope.h), shared by the CPU reference and the
// CUDA kernel: the transposed rotation of one element pair.
#pragma once

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// Forward: (a, b) -> (a c - b s, b c + a s). Its transpose applied to the gradient pair:
//   da = a c + b s,  db = b c - a s   (model/ops.cc rope_apply with inverse = true).
FP8RL_HD void rope_unrotate_pair(float& a, float& b, float c, float s) {
  const float x0 = a, x1 = b;
  a = x0 * c + x1 * s;
  b = x1 * c - x0 * s;
}

}  // namespace fp8rl::kernels::dm
