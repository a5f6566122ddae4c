// The decoder's non-GEMM kernels: each is an index mapping around the shared math of
// kernels/device_math (the same functions kernels/cpu/decoder_ops.cc calls). Two families:
//   - the simple kernels, one thread per element, per row or per (row, head): the mapping that is
//     obviously right, in the CPU reference's order;
//   - the block-parallel ones (split-context paged decode attention, per-row log-softmax and
//     sampling), whose summation order is written out as plain loops in
//     kernels/device_math/attention_split.h and sampling_blocked.h, their CPU references.
// decoder_cuda.cc picks one per call (DecoderKernels). Compiled with --fmad=false (kernels/cuda/
// CMakeLists.txt) so a*b+c rounds twice, as on the host. All of them ran on an H200 against the CPU
// references (docs/results/gpu-check-2026-12-04.md).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/decoder_launch.h"
#include "kernels/device_math/attention.h"
#include "kernels/device_math/attention_split.h"
#include "kernels/device_math/rmsnorm.h"
#include "kernels/device_math/rope.h"
#include "kernels/device_math/sampling_blocked.h"
#include "kernels/device_math/softmax.h"
#include "kernels/device_math/swiglu.h"

namespace fp8rl::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;

unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>((n + kThreads - 1) / kThreads);
}

__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// x[r, i] = table[tokens[r], i]; one thread per element. Bad ids give NaN rows, counted once.
__global__ void embed_gather_kernel(const float* __restrict__ table, int64_t vocab, int64_t h,
                                    const int32_t* __restrict__ tokens, int64_t rows,
                                    float* __restrict__ x, int32_t* bad_count) {
  const int64_t t = global_index();
  if (t >= rows * h) return;
  const int64_t r = t / h, i = t % h;
  const int32_t tok = tokens[r];
  if (tok < 0 || tok >= vocab) {
    x[t] = NAN;
    if (i == 0 && bad_count != nullptr) atomicAdd(bad_count, 1);
    return;
  }
  x[t] = table[static_cast<int64_t>(tok) * h + i];
}

// One thread per row.
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ g,
                               int64_t rows, int64_t h, float eps, bool to_bf16,
                               float* __restrict__ y, float* __restrict__ inv_rms) {
  const int64_t r = global_index();
  if (r >= rows) return;
  const float inv = dm::rmsnorm_row(x + r * h, g, h, eps, to_bf16, y + r * h);
  if (inv_rms != nullptr) inv_rms[r] = inv;
}

// One thread per (row, head, pair i < head_dim / 2).
__global__ void rope_kernel(const float* __restrict__ cos, const float* __restrict__ sin,
                            const int32_t* __restrict__ pos, int64_t rows, int64_t heads,
                            int64_t head_dim, bool to_bf16, float* __restrict__ x) {
  const int64_t half = head_dim / 2;
  const int64_t t = global_index();
  if (t >= rows * heads * half) return;
  const int64_t i = t % half, rh = t / half, r = rh / heads;
  float* v = x + rh * head_dim;
  const int64_t at = static_cast<int64_t>(pos[r]) * half + i;
  float a = v[i], b = v[i + half];
  dm::rope_rotate_pair(a, b, cos[at], sin[at]);
  v[i] = to_bf16 ? dm::round_bf16(a) : a;
  v[i + half] = to_bf16 ? dm::round_bf16(b) : b;
}

__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u, int64_t n,
                              bool to_bf16, float* __restrict__ act) {
  const int64_t i = global_index();
  if (i >= n) return;
  const float a = dm::swiglu(g[i], u[i]);
  act[i] = to_bf16 ? dm::round_bf16(a) : a;
}

// One thread per (row, head); the row's sequence is found by binary search in seq_start.
__global__ void attention_prefill_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v,
                                         const int32_t* __restrict__ seq_start, int64_t n_seq,
                                         int64_t rows, int64_t n_heads, int64_t n_kv,
                                         int64_t head_dim, float scale, float* __restrict__ out) {
  const int64_t t = global_index();
  if (t >= rows * n_heads) return;
  const int64_t r = t / n_heads, hh = t % n_heads;
  int64_t lo = 0, hi = n_seq - 1;  // the last s with seq_start[s] <= r
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (seq_start[mid] <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t r0 = seq_start[lo];
  const int64_t qd = n_heads * head_dim, kvd = n_kv * head_dim, g = hh / (n_heads / n_kv);
  const dm::FloatRows keys{k + r0 * kvd + g * head_dim, kvd};
  const dm::FloatRows values{v + r0 * kvd + g * head_dim, kvd};
  dm::attend_row(q + r * qd + hh * head_dim, keys, values, r - r0 + 1, head_dim, scale,
                 out + r * qd + hh * head_dim);
}

// One thread per (row, kv head, element).
__global__ void kv_write_paged_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                      int64_t rows, const int32_t* __restrict__ row_seq,
                                      const int32_t* __restrict__ row_pos, dm::PagedKvView kv) {
  const int64_t kvd = kv.n_kv * kv.head_dim;
  const int64_t t = global_index();
  if (t >= rows * kvd) return;
  const int64_t r = t / kvd, g = (t % kvd) / kv.head_dim, d = t % kv.head_dim;
  const int64_t off = dm::paged_kv_offset(kv, row_seq[r], row_pos[r], g) + d;
  dm::kv_store(kv.k_pool, off, kv.dtype, kv.k_scale, k[t]);
  dm::kv_store(kv.v_pool, off, kv.dtype, kv.v_scale, v[t]);
}

// One thread per (row, head); keys/values dequantized inside the dot product.
__global__ void attention_paged_kernel(const float* __restrict__ q, int64_t rows,
                                       const int32_t* __restrict__ row_seq,
                                       const int32_t* __restrict__ row_pos, dm::PagedKvView kv,
                                       int64_t n_heads, float scale, float* __restrict__ out) {
  const int64_t t = global_index();
  if (t >= rows * n_heads) return;
  const int64_t r = t / n_heads, hh = t % n_heads;
  const int64_t s = row_seq[r], hd = kv.head_dim, g = hh / (n_heads / kv.n_kv);
  const dm::PagedRows keys{&kv, kv.k_pool, kv.k_scale, s, g};
  const dm::PagedRows values{&kv, kv.v_pool, kv.v_scale, s, g};
  dm::attend_row(q + (r * n_heads + hh) * hd, keys, values, static_cast<int64_t>(row_pos[r]) + 1,
                 hd, scale, out + (r * n_heads + hh) * hd);
}

// ---- split-context paged decode attention (dm::attend_row_split's order) ----
// Ran on an H200 (2026-12-04); tests/gpu/decoder_cuda_test.cc checks it against
// cpu::attention_paged_split when a device is present.

constexpr int kWarp = 32;
constexpr int kSplitThreads = dm::kDecodeStripes * kWarp;
constexpr int kSplitDimsPerLane = dm::kSplitMaxHeadDim / kWarp;
static_assert(dm::kSplitTile == kWarp, "one position per lane");

// x[0..8) = elements off..off+7 of a pool of element type D, dequantized as dm::kv_load does.
// off is a multiple of 8 and the pool 16-byte aligned (checked on the host), so one 8-byte (fp8),
// 16-byte (bf16) or two 16-byte (fp32) loads.
template <dm::KvDtype D>
__device__ __forceinline__ void kv_load8(const void* pool, int64_t off, float scale,
                                         float (&x)[8]) {
  if constexpr (D == dm::KvDtype::kFP8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(pool) + off);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[i] = dm::e4m3_to_float(static_cast<uint8_t>(raw.x >> (8 * i))) * scale;
      x[4 + i] = dm::e4m3_to_float(static_cast<uint8_t>(raw.y >> (8 * i))) * scale;
    }
  } else if constexpr (D == dm::KvDtype::kBF16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(pool) + off);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = dm::bf16_to_float(static_cast<uint16_t>(w[i] & 0xFFFFu));
      x[2 * i + 1] = dm::bf16_to_float(static_cast<uint16_t>(w[i] >> 16));
    }
  } else {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(pool) + off);
    const float4 a = p[0], b = p[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  }
}

template <dm::KvDtype D>
__device__ __forceinline__ float kv_load1(const void* pool, int64_t off, float scale) {
  return dm::kv_load(pool, off, D, scale);  // D is a constant: the switch folds away
}

// The split-context attention of one query row (q_row[hd] -> out_row[hd]) over positions
// j < n, row j of the keys / values at element offset row_offset(j) of k_pool / v_pool (element
// type D): one block of kDecodeStripes warps. Warp w takes the 32-position tiles t with
// t % kDecodeStripes == w; lane i scores position 32 t + i (a whole dot8 over head_dim, q read
// from shared memory), the warp keeps an online softmax (m, l) and acc[head_dim], each lane owning
// dims lane, lane + 32, ...; the warps' states merge in shared memory in warp order. Needs
// hd % 8 == 0, hd <= kSplitMaxHeadDim, 16-byte aligned pools, row_offset(j) % 8 == 0
// (host-checked). Called by every thread of the block (it synchronizes).
template <dm::KvDtype D, typename RowOffset>
__device__ __forceinline__ void attend_row_split_block(const float* __restrict__ q_row,
                                                       const RowOffset& row_offset,
                                                       const void* k_pool, const void* v_pool,
                                                       float k_scale, float v_scale, int64_t n,
                                                       int64_t hd, float scale,
                                                       float* __restrict__ out_row) {
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  __shared__ float q_s[dm::kSplitMaxHeadDim];
  __shared__ float acc_s[dm::kDecodeStripes][dm::kSplitMaxHeadDim];
  __shared__ float m_s[dm::kDecodeStripes], l_s[dm::kDecodeStripes];
  for (int64_t d = threadIdx.x; d < hd; d += kSplitThreads) q_s[d] = q_row[d];
  __syncthreads();

  float m = -INFINITY, l = 0.0f;
  float acc[kSplitDimsPerLane];
#pragma unroll
  for (int c = 0; c < kSplitDimsPerLane; ++c) acc[c] = 0.0f;
  const int64_t tiles = (n + kWarp - 1) / kWarp;
  for (int64_t t = warp; t < tiles; t += dm::kDecodeStripes) {  // uniform within the warp
    const int64_t j0 = t * kWarp;
    const int count = n - j0 < kWarp ? static_cast<int>(n - j0) : kWarp;
    const bool valid = lane < count;
    int64_t off = 0;
    float sc = -INFINITY;
    if (valid) {
      off = row_offset(j0 + lane);
      float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 4
      for (int64_t i = 0; i < hd; i += 8) {  // loads of several chunks in flight
        float k8[8];
        kv_load8<D>(k_pool, off + i, k_scale, k8);
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] += q_s[i + e] * k8[e];
      }
      sc = (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) * scale;
    }
    float mt = sc;
#pragma unroll
    for (int o = kWarp / 2; o >= 1; o /= 2) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, mt, o);
      mt = other > mt ? other : mt;
    }
    const float m_new = mt > m ? mt : m;
    const float corr = dm::exp_f32(m - m_new);
    const float p = valid ? dm::exp_f32(sc - m_new) : 0.0f;
    float ps = p;
#pragma unroll
    for (int o = kWarp / 2; o >= 1; o /= 2) ps = ps + __shfl_xor_sync(0xFFFFFFFFu, ps, o);
    l = l * corr + ps;
#pragma unroll
    for (int c = 0; c < kSplitDimsPerLane; ++c) acc[c] = acc[c] * corr;
#pragma unroll 4
    for (int jj = 0; jj < count; ++jj) {  // count is uniform: every lane shuffles
      const float pj = __shfl_sync(0xFFFFFFFFu, p, jj);
      const int64_t vo = __shfl_sync(0xFFFFFFFFu, off, jj);
#pragma unroll
      for (int c = 0; c < kSplitDimsPerLane; ++c) {
        const int64_t d = c * kWarp + lane;
        if (d < hd) acc[c] = acc[c] + pj * kv_load1<D>(v_pool, vo + d, v_scale);
      }
    }
    m = m_new;
  }

  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < kSplitDimsPerLane; ++c) {
    const int64_t d = c * kWarp + lane;
    if (d < hd) acc_s[warp][d] = acc[c];
  }
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < dm::kDecodeStripes; ++w) mx = m_s[w] > mx ? m_s[w] : mx;
  float f[dm::kDecodeStripes];
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < dm::kDecodeStripes; ++w) {
    f[w] = dm::exp_f32(m_s[w] - mx);
    sum = sum + l_s[w] * f[w];
  }
  const float inv = 1.0f / sum;
  for (int64_t d = threadIdx.x; d < hd; d += kSplitThreads) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < dm::kDecodeStripes; ++w) o = o + acc_s[w][d] * f[w];
    out_row[d] = o * inv;
  }
}

// Row offsets in a paged pool: position j of sequence s, kv head g (dm::paged_kv_offset).
struct PagedRowOffset {
  const dm::PagedKvView* kv;
  int64_t s, g;
  __device__ int64_t operator()(int64_t j) const { return dm::paged_kv_offset(*kv, s, j, g); }
};

// Row offsets in a contiguous [rows, stride] matrix, starting at `base`.
struct ContiguousRowOffset {
  int64_t base, stride;
  __device__ int64_t operator()(int64_t j) const { return base + j * stride; }
};

// Paged decode / chunked prefill: one block per (row, head), row r attends to positions
// 0..row_pos[r] of sequence row_seq[r].
template <dm::KvDtype D>
__global__ void __launch_bounds__(kSplitThreads)
    attention_paged_split_kernel(const float* __restrict__ q, const int32_t* __restrict__ row_seq,
                                 const int32_t* __restrict__ row_pos, dm::PagedKvView kv,
                                 int64_t n_heads, float scale, float* __restrict__ out) {
  const int64_t rh = blockIdx.x;  // r * n_heads + hh
  const int64_t r = rh / n_heads, hh = rh % n_heads, hd = kv.head_dim;
  const PagedRowOffset rows{&kv, row_seq[r], hh / (n_heads / kv.n_kv)};
  attend_row_split_block<D>(q + rh * hd, rows, kv.k_pool, kv.v_pool, kv.k_scale, kv.v_scale,
                            static_cast<int64_t>(row_pos[r]) + 1, hd, scale, out + rh * hd);
}

// The first row of row r's sequence: seq_start[s] for the last s with seq_start[s] <= r.
__device__ __forceinline__ int64_t sequence_row0(const int32_t* __restrict__ seq_start,
                                                 int64_t n_seq, int64_t r) {
  int64_t lo = 0, hi = n_seq - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (seq_start[mid] <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return seq_start[lo];
}

constexpr int kPrefillTileRows = 4;  // query rows per block of the tiled prefill
static_assert(sizeof(float) * kPrefillTileRows * (dm::kDecodeStripes + 1) *
                          (dm::kSplitMaxHeadDim + 2) +
                      sizeof(float) * (dm::kDecodeStripes + 1) * (dm::kSplitMaxHeadDim + 2) <=
                  48 * 1024,
              "static shared memory of attention_prefill_tiled_kernel");

// Causal prefill over packed sequences (fp32 k, v), query-tiled: one block of kDecodeStripes warps
// per (tile of kPrefillTileRows consecutive rows, head). When the tile's rows share a sequence,
// each key/value row a lane loads serves all of them: the tile's q rows sit in shared memory,
// lane i of warp w scores position 32 t + i (t % kDecodeStripes == w) against every row of the
// tile, and each row keeps its own online softmax and merge -- for every row exactly the
// operations of attend_row_split_block (dm::attend_row_split's order), so the result is the same
// bits as the per-row paged kernel. A row skips the tiles past its causal end (no rescale). A
// tile that straddles sequences runs attend_row_split_block row by row.
__global__ void __launch_bounds__(kSplitThreads)
    attention_prefill_tiled_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                   const float* __restrict__ v,
                                   const int32_t* __restrict__ seq_start, int64_t n_seq,
                                   int64_t rows, int64_t n_heads, int64_t n_kv, int64_t head_dim,
                                   float scale, float* __restrict__ out) {
  constexpr int kQ = kPrefillTileRows;
  __shared__ float q_s[kQ][dm::kSplitMaxHeadDim];
  __shared__ float acc_s[kQ][dm::kDecodeStripes][dm::kSplitMaxHeadDim];
  __shared__ float m_s[kQ][dm::kDecodeStripes], l_s[kQ][dm::kDecodeStripes];
  const int64_t hd = head_dim, kvd = n_kv * hd;
  const int64_t tile = blockIdx.x / n_heads, hh = blockIdx.x % n_heads;
  const int64_t g = hh / (n_heads / n_kv);
  const int64_t r_first = tile * kQ;
  const int64_t r_last = (r_first + kQ < rows ? r_first + kQ : rows) - 1;
  const int64_t r0 = sequence_row0(seq_start, n_seq, r_first);
  if (sequence_row0(seq_start, n_seq, r_last) != r0) {  // uniform: the whole block branches
    for (int64_t r = r_first; r <= r_last; ++r) {
      const int64_t rs = sequence_row0(seq_start, n_seq, r), rh = r * n_heads + hh;
      const ContiguousRowOffset krows{rs * kvd + g * hd, kvd};
      attend_row_split_block<dm::KvDtype::kF32>(q + rh * hd, krows, k, v, 1.0f, 1.0f, r - rs + 1,
                                                hd, scale, out + rh * hd);
      __syncthreads();
    }
    return;
  }

  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  const int nq = static_cast<int>(r_last - r_first + 1);
  int64_t n_q[kQ];  // positions each row attends to; 0 for rows past the end
#pragma unroll
  for (int i = 0; i < kQ; ++i) n_q[i] = i < nq ? r_first + i - r0 + 1 : 0;
  const int64_t n_max = r_last - r0 + 1;
  for (int64_t x = threadIdx.x; x < kQ * hd; x += kSplitThreads) {
    const int64_t i = x / hd, d = x % hd;
    q_s[i][d] = i < nq ? q[((r_first + i) * n_heads + hh) * hd + d] : 0.0f;
  }
  __syncthreads();

  float m[kQ], l[kQ], acc[kQ][kSplitDimsPerLane];
#pragma unroll
  for (int i = 0; i < kQ; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kSplitDimsPerLane; ++c) acc[i][c] = 0.0f;
  }
  const ContiguousRowOffset krows{r0 * kvd + g * hd, kvd};
  const int64_t tiles = (n_max + kWarp - 1) / kWarp;
  for (int64_t t = warp; t < tiles; t += dm::kDecodeStripes) {  // uniform within the warp
    const int64_t j0 = t * kWarp;
    const int count_max = n_max - j0 < kWarp ? static_cast<int>(n_max - j0) : kWarp;
    int64_t off = 0;
    float a[kQ][8];
#pragma unroll
    for (int i = 0; i < kQ; ++i) {
#pragma unroll
      for (int e = 0; e < 8; ++e) a[i][e] = 0.0f;
    }
    if (lane < count_max) {
      off = krows(j0 + lane);
      for (int64_t x = 0; x < hd; x += 8) {
        float k8[8];
        kv_load8<dm::KvDtype::kF32>(k, off + x, 1.0f, k8);
#pragma unroll
        for (int i = 0; i < kQ; ++i) {
#pragma unroll
          for (int e = 0; e < 8; ++e) a[i][e] += q_s[i][x + e] * k8[e];
        }
      }
    }
    float p[kQ];
#pragma unroll
    for (int i = 0; i < kQ; ++i) {
      p[i] = 0.0f;
      if (n_q[i] - j0 <= 0) continue;  // past row i's causal end: uniform, state untouched
      const int count = n_q[i] - j0 < kWarp ? static_cast<int>(n_q[i] - j0) : kWarp;
      const bool valid = lane < count;
      const float sc = valid ? (((a[i][0] + a[i][1]) + (a[i][2] + a[i][3])) +
                                ((a[i][4] + a[i][5]) + (a[i][6] + a[i][7]))) *
                                   scale
                             : -INFINITY;
      float mt = sc;
#pragma unroll
      for (int o = kWarp / 2; o >= 1; o /= 2) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, mt, o);
        mt = other > mt ? other : mt;
      }
      const float m_new = mt > m[i] ? mt : m[i];
      const float corr = dm::exp_f32(m[i] - m_new);
      p[i] = valid ? dm::exp_f32(sc - m_new) : 0.0f;
      float ps = p[i];
#pragma unroll
      for (int o = kWarp / 2; o >= 1; o /= 2) ps = ps + __shfl_xor_sync(0xFFFFFFFFu, ps, o);
      l[i] = l[i] * corr + ps;
#pragma unroll
      for (int c = 0; c < kSplitDimsPerLane; ++c) acc[i][c] = acc[i][c] * corr;
      m[i] = m_new;
    }
    for (int jj = 0; jj < count_max; ++jj) {  // uniform: every lane shuffles
      const int64_t vo = __shfl_sync(0xFFFFFFFFu, off, jj);
      float vv[kSplitDimsPerLane];
#pragma unroll
      for (int c = 0; c < kSplitDimsPerLane; ++c) {
        const int64_t d = c * kWarp + lane;
        vv[c] = d < hd ? kv_load1<dm::KvDtype::kF32>(v, vo + d, 1.0f) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kQ; ++i) {
        if (jj >= n_q[i] - j0) continue;  // uniform
        const float pj = __shfl_sync(0xFFFFFFFFu, p[i], jj);
#pragma unroll
        for (int c = 0; c < kSplitDimsPerLane; ++c) acc[i][c] = acc[i][c] + pj * vv[c];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kQ; ++i) {
    if (lane == 0) {
      m_s[i][warp] = m[i];
      l_s[i][warp] = l[i];
    }
#pragma unroll
    for (int c = 0; c < kSplitDimsPerLane; ++c) {
      const int64_t d = c * kWarp + lane;
      if (d < hd) acc_s[i][warp][d] = acc[i][c];
    }
  }
  __syncthreads();
  for (int64_t x = threadIdx.x; x < nq * hd; x += kSplitThreads) {
    const int64_t i = x / hd, d = x % hd;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < dm::kDecodeStripes; ++w) mx = m_s[i][w] > mx ? m_s[i][w] : mx;
    float sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < dm::kDecodeStripes; ++w) {
      const float f = dm::exp_f32(m_s[i][w] - mx);
      sum = sum + l_s[i][w] * f;
      o = o + acc_s[i][w][d] * f;
    }
    out[((r_first + i) * n_heads + hh) * hd + d] = o * (1.0f / sum);
  }
}

// One thread per row.
__global__ void log_softmax_kernel(const float* __restrict__ z, int64_t rows, int64_t vocab,
                                   float inv_t, const int32_t* __restrict__ targets,
                                   float* __restrict__ lse, float* __restrict__ target_logprob) {
  const int64_t r = global_index();
  if (r >= rows) return;
  const float l = dm::logsumexp_scaled(z + r * vocab, vocab, inv_t);
  if (lse != nullptr) lse[r] = l;
  if (targets != nullptr && target_logprob != nullptr) {
    target_logprob[r] = z[r * vocab + targets[r]] * inv_t - l;
  }
}

// One thread per row (sequence), each with its own parameters and random stream.
__global__ void sample_kernel(const float* __restrict__ z, int64_t rows, int64_t vocab,
                              const dm::SampleParams* __restrict__ params, dm::RngState* rng,
                              int32_t* __restrict__ scratch, dm::SampleResult* __restrict__ out) {
  const int64_t r = global_index();
  if (r >= rows) return;
  dm::RngState st = rng[r];
  out[r] = dm::sample_row(z + r * vocab, vocab, params[r], st, scratch + r * vocab);
  rng[r] = st;
}

// ---- block-parallel log-softmax and sampling (dm::sampling_blocked.h's order) ----
// One block of dm::kRowThreads per row. Ran on an H200 (2026-12-04);
// tests/gpu/decoder_cuda_test.cc checks them against dm::logsumexp_scaled_blocked /
// dm::sample_row_blocked when a device is present.

constexpr int kRowWarps = dm::kRowWarps;

// Shared scratch of the row reductions.
struct RowShared {
  float f[kRowWarps];
  double d[kRowWarps];
  int64_t i[kRowWarps];
};

// dm::logsumexp_scaled_blocked over z[0, n); every thread returns the row's lse. Called by all
// threads of the block (it synchronizes).
__device__ float block_logsumexp(const float* __restrict__ z, int64_t n, float inv_t,
                                 RowShared& sh) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  float mx = -INFINITY;
  for (int64_t i = tid; i < n; i += dm::kRowThreads) {
    const float v = z[i] * inv_t;
    mx = mx < v ? v : mx;
  }
#pragma unroll
  for (int o = kWarp / 2; o >= 1; o /= 2) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, mx, o);
    mx = mx < other ? other : mx;
  }
  if (lane == 0) sh.f[warp] = mx;
  __syncthreads();
  mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kRowWarps; ++w) mx = mx < sh.f[w] ? sh.f[w] : mx;
  double part = 0.0;
  for (int64_t i = tid; i < n; i += dm::kRowThreads) {
    part += dm::exp_f64(static_cast<double>(z[i] * inv_t - mx));
  }
#pragma unroll
  for (int o = kWarp / 2; o >= 1; o /= 2) part = part + __shfl_xor_sync(0xFFFFFFFFu, part, o);
  if (lane == 0) sh.d[warp] = part;
  __syncthreads();
  double sum = 0.0;
#pragma unroll
  for (int w = 0; w < kRowWarps; ++w) sum = sum + sh.d[w];
  __syncthreads();  // sh may be reused by the caller
  return mx + static_cast<float>(dm::log_f64(sum));
}

__global__ void __launch_bounds__(dm::kRowThreads)
    log_softmax_block_kernel(const float* __restrict__ z, int64_t vocab, float inv_t,
                             const int32_t* __restrict__ targets, float* __restrict__ lse,
                             float* __restrict__ target_logprob) {
  __shared__ RowShared sh;
  const int64_t r = blockIdx.x;
  const float l = block_logsumexp(z + r * vocab, vocab, inv_t, sh);
  if (threadIdx.x != 0) return;
  if (lse != nullptr) lse[r] = l;
  if (targets != nullptr && target_logprob != nullptr) {
    target_logprob[r] = z[r * vocab + targets[r]] * inv_t - l;
  }
}

// dm::sample_row_blocked for row blockIdx.x. Branches on the row's parameters, which are the same
// for every thread of the block, so each __syncthreads is reached by all or none.
__global__ void __launch_bounds__(dm::kRowThreads)
    sample_block_kernel(const float* __restrict__ z, int64_t vocab,
                        const dm::SampleParams* __restrict__ params, dm::RngState* rng,
                        int32_t* __restrict__ scratch, dm::SampleResult* __restrict__ out) {
  __shared__ RowShared sh;
  __shared__ double prefix_s[dm::kRowThreads + 1];
  __shared__ double u_s;
  __shared__ int chosen_s;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  const int64_t r = blockIdx.x;
  const float* zr = z + r * vocab;
  const dm::SampleParams p = params[r];
  const float inv_t = dm::sample_inv_t(p);
  const float lse = block_logsumexp(zr, vocab, inv_t, sh);
  dm::SampleResult res;
  if (p.temperature == 0.0f) {
    // The first maximum: per thread over its indices in order, then (larger value, lower index).
    int64_t best = tid < vocab ? tid : 0;
    for (int64_t j = tid + dm::kRowThreads; j < vocab; j += dm::kRowThreads) {
      if (zr[best] < zr[j]) best = j;
    }
#pragma unroll
    for (int o = kWarp / 2; o >= 1; o /= 2) {
      const int64_t other = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      if (zr[best] < zr[other] || (!(zr[other] < zr[best]) && other < best)) best = other;
    }
    if (lane == 0) sh.i[warp] = best;
    __syncthreads();
    if (tid != 0) return;
    best = sh.i[0];
    for (int w = 1; w < kRowWarps; ++w) {
      const int64_t other = sh.i[w];
      if (zr[best] < zr[other] || (!(zr[other] < zr[best]) && other < best)) best = other;
    }
    res.token = static_cast<int32_t>(best);
    res.full_logprob = zr[best] * inv_t - lse;
    res.logprob = res.full_logprob;
    out[r] = res;
    return;
  }
  if (p.top_k != 0 || p.top_p < 1.0f) {  // truncated: the serial heap on one thread
    if (tid != 0) return;
    dm::RngState st = rng[r];
    out[r] = dm::sample_row_with_lse(zr, vocab, p, st, scratch + r * vocab, lse);
    rng[r] = st;
    return;
  }
  // Untruncated: chunk sums, a serial prefix on thread 0, one chunk rescanned.
  const int64_t chunk = dm::sample_chunk(vocab);
  const int64_t begin = tid * chunk, end = (tid + 1) * chunk < vocab ? (tid + 1) * chunk : vocab;
  double acc = 0.0;
  for (int64_t j = begin; j < end; ++j) {
    acc += dm::exp_f64(static_cast<double>(zr[j] * inv_t - lse));
  }
  prefix_s[tid + 1] = acc;
  __syncthreads();
  if (tid == 0) {
    dm::RngState st = rng[r];
    const double u = dm::rng_uniform(st);
    rng[r] = st;
    prefix_s[0] = 0.0;
    int chosen = -1;
    for (int c = 0; c < dm::kRowThreads; ++c) {
      prefix_s[c + 1] = prefix_s[c] + prefix_s[c + 1];
      if (chosen < 0 && u < prefix_s[c + 1]) chosen = c;
    }
    u_s = u;
    chosen_s = chosen;
  }
  __syncthreads();
  const int chosen = chosen_s;
  if (chosen < 0) {
    if (tid == 0) {
      res.token = static_cast<int32_t>(vocab - 1);
      res.full_logprob = zr[vocab - 1] * inv_t - lse;
      res.logprob = res.full_logprob;
      out[r] = res;
    }
    return;
  }
  if (tid != chosen) return;
  const double u = u_s;
  int64_t token = end - 1;
  double cum = prefix_s[tid];
  for (int64_t j = begin; j < end; ++j) {
    cum += dm::exp_f64(static_cast<double>(zr[j] * inv_t - lse));
    if (u < cum) {
      token = j;
      break;
    }
  }
  res.token = static_cast<int32_t>(token);
  res.full_logprob = zr[token] * inv_t - lse;
  res.logprob = res.full_logprob;
  out[r] = res;
}

}  // namespace

cudaError_t launch_embed_gather(const float* table, int64_t vocab, int64_t h, const int32_t* tokens,
                                int64_t rows, float* x, int32_t* bad_count, cudaStream_t stream) {
  embed_gather_kernel<<<blocks_for(rows * h), kThreads, 0, stream>>>(table, vocab, h, tokens, rows,
                                                                     x, bad_count);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, float eps,
                           bool to_bf16, float* y, float* inv_rms, cudaStream_t stream) {
  rmsnorm_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(x, g, rows, h, eps, to_bf16, y,
                                                            inv_rms);
  return cudaGetLastError();
}

cudaError_t launch_rope(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                        int64_t heads, int64_t head_dim, bool to_bf16, float* x,
                        cudaStream_t stream) {
  rope_kernel<<<blocks_for(rows * heads * (head_dim / 2)), kThreads, 0, stream>>>(
      cos, sin, pos, rows, heads, head_dim, to_bf16, x);
  return cudaGetLastError();
}

cudaError_t launch_swiglu(const float* g, const float* u, int64_t n, bool to_bf16, float* act,
                          cudaStream_t stream) {
  swiglu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, u, n, to_bf16, act);
  return cudaGetLastError();
}

cudaError_t launch_attention_prefill(const float* q, const float* k, const float* v,
                                     const int32_t* seq_start, int64_t n_seq, int64_t rows,
                                     int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                                     float* out, cudaStream_t stream) {
  attention_prefill_kernel<<<blocks_for(rows * n_heads), kThreads, 0, stream>>>(
      q, k, v, seq_start, n_seq, rows, n_heads, n_kv, head_dim, scale, out);
  return cudaGetLastError();
}

cudaError_t launch_attention_prefill_split(const float* q, const float* k, const float* v,
                                           const int32_t* seq_start, int64_t n_seq, int64_t rows,
                                           int64_t n_heads, int64_t n_kv, int64_t head_dim,
                                           float scale, float* out, cudaStream_t stream) {
  const int64_t tiles = (rows + kPrefillTileRows - 1) / kPrefillTileRows;
  attention_prefill_tiled_kernel<<<static_cast<unsigned int>(tiles * n_heads), kSplitThreads, 0,
                                   stream>>>(q, k, v, seq_start, n_seq, rows, n_heads, n_kv,
                                             head_dim, scale, out);
  return cudaGetLastError();
}

cudaError_t launch_kv_write_paged(const float* k, const float* v, int64_t rows,
                                  const int32_t* row_seq, const int32_t* row_pos,
                                  const dm::PagedKvView& kv, cudaStream_t stream) {
  kv_write_paged_kernel<<<blocks_for(rows * kv.n_kv * kv.head_dim), kThreads, 0, stream>>>(
      k, v, rows, row_seq, row_pos, kv);
  return cudaGetLastError();
}

cudaError_t launch_attention_paged(const float* q, int64_t rows, const int32_t* row_seq,
                                   const int32_t* row_pos, const dm::PagedKvView& kv,
                                   int64_t n_heads, float scale, float* out, cudaStream_t stream) {
  attention_paged_kernel<<<blocks_for(rows * n_heads), kThreads, 0, stream>>>(
      q, rows, row_seq, row_pos, kv, n_heads, scale, out);
  return cudaGetLastError();
}

cudaError_t launch_attention_paged_split(const float* q, int64_t rows, const int32_t* row_seq,
                                         const int32_t* row_pos, const dm::PagedKvView& kv,
                                         int64_t n_heads, float scale, float* out,
                                         cudaStream_t stream) {
  const unsigned int grid = static_cast<unsigned int>(rows * n_heads);
  switch (kv.dtype) {
    case dm::KvDtype::kFP8:
      attention_paged_split_kernel<dm::KvDtype::kFP8>
          <<<grid, kSplitThreads, 0, stream>>>(q, row_seq, row_pos, kv, n_heads, scale, out);
      break;
    case dm::KvDtype::kBF16:
      attention_paged_split_kernel<dm::KvDtype::kBF16>
          <<<grid, kSplitThreads, 0, stream>>>(q, row_seq, row_pos, kv, n_heads, scale, out);
      break;
    default:
      attention_paged_split_kernel<dm::KvDtype::kF32>
          <<<grid, kSplitThreads, 0, stream>>>(q, row_seq, row_pos, kv, n_heads, scale, out);
  }
  return cudaGetLastError();
}

cudaError_t launch_log_softmax(const float* z, int64_t rows, int64_t vocab, float inv_t,
                               const int32_t* targets, float* lse, float* target_logprob,
                               cudaStream_t stream) {
  log_softmax_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(z, rows, vocab, inv_t, targets, lse,
                                                                target_logprob);
  return cudaGetLastError();
}

cudaError_t launch_log_softmax_block(const float* z, int64_t rows, int64_t vocab, float inv_t,
                                     const int32_t* targets, float* lse, float* target_logprob,
                                     cudaStream_t stream) {
  log_softmax_block_kernel<<<static_cast<unsigned int>(rows), dm::kRowThreads, 0, stream>>>(
      z, vocab, inv_t, targets, lse, target_logprob);
  return cudaGetLastError();
}

cudaError_t launch_sample_block(const float* z, int64_t rows, int64_t vocab,
                                const dm::SampleParams* params, dm::RngState* rng, int32_t* scratch,
                                dm::SampleResult* out, cudaStream_t stream) {
  sample_block_kernel<<<static_cast<unsigned int>(rows), dm::kRowThreads, 0, stream>>>(
      z, vocab, params, rng, scratch, out);
  return cudaGetLastError();
}

cudaError_t launch_sample(const float* z, int64_t rows, int64_t vocab,
                          const dm::SampleParams* params, dm::RngState* rng, int32_t* scratch,
                          dm::SampleResult* out, cudaStream_t stream) {
  sample_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(z, rows, vocab, params, rng, scratch,
                                                           out);
  return cudaGetLastError();
}

}  // namespace fp8rl::kernels::cuda::internal
