// The order in which a CUDA warp's xor-butterfly reduction adds its 32 lanes' values, written as
// plain loops so CPU references of the block-parallel kernels reproduce it exactly.
#pragma once

namespace fp8rl::kernels::dm {

inline constexpr int kWarpLanes = 32;

// The sum a warp computes with v = v + __shfl_xor_sync(~0u, v, off) for off = 16, 8, 4, 2, 1:
// every lane ends with the same value (IEEE addition commutes), this one. v32[i] is lane i's.
template <typename T>
T tree_sum32(const T* v32) {
  T v[kWarpLanes];
  for (int i = 0; i < kWarpLanes; ++i) v[i] = v32[i];
  for (int off = kWarpLanes / 2; off >= 1; off /= 2) {
    T next[kWarpLanes];
    for (int i = 0; i < kWarpLanes; ++i) next[i] = v[i] + v[i ^ off];
    for (int i = 0; i < kWarpLanes; ++i) v[i] = next[i];
  }
  return v[0];
}

}  // namespace fp8rl::kernels::dm
