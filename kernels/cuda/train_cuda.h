// The decoder's training ops on the GPU: the backward of RMSNorm, RoPE, SwiGLU and causal GQA
// attention over packed sequences, the lm_head logit gradient at a temperature, the embedding
// gradient, the training forward's KV fake-quantization and per-sequence amax (KV calibration),
// and the glue of the training GEMMs (transposes along tokens for wgrad, bf16 operands, a
// float64-accumulated GEMM for fp32 linears, bias gradients).
//
// Each op is the same computation as its CPU reference in kernels/cpu/train_ops.h (same shapes,
// same layouts, same shared math from kernels/device_math/*_bwd.h, the same summation order for
// every accumulated gradient), on device pointers and an explicit stream. Agreement with the CPU:
// bit for bit where no exp is involved (RMSNorm and RoPE backward, embedding gradient, KV
// fake-quantization, amax, transposes, bias sums), a few fp32 ulp where one is (SwiGLU and
// attention backward, logit gradient); the float64 GEMMs agree with the CPU's BLAS to fp32
// rounding of the sums (the CPU sums in a blocked fp32 order).
//
// Errors (InvalidArgumentError, naming the argument) come from host-side checks before any
// launch; a failed launch is InternalError. Nothing here synchronizes the stream.
//
// Ran on an H200 (docs/results/gpu-check-2026-12-04.md); tests/gpu checks every op
// against the CPU reference when one is present.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::cuda {

// dx (overwritten) and dg (accumulated over rows in order) from dy.
absl::Status rmsnorm_backward(const float* x, const float* g, const float* inv, const float* dy,
                              int64_t rows, int64_t h, float* dx, float* dg, Stream stream);
// The transposed rotation of rope() in place (never rounded).
absl::Status rope_inverse(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                          int64_t heads, int64_t head_dim, float* x, Stream stream);
absl::Status swiglu_backward(const float* g, const float* u, const float* dact, int64_t n,
                             float* dg, float* du, Stream stream);
// Backward of attention_prefill (decoder_cuda.h): dq, dk, dv overwritten. seq_start [n_seq + 1]
// and row_seq [rows] device int32; stats is device scratch of rows * n_heads * 3 floats.
absl::Status attention_backward(const float* q, const float* k, const float* v, const float* dout,
                                const int32_t* seq_start, const int32_t* row_seq, int64_t rows,
                                int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                                float* stats, float* dq, float* dk, float* dv, Stream stream);
// In place on z [rows, vocab]: d(sum_r dlogp[r] logprob[r]) / dz (targets, lse, dlogp [rows]).
absl::Status head_dlogits(float* z, int64_t rows, int64_t vocab, float inv_t,
                          const int32_t* targets, const float* lse, const float* dlogp,
                          Stream stream);
// dembed[tokens[r]] += dx[r] in row order (dembed [vocab, h]).
absl::Status embed_backward(const float* dx, const int32_t* tokens, int64_t rows, int64_t h,
                            float* dembed, Stream stream);
// x through a KV cache element of `dtype` and back (scale finite and > 0 for kFP8).
absl::Status kv_fake_quant(float* x, int64_t n, dm::KvDtype dtype, float scale, Stream stream);
// amax[s] (device) = max |x| over sequence s's rows of width `width`.
absl::Status seq_amax(const float* x, int64_t width, const int32_t* seq_start, int64_t n_seq,
                      float* amax, Stream stream);

// out [cols, ld] = x[rows, cols]^T with columns rows..ld-1 zero (ld >= rows): the wgrad operands
// tiled along tokens. out (fp32) and out_bf16 (bf16 bits) nullable, at least one given.
absl::Status transpose_pad(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out,
                           uint16_t* out_bf16, Stream stream);
absl::Status to_bf16_bits(const float* x, int64_t n, uint16_t* out, Stream stream);
// Float64-accumulated GEMMs (the fp32 policy's linears and a fallback for shapes cuBLASLt
// refuses), each output element one thread summing in index order, rounded to fp32 once:
//   gemm_nt: y[m, n] (+)= a[m, k] . b[n, k]^T            (fprop)
//   gemm_nn: y[m, n]   = a[m, k] . b[k, n]               (dgrad: dY . W)
//   gemm_tn: y[m, n]  += a[k, m]^T . b[k, n]             (wgrad: dY^T . X, k = tokens)
absl::Status gemm_nt_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                            int64_t k, bool accumulate, Stream stream);
absl::Status gemm_nn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                            int64_t k, Stream stream);
absl::Status gemm_tn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                            int64_t k, Stream stream);
// out[c] += sum_r x[r, c] in row order (the bias gradient).
absl::Status column_sum(const float* x, int64_t rows, int64_t cols, float* out, Stream stream);
// y += x, then bf16 rounding when to_bf16.
absl::Status add(float* y, const float* x, int64_t n, bool to_bf16, Stream stream);

}  // namespace fp8rl::kernels::cuda
