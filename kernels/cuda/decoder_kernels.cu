// The decoder's non-GEMM kernels: each is an index mapping around the shared math of
// kernels/device_math (the same functions kernels/cpu/decoder_ops.cc calls), the simplest mapping
// that is obviously right: one thread per element, per row or per (row, head). Made fast only
// when a measurement asks for it. Compiled with --fmad=false (kernels/cuda/CMakeLists.txt) so
// a*b+c rounds twice, as on the host. Never run: no sm_90 device has executed these yet.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/decoder_launch.h"
#include "kernels/device_math/attention.h"
#include "kernels/device_math/rmsnorm.h"
#include "kernels/device_math/rope.h"
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

cudaError_t launch_log_softmax(const float* z, int64_t rows, int64_t vocab, float inv_t,
                               const int32_t* targets, float* lse, float* target_logprob,
                               cudaStream_t stream) {
  log_softmax_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(z, rows, vocab, inv_t, targets, lse,
                                                                target_logprob);
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
