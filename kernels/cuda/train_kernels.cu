// The training kernels: the backward of the decoder's non-GEMM ops, the training forward's KV
// fake-quantization and calibration amax, and the glue of the training GEMMs (transposes along
// tokens, bf16 operands, a float64-accumulated reference GEMM for fp32 linears, bias gradients).
// Each kernel is an index mapping around the shared math of kernels/device_math/*_bwd.h (the same
// functions kernels/cpu/train_ops.cc calls), the simplest mapping that is obviously right and sums
// every gradient element in the CPU's order without atomics: one thread per element, per row,
// per (row, head) or per column. Made fast only when a measurement asks for it. Compiled with
// --fmad=false (kernels/cuda/CMakeLists.txt) so a*b+c rounds twice, as on the host. Ran on an
// H200 against the CPU references (docs/results/gpu-check-2026-12-04.md).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/train_launch.h"
#include "kernels/device_math/attention.h"
#include "kernels/device_math/attention_bwd.h"
#include "kernels/device_math/logprob_bwd.h"
#include "kernels/device_math/rmsnorm_bwd.h"
#include "kernels/device_math/rope_bwd.h"
#include "kernels/device_math/swiglu_bwd.h"

namespace fp8rl::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;

unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>((n + kThreads - 1) / kThreads);
}

__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// ---- rmsnorm backward: dx one thread per row, dg one thread per column (rows in order) ----

__global__ void rmsnorm_bwd_dx_kernel(const float* __restrict__ x, const float* __restrict__ g,
                                      const float* __restrict__ inv, const float* __restrict__ dy,
                                      int64_t rows, int64_t h, float* __restrict__ dx) {
  const int64_t r = global_index();
  if (r >= rows) return;
  dm::rmsnorm_bwd_row(x + r * h, g, inv[r], dy + r * h, h, dx + r * h);
}

__global__ void rmsnorm_bwd_dg_kernel(const float* __restrict__ x, const float* __restrict__ inv,
                                      const float* __restrict__ dy, int64_t rows, int64_t h,
                                      float* __restrict__ dg) {
  const int64_t c = global_index();
  if (c >= h) return;
  dm::rmsnorm_bwd_dg_col(x, inv, dy, rows, h, c, dg);
}

// ---- RoPE backward: one thread per (row, head, pair) ----

__global__ void rope_inverse_kernel(const float* __restrict__ cos, const float* __restrict__ sin,
                                    const int32_t* __restrict__ pos, int64_t rows, int64_t heads,
                                    int64_t head_dim, float* __restrict__ x) {
  const int64_t half = head_dim / 2;
  const int64_t t = global_index();
  if (t >= rows * heads * half) return;
  const int64_t i = t % half, rh = t / half, r = rh / heads;
  float* v = x + rh * head_dim;
  const int64_t at = static_cast<int64_t>(pos[r]) * half + i;
  float a = v[i], b = v[i + half];
  dm::rope_unrotate_pair(a, b, cos[at], sin[at]);
  v[i] = a;
  v[i + half] = b;
}

__global__ void swiglu_bwd_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                  const float* __restrict__ dact, int64_t n, float* __restrict__ dg,
                                  float* __restrict__ du) {
  const int64_t i = global_index();
  if (i >= n) return;
  dm::swiglu_bwd(g[i], u[i], dact[i], dg + i, du + i);
}

// ---- attention backward (kernels/cpu/train_ops.h attention_prefill_backward's three passes) ----

// Pass 1, one thread per (row, head): the row's softmax statistics (mx, inv, pdp).
__global__ void attn_bwd_stats_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                      const float* __restrict__ v, const float* __restrict__ dout,
                                      const int32_t* __restrict__ seq_start,
                                      const int32_t* __restrict__ row_seq, int64_t rows,
                                      int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                                      float* __restrict__ stats) {
  const int64_t t = global_index();
  if (t >= rows * n_heads) return;
  const int64_t r = t / n_heads, hh = t % n_heads, r0 = seq_start[row_seq[r]];
  const int64_t qd = n_heads * head_dim, kvd = n_kv * head_dim, g = hh / (n_heads / n_kv);
  const dm::FloatRows keys{k + r0 * kvd + g * head_dim, kvd};
  const dm::FloatRows values{v + r0 * kvd + g * head_dim, kvd};
  const dm::AttnRowStats st =
      dm::attend_row_stats(q + r * qd + hh * head_dim, keys, values, dout + r * qd + hh * head_dim,
                           r - r0 + 1, head_dim, scale);
  stats[t * 3 + 0] = st.mx;
  stats[t * 3 + 1] = st.inv;
  stats[t * 3 + 2] = st.pdp;
}

// Pass 2, one thread per (row, head): dq = sum_j ds_j k_j over the row's keys in order.
__global__ void attn_bwd_dq_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                   const float* __restrict__ v, const float* __restrict__ dout,
                                   const int32_t* __restrict__ seq_start,
                                   const int32_t* __restrict__ row_seq, int64_t rows,
                                   int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                                   const float* __restrict__ stats, float* __restrict__ dq) {
  const int64_t t = global_index();
  if (t >= rows * n_heads) return;
  const int64_t r = t / n_heads, hh = t % n_heads, r0 = seq_start[row_seq[r]];
  const int64_t qd = n_heads * head_dim, kvd = n_kv * head_dim, g = hh / (n_heads / n_kv);
  const dm::AttnRowStats st{stats[t * 3], stats[t * 3 + 1], stats[t * 3 + 2]};
  const float* qr = q + r * qd + hh * head_dim;
  const float* dor = dout + r * qd + hh * head_dim;
  float* dqr = dq + r * qd + hh * head_dim;
  for (int64_t d = 0; d < head_dim; ++d) dqr[d] = 0.0f;
  for (int64_t j = r0; j <= r; ++j) {
    const float* kj = k + j * kvd + g * head_dim;
    float p, ds;
    dm::attend_ds(qr, dm::FloatRow{kj}, dm::FloatRow{v + j * kvd + g * head_dim}, dor, head_dim,
                  scale, st, &p, &ds);
    for (int64_t d = 0; d < head_dim; ++d) dqr[d] += ds * kj[d];
  }
}

// Pass 3, one thread per (key row j, kv head): dk_j, dv_j over the group's heads, then the query
// rows i >= j of j's sequence, in order.
__global__ void attn_bwd_dkv_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                    const float* __restrict__ v, const float* __restrict__ dout,
                                    const int32_t* __restrict__ seq_start,
                                    const int32_t* __restrict__ row_seq, int64_t rows,
                                    int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                                    const float* __restrict__ stats, float* __restrict__ dk,
                                    float* __restrict__ dv) {
  const int64_t t = global_index();
  if (t >= rows * n_kv) return;
  const int64_t j = t / n_kv, g = t % n_kv, r1 = seq_start[row_seq[j] + 1];
  const int64_t qd = n_heads * head_dim, kvd = n_kv * head_dim, group = n_heads / n_kv;
  const float* kj = k + j * kvd + g * head_dim;
  const float* vj = v + j * kvd + g * head_dim;
  float* dkj = dk + j * kvd + g * head_dim;
  float* dvj = dv + j * kvd + g * head_dim;
  for (int64_t d = 0; d < head_dim; ++d) dkj[d] = dvj[d] = 0.0f;
  for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
    for (int64_t i = j; i < r1; ++i) {
      const float* st = stats + (i * n_heads + hh) * 3;
      const float* qi = q + i * qd + hh * head_dim;
      const float* doi = dout + i * qd + hh * head_dim;
      float p, ds;
      dm::attend_ds(qi, dm::FloatRow{kj}, dm::FloatRow{vj}, doi, head_dim, scale,
                    dm::AttnRowStats{st[0], st[1], st[2]}, &p, &ds);
      for (int64_t d = 0; d < head_dim; ++d) {
        dkj[d] += ds * qi[d];
        dvj[d] += p * doi[d];
      }
    }
  }
}

// ---- lm_head / embedding ----

// One thread per logit.
__global__ void head_dlogits_kernel(float* __restrict__ z, int64_t rows, int64_t vocab, float inv_t,
                                    const int32_t* __restrict__ targets,
                                    const float* __restrict__ lse,
                                    const float* __restrict__ dlogp) {
  const int64_t t = global_index();
  if (t >= rows * vocab) return;
  const int64_t r = t / vocab, j = t % vocab;
  z[t] = dm::logprob_dlogit(z[t], j == targets[r], dlogp[r], inv_t, lse[r]);
}

// One thread per column: dembed[tokens[r]][c] += dx[r][c] over rows in order (no atomics; rows
// sharing a token add in row order, as on the CPU).
__global__ void embed_bwd_kernel(const float* __restrict__ dx, const int32_t* __restrict__ tokens,
                                 int64_t rows, int64_t h, float* __restrict__ dembed) {
  const int64_t c = global_index();
  if (c >= h) return;
  for (int64_t r = 0; r < rows; ++r) {
    dembed[static_cast<int64_t>(tokens[r]) * h + c] += dx[r * h + c];
  }
}

__global__ void kv_fake_quant_kernel(float* __restrict__ x, int64_t n, dm::KvDtype dtype,
                                     float scale) {
  const int64_t i = global_index();
  if (i >= n) return;
  x[i] = dm::kv_round_trip(x[i], dtype, scale);
}

// One block per sequence: max |x| over its rows (a max is exact in any order).
__global__ void seq_amax_kernel(const float* __restrict__ x, int64_t width,
                                const int32_t* __restrict__ seq_start, float* __restrict__ amax) {
  __shared__ float part[kThreads];
  const int64_t s = blockIdx.x;
  const int64_t b = seq_start[s] * width, e = seq_start[s + 1] * width;
  float m = 0.0f;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) m = fmaxf(m, fabsf(x[i]));
  part[threadIdx.x] = m;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) amax[s] = part[0];
}

// ---- GEMM glue ----

// out[c, r] = x[r, c] for r < rows, 0 for rows <= r < ld (out is [cols, ld]); fp32 and/or bf16.
__global__ void transpose_pad_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                                     int64_t ld, float* __restrict__ out,
                                     uint16_t* __restrict__ out_bf16) {
  const int64_t t = global_index();
  if (t >= cols * ld) return;
  const int64_t c = t / ld, r = t % ld;
  const float v = r < rows ? x[r * cols + c] : 0.0f;
  if (out != nullptr) out[t] = v;
  if (out_bf16 != nullptr) out_bf16[t] = dm::float_to_bf16(v);
}

__global__ void to_bf16_bits_kernel(const float* __restrict__ x, int64_t n,
                                    uint16_t* __restrict__ out) {
  const int64_t i = global_index();
  if (i >= n) return;
  out[i] = dm::float_to_bf16(x[i]);
}

// y[r, c] (+)= sum_i a[r, i] b[c, i], in double over i in order, rounded once (then added).
__global__ void gemm_nt_kernel(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ y, int64_t m, int64_t n, int64_t k,
                               bool accumulate) {
  const int64_t t = global_index();
  if (t >= m * n) return;
  const int64_t r = t / n, c = t % n;
  double acc = 0.0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(a[r * k + i]) * b[c * k + i];
  y[t] = accumulate ? y[t] + static_cast<float>(acc) : static_cast<float>(acc);
}

// y[r, c] = sum_i a[r, i] b[i, c] (a [m, k], b [k, n]), in double.
__global__ void gemm_nn_kernel(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ y, int64_t m, int64_t n, int64_t k) {
  const int64_t t = global_index();
  if (t >= m * n) return;
  const int64_t r = t / n, c = t % n;
  double acc = 0.0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(a[r * k + i]) * b[i * n + c];
  y[t] = static_cast<float>(acc);
}

// y[r, c] += sum_i a[i, r] b[i, c] (a [k, m], b [k, n]: the weight gradient dY^T . X), in double.
__global__ void gemm_tn_kernel(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ y, int64_t m, int64_t n, int64_t k) {
  const int64_t t = global_index();
  if (t >= m * n) return;
  const int64_t r = t / n, c = t % n;
  double acc = 0.0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(a[i * m + r]) * b[i * n + c];
  y[t] += static_cast<float>(acc);
}

// out[c] += x[r, c] over rows in order (the bias gradient), one thread per column.
__global__ void column_sum_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                                  float* __restrict__ out) {
  const int64_t c = global_index();
  if (c >= cols) return;
  float acc = out[c];
  for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
  out[c] = acc;
}

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n,
                           bool to_bf16) {
  const int64_t i = global_index();
  if (i >= n) return;
  const float v = y[i] + x[i];
  y[i] = to_bf16 ? dm::round_bf16(v) : v;
}

}  // namespace

cudaError_t launch_rmsnorm_backward(const float* x, const float* g, const float* inv,
                                    const float* dy, int64_t rows, int64_t h, float* dx, float* dg,
                                    cudaStream_t stream) {
  rmsnorm_bwd_dx_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(x, g, inv, dy, rows, h, dx);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  rmsnorm_bwd_dg_kernel<<<blocks_for(h), kThreads, 0, stream>>>(x, inv, dy, rows, h, dg);
  return cudaGetLastError();
}

cudaError_t launch_rope_inverse(const float* cos, const float* sin, const int32_t* pos,
                                int64_t rows, int64_t heads, int64_t head_dim, float* x,
                                cudaStream_t stream) {
  rope_inverse_kernel<<<blocks_for(rows * heads * (head_dim / 2)), kThreads, 0, stream>>>(
      cos, sin, pos, rows, heads, head_dim, x);
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(const float* g, const float* u, const float* dact, int64_t n,
                                   float* dg, float* du, cudaStream_t stream) {
  swiglu_bwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, u, dact, n, dg, du);
  return cudaGetLastError();
}

cudaError_t launch_attention_backward(const float* q, const float* k, const float* v,
                                      const float* dout, const int32_t* seq_start,
                                      const int32_t* row_seq, int64_t rows, int64_t n_heads,
                                      int64_t n_kv, int64_t head_dim, float scale, float* stats,
                                      float* dq, float* dk, float* dv, cudaStream_t stream) {
  attn_bwd_stats_kernel<<<blocks_for(rows * n_heads), kThreads, 0, stream>>>(
      q, k, v, dout, seq_start, row_seq, rows, n_heads, n_kv, head_dim, scale, stats);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  attn_bwd_dq_kernel<<<blocks_for(rows * n_heads), kThreads, 0, stream>>>(
      q, k, v, dout, seq_start, row_seq, rows, n_heads, n_kv, head_dim, scale, stats, dq);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  attn_bwd_dkv_kernel<<<blocks_for(rows * n_kv), kThreads, 0, stream>>>(
      q, k, v, dout, seq_start, row_seq, rows, n_heads, n_kv, head_dim, scale, stats, dk, dv);
  return cudaGetLastError();
}

cudaError_t launch_head_dlogits(float* z, int64_t rows, int64_t vocab, float inv_t,
                                const int32_t* targets, const float* lse, const float* dlogp,
                                cudaStream_t stream) {
  head_dlogits_kernel<<<blocks_for(rows * vocab), kThreads, 0, stream>>>(z, rows, vocab, inv_t,
                                                                         targets, lse, dlogp);
  return cudaGetLastError();
}

cudaError_t launch_embed_backward(const float* dx, const int32_t* tokens, int64_t rows, int64_t h,
                                  float* dembed, cudaStream_t stream) {
  embed_bwd_kernel<<<blocks_for(h), kThreads, 0, stream>>>(dx, tokens, rows, h, dembed);
  return cudaGetLastError();
}

cudaError_t launch_kv_fake_quant(float* x, int64_t n, dm::KvDtype dtype, float scale,
                                 cudaStream_t stream) {
  kv_fake_quant_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, dtype, scale);
  return cudaGetLastError();
}

cudaError_t launch_seq_amax(const float* x, int64_t width, const int32_t* seq_start, int64_t n_seq,
                            float* amax, cudaStream_t stream) {
  seq_amax_kernel<<<static_cast<unsigned int>(n_seq), kThreads, 0, stream>>>(x, width, seq_start,
                                                                             amax);
  return cudaGetLastError();
}

cudaError_t launch_transpose_pad(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out,
                                 uint16_t* out_bf16, cudaStream_t stream) {
  transpose_pad_kernel<<<blocks_for(cols * ld), kThreads, 0, stream>>>(x, rows, cols, ld, out,
                                                                       out_bf16);
  return cudaGetLastError();
}

cudaError_t launch_to_bf16_bits(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  to_bf16_bits_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t launch_gemm_nt_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                                  int64_t k, bool accumulate, cudaStream_t stream) {
  gemm_nt_kernel<<<blocks_for(m * n), kThreads, 0, stream>>>(a, b, y, m, n, k, accumulate);
  return cudaGetLastError();
}

cudaError_t launch_gemm_nn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                                  int64_t k, cudaStream_t stream) {
  gemm_nn_kernel<<<blocks_for(m * n), kThreads, 0, stream>>>(a, b, y, m, n, k);
  return cudaGetLastError();
}

cudaError_t launch_gemm_tn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                                  int64_t k, cudaStream_t stream) {
  gemm_tn_kernel<<<blocks_for(m * n), kThreads, 0, stream>>>(a, b, y, m, n, k);
  return cudaGetLastError();
}

cudaError_t launch_column_sum(const float* x, int64_t rows, int64_t cols, float* out,
                              cudaStream_t stream) {
  column_sum_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(x, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t launch_add(float* y, const float* x, int64_t n, bool to_bf16, cudaStream_t stream) {
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n, to_bf16);
  return cudaGetLastError();
}

}  // namespace fp8rl::kernels::cuda::internal
