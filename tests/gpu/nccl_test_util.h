// Helpers of the NCCL collective tests: the visible CUDA devices and random non-zero test data.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace fp8rl::train::nccl_test {

inline int device_count() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) return 0;
  return devices;
}

// Rank r's array: random floats of mixed sign and magnitudes 2^-6..2^6, from seed (r, n).
inline std::vector<float> data_of(int r, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * r + n));
  std::uniform_real_distribution<float> mag(-6.0f, 6.0f);
  std::uniform_int_distribution<int> sign(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = (sign(gen) ? 1.0f : -1.0f) * std::exp2(mag(gen));
  return v;
}

}  // namespace fp8rl::train::nccl_test
