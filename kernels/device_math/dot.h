// The deterministic dot product of the decoder (8 lanes, fixed pairwise combine), shared by the
// CPU reference and the CUDA kernels so both sum in the same order.
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// sum_i a[i] * b(i) over n, with b given by a loader (a pointer read, or a KV dequantization):
// lane l accumulates i = l, l+8, ...; the tail continues lanes 0.. in order; the lanes combine as
// ((0+1)+(2+3))+((4+5)+(6+7)). Bit-identical to model/ops.cc dot when b(i) returns b[i].
template <typename LoadB>
FP8RL_HD float dot8(const float* a, const LoadB& b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b(i + l);
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Reads b[i] from a plain float array.
struct FloatRow {
  const float* p;
  FP8RL_HD float operator()(int64_t i) const { return p[i]; }
};

}  // namespace fp8rl::kernels::dm
