// Optimizer kernels of the device trainer: the scaled gradient's sum of squares (global-norm
// clipping) in a fixed order, the AdamW element update shared with the CPU optimizer
// (kernels/device_math/adamw.h; compiled with --fmad=false, so bit-identical per element), the
// per-layer K/V amax of KV calibration, and bf16 rounding for export.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/optim_launch.h"
#include "kernels/device_math/adamw.h"
#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGrid = 65535 * 8;  // plenty of blocks for a grid-stride loop

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxGrid ? kMaxGrid : blocks));
}

// A fixed tree over the block's kThreads doubles in shared memory.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

// Thread t of block b sums, in index order, elements i = b * 256 + t + k * (blocks * 256).
__global__ void scale_sum_squares_kernel(float* __restrict__ g, int64_t n, float scale,
                                         double* __restrict__ partials) {
  __shared__ double shared[kThreads];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  double acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const float x = g[i] * scale;
    g[i] = x;
    acc += static_cast<double>(x) * static_cast<double>(x);  // exact: a float squared fits
  }
  const double s = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: thread t sums partials t, t + 256, ... in order, then the same fixed tree.
__global__ void sum_partials_kernel(const double* __restrict__ partials, int64_t count,
                                    double* __restrict__ out) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) acc += partials[i];
  const double s = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = s;
}

__global__ void adamw_kernel(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                             float* __restrict__ g, int64_t n, float clip, bool decay,
                             dm::AdamWCoeffs c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float gi = g[i] * clip;
    g[i] = gi;
    float pi = p[i], mi = m[i], vi = v[i];
    dm::adamw_update(gi, decay, c, pi, mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// fmaxf returns the other operand for a NaN, so NaN is skipped as the CPU's std::max does; +-inf
// is kept. Non-negative floats order as their bit patterns, so an integer atomicMax is the float
// max and the result does not depend on the order of the blocks.
__device__ __forceinline__ float load_f32(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float load_f32(const uint16_t* x, int64_t i) {
  return dm::bf16_to_float(x[i]);
}

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, float* slot) {
  __shared__ float shared[kThreads];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float acc = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    acc = fmaxf(acc, fabsf(load_f32(x, i)));
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicMax(reinterpret_cast<unsigned int*>(slot), __float_as_uint(shared[0]));
  }
}

__global__ void round_bf16_kernel(const float* __restrict__ x, int64_t n,
                                  uint16_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = dm::float_to_bf16(x[i]);
  }
}

}  // namespace

int64_t sum_squares_blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return blocks < 1 ? 1 : (blocks > kSumSquaresMaxBlocks ? kSumSquaresMaxBlocks : blocks);
}

cudaError_t launch_scale_and_sum_squares(float* g, int64_t n, float scale, double* partials,
                                         double* out, cudaStream_t stream) {
  const int64_t blocks = sum_squares_blocks(n);
  scale_sum_squares_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(g, n, scale,
                                                                                   partials);
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, out);
  return cudaGetLastError();
}

cudaError_t launch_adamw(float* p, float* m, float* v, float* g, int64_t n, float clip, bool decay,
                         dm::AdamWCoeffs c, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, m, v, g, n, clip, decay, c);
  return cudaGetLastError();
}

cudaError_t launch_amax_into(const float* x, int64_t n, float* slot, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  amax_kernel<float><<<grid_for(n), kThreads, 0, stream>>>(x, n, slot);
  return cudaGetLastError();
}

cudaError_t launch_amax_into_bf16(const uint16_t* x, int64_t n, float* slot, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  amax_kernel<uint16_t><<<grid_for(n), kThreads, 0, stream>>>(x, n, slot);
  return cudaGetLastError();
}

cudaError_t launch_round_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  round_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

}  // namespace fp8rl::kernels::cuda::internal
