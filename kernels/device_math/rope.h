// Rotary position embedding (HF "rotate half" layout) of one element pair, shared by the CPU
// reference and the CUDA kernel. The cos/sin tables are filled on the host (model/ops.cc
// rope_fill) and read by both.
#pragma once

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// The pair (v[i], v[i + half]) of one head rotated by the angle whose cos/sin are c, s:
//   v[i] = a*c - b*s,  v[i+half] = b*c + a*s   (a = v[i], b = v[i+half]).
// Bit-identical to model/ops.cc rope_apply (forward) when the kernels run with --fmad=false.
FP8RL_HD void rope_rotate_pair(float& a, float& b, float c, float s) {
  const float x0 = a, x1 = b;
  a = x0 * c - x1 * s;
  b = x1 * c + x0 * s;
}

}  // namespace fp8rl::kernels::dm
