// FP8 quantization kernels of the CUDA path: 1x128 tiles, 128x128 blocks, per-tensor, and the KV
// cache's given-scale form. Every code is e4m3(x / scale_inv) with a true fp32 division and the
// saturating CUDA conversion, so the results match the CPU reference bit for bit.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/quantize_launch.h"

namespace fp8rl::kernels::cuda::internal {
namespace {

constexpr int kTile = 128;
constexpr int kWarp = 32;
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr float kE4M3MaxF = 448.0f;
constexpr int kMinPow2Exponent = -149;  // 2^-149, the smallest positive float

// ---- kernels ------------------------------------------------------------------------------------

// The recipe's scale, exactly as kernels/quantize.cc compute_scale_inv: an amax that is 0 (or
// not positive and finite) gives 1; otherwise amax / 448 as an fp32 division, with an underflow to
// 0 replaced by the smallest subnormal; with pow2 the smallest 2^k (k >= -149) such that
// 448 * 2^k >= amax, decided exactly in double precision.
__device__ __forceinline__ float scale_inv_from_amax(float amax, bool pow2) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return 1.0f;
  if (!pow2) {
    const float s = __fdiv_rn(amax, kE4M3MaxF);
    return s > 0.0f ? s : __int_as_float(1);  // denorm_min
  }
  int k = 0;
  frexp(static_cast<double>(amax) / 448.0, &k);  // amax/448 in [2^(k-1), 2^k)
  while (ldexp(448.0, k) < static_cast<double>(amax)) ++k;
  while (ldexp(448.0, k - 1) >= static_cast<double>(amax)) --k;
  return static_cast<float>(ldexp(1.0, k < kMinPow2Exponent ? kMinPow2Exponent : k));
}

// |v| if it is finite, else 0: the CPU's amax ignores NaN and +-inf.
__device__ __forceinline__ float finite_abs(float v) {
  const float a = fabsf(v);
  return a <= FLT_MAX ? a : 0.0f;
}

__device__ __forceinline__ uint8_t encode(float x, float scale_inv) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(__fdiv_rn(x, scale_inv), __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float decode(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  return v;
}

// One warp per (row r, tile kb); lane l holds columns kb*128 + 4l .. 4l+3. Tiles are numbered
// t = r * n_tiles + kb over the padded rows; padded rows only write their 1.0f scale.
__global__ void quantize_tile1x128_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                                          int64_t n_tiles, int64_t scale_ld, bool pow2, bool vec_ok,
                                          uint8_t* __restrict__ q, float* __restrict__ scale_inv) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= scale_ld * n_tiles) return;
  const int64_t r = t / n_tiles;
  const int64_t kb = t % n_tiles;
  if (r >= rows) {
    if (lane == 0) scale_inv[kb * scale_ld + r] = 1.0f;
    return;
  }
  const int64_t c0 = kb * kTile + lane * 4;
  const float* row = x + r * cols;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int n_valid = 0;
  if (c0 < cols) {
    if (vec_ok) {
      const float4 f = *reinterpret_cast<const float4*>(row + c0);
      v[0] = f.x;
      v[1] = f.y;
      v[2] = f.z;
      v[3] = f.w;
      n_valid = 4;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (c0 + i < cols) {
          v[i] = row[c0 + i];
          n_valid = i + 1;
        }
      }
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (i < n_valid) amax = fmaxf(amax, finite_abs(v[i]));
  }
  amax = warp_max(amax);
  const float s = scale_inv_from_amax(amax, pow2);
  if (lane == 0) scale_inv[kb * scale_ld + r] = s;
  uint8_t* out = q + r * cols + c0;
  if (n_valid == 4 && vec_ok) {
    const uint32_t packed = static_cast<uint32_t>(encode(v[0], s)) |
                            (static_cast<uint32_t>(encode(v[1], s)) << 8) |
                            (static_cast<uint32_t>(encode(v[2], s)) << 16) |
                            (static_cast<uint32_t>(encode(v[3], s)) << 24);
    *reinterpret_cast<uint32_t*>(out) = packed;
  } else {
    for (int i = 0; i < n_valid; ++i) out[i] = encode(v[i], s);
  }
}

// One thread block per 128x128 block; thread (w, l) holds rows w + 8i (i < 16) and columns
// 4l .. 4l+3 of the block in registers, so the input is read once.
__global__ void quantize_block128x128_kernel(const float* __restrict__ x, int64_t rows,
                                             int64_t cols, int64_t scale_ld, bool pow2, bool vec_ok,
                                             uint8_t* __restrict__ q,
                                             float* __restrict__ scale_inv) {
  constexpr int kRowsPerThread = kTile / kWarpsPerBlock;  // 16
  __shared__ float warp_amax[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t kb = blockIdx.x;
  const int64_t rb = blockIdx.y;
  const int64_t c0 = kb * kTile + lane * 4;
  const int n_cols = c0 < cols ? static_cast<int>(cols - c0 < 4 ? cols - c0 : 4) : 0;

  float v[kRowsPerThread][4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = rb * kTile + warp + kWarpsPerBlock * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) v[i][j] = 0.0f;
    if (r >= rows || n_cols == 0) continue;
    const float* src = x + r * cols + c0;
    if (vec_ok && n_cols == 4) {
      const float4 f = *reinterpret_cast<const float4*>(src);
      v[i][0] = f.x;
      v[i][1] = f.y;
      v[i][2] = f.z;
      v[i][3] = f.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j < n_cols) v[i][j] = src[j];
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < n_cols) amax = fmaxf(amax, finite_abs(v[i][j]));
    }
  }
  amax = warp_max(amax);
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  float block_amax = warp_amax[0];
#pragma unroll
  for (int w = 1; w < kWarpsPerBlock; ++w) block_amax = fmaxf(block_amax, warp_amax[w]);
  const float s = scale_inv_from_amax(block_amax, pow2);
  if (threadIdx.x == 0) {
    scale_inv[rb * scale_ld + kb] = s;
    // The last block column also writes this block row's padding.
    if (kb == gridDim.x - 1) {
      for (int64_t p = gridDim.x; p < scale_ld; ++p) scale_inv[rb * scale_ld + p] = 1.0f;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = rb * kTile + warp + kWarpsPerBlock * i;
    if (r >= rows || n_cols == 0) continue;
    uint8_t* out = q + r * cols + c0;
    if (vec_ok && n_cols == 4) {
      const uint32_t packed = static_cast<uint32_t>(encode(v[i][0], s)) |
                              (static_cast<uint32_t>(encode(v[i][1], s)) << 8) |
                              (static_cast<uint32_t>(encode(v[i][2], s)) << 16) |
                              (static_cast<uint32_t>(encode(v[i][3], s)) << 24);
      *reinterpret_cast<uint32_t*>(out) = packed;
    } else {
      for (int j = 0; j < n_cols; ++j) out[j] = encode(v[i][j], s);
    }
  }
}

// Finite amax of n elements into *amax_bits (fp32 bits of a non-negative value compare like
// unsigned integers).
__global__ void amax_kernel(const float* __restrict__ x, int64_t n, unsigned int* amax_bits) {
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    m = fmaxf(m, finite_abs(x[i]));
  }
  m = warp_max(m);
  if (threadIdx.x % kWarp == 0) atomicMax(amax_bits, __float_as_uint(m));
}

__global__ void amax_to_scale_kernel(float* scale_inv, bool pow2) {
  const float amax = __uint_as_float(*reinterpret_cast<unsigned int*>(scale_inv));
  scale_inv[0] = scale_inv_from_amax(amax, pow2);
}

__global__ void quantize_scaled_kernel(const float* __restrict__ x, int64_t n,
                                       const float* __restrict__ scale_ptr, float scale,
                                       uint8_t* __restrict__ q) {
  const float s = scale_ptr != nullptr ? *scale_ptr : scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    q[i] = encode(x[i], s);
  }
}

__global__ void dequantize_scaled_kernel(const uint8_t* __restrict__ q, int64_t n, float scale,
                                         float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = __fmul_rn(decode(q[i]), scale);
  }
}

__global__ void dequantize_kernel(const uint8_t* __restrict__ q, int64_t rows, int64_t cols,
                                  int mode, const float* __restrict__ scale_inv, int64_t scale_ld,
                                  float* __restrict__ out) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t r = i / cols;
    const int64_t c = i % cols;
    float s;
    if (mode == 1) {
      s = scale_inv[(c / kTile) * scale_ld + r];
    } else if (mode == 2) {
      s = scale_inv[(r / kTile) * scale_ld + c / kTile];
    } else {
      s = scale_inv[0];
    }
    out[i] = __fmul_rn(decode(q[i]), s);
  }
}

// out[c, r] = in[r, c] for a [rows, cols] byte matrix, through 32x32 tiles in shared memory.
__global__ void transpose_u8_kernel(const uint8_t* __restrict__ in, int64_t rows, int64_t cols,
                                    uint8_t* __restrict__ out) {
  __shared__ uint8_t tile[32][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = static_cast<int64_t>(blockIdx.y) * 32 + i;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  const int64_t r_out = static_cast<int64_t>(blockIdx.y) * 32 + threadIdx.x;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c_out = static_cast<int64_t>(blockIdx.x) * 32 + i;
    if (c_out < cols && r_out < rows) out[c_out * rows + r_out] = tile[threadIdx.x][i];
  }
}

// Block scales of W [block_rows][ld_in] -> those of W^T [block_cols][ld_out], padding 1.0f.
__global__ void transpose_block_scales_kernel(const float* __restrict__ in, int64_t block_rows,
                                              int64_t block_cols, int64_t ld_in,
                                              float* __restrict__ out, int64_t ld_out) {
  const int64_t n = block_cols * ld_out;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bc = i / ld_out;
    const int64_t br = i % ld_out;
    out[i] = br < block_rows ? in[br * ld_in + bc] : 1.0f;
  }
}

// ---- launch helpers -----------------------------------------------------------------------------

unsigned int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  constexpr int64_t kMaxBlocks = 132 * 16;  // enough to fill an H100/H200 for grid-stride loops
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

cudaError_t launch_quantize_tile1x128(const float* x, int64_t rows, int64_t cols, bool pow2,
                                      uint8_t* q, float* scale_inv, int64_t scale_ld,
                                      cudaStream_t stream) {
  const int64_t n_tiles = (cols + kTile - 1) / kTile;
  const int64_t warps = scale_ld * n_tiles;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const bool vec_ok = cols % 4 == 0 && aligned(x, 16) && aligned(q, 4);
  quantize_tile1x128_kernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      x, rows, cols, n_tiles, scale_ld, pow2, vec_ok, q, scale_inv);
  return cudaGetLastError();
}

cudaError_t launch_quantize_block128x128(const float* x, int64_t rows, int64_t cols, bool pow2,
                                         uint8_t* q, float* scale_inv, int64_t scale_ld,
                                         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>((cols + kTile - 1) / kTile),
                  static_cast<unsigned int>((rows + kTile - 1) / kTile));
  const bool vec_ok = cols % 4 == 0 && aligned(x, 16) && aligned(q, 4);
  quantize_block128x128_kernel<<<grid, kThreads, 0, stream>>>(x, rows, cols, scale_ld, pow2, vec_ok,
                                                              q, scale_inv);
  return cudaGetLastError();
}

cudaError_t launch_quantize_per_tensor(const float* x, int64_t n, bool pow2, uint8_t* q,
                                       float* scale_inv, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(scale_inv, 0, sizeof(float), stream);
  if (err != cudaSuccess) return err;
  amax_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n,
                                                    reinterpret_cast<unsigned int*>(scale_inv));
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  amax_to_scale_kernel<<<1, 1, 0, stream>>>(scale_inv, pow2);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  quantize_scaled_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, scale_inv, 0.0f, q);
  return cudaGetLastError();
}

cudaError_t launch_quantize_with_scale(const float* x, int64_t n, float scale, uint8_t* q,
                                       cudaStream_t stream) {
  quantize_scaled_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, nullptr, scale, q);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_with_scale(const uint8_t* q, int64_t n, float scale, float* out,
                                         cudaStream_t stream) {
  dequantize_scaled_kernel<<<grid_for(n), kThreads, 0, stream>>>(q, n, scale, out);
  return cudaGetLastError();
}

cudaError_t launch_dequantize(const uint8_t* q, int64_t rows, int64_t cols, int mode,
                              const float* scale_inv, int64_t scale_ld, float* out,
                              cudaStream_t stream) {
  dequantize_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(q, rows, cols, mode, scale_inv,
                                                                    scale_ld, out);
  return cudaGetLastError();
}

cudaError_t launch_transpose_blocks(const uint8_t* w, const float* w_scales, int64_t rows,
                                    int64_t cols, int64_t ld_in, uint8_t* t, float* t_scales,
                                    int64_t ld_out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32),
                  static_cast<unsigned int>((rows + 31) / 32));
  transpose_u8_kernel<<<grid, dim3(32, 8), 0, stream>>>(w, rows, cols, t);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t block_rows = (rows + kTile - 1) / kTile;
  const int64_t block_cols = (cols + kTile - 1) / kTile;
  transpose_block_scales_kernel<<<grid_for(block_cols * ld_out), kThreads, 0, stream>>>(
      w_scales, block_rows, block_cols, ld_in, t_scales, ld_out);
  return cudaGetLastError();
}

}  // namespace fp8rl::kernels::cuda::internal
