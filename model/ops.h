// The non-GEMM math of the decoder on the CPU (RMSNorm, rotary embeddings, attention, SwiGLU,
// log-softmax), forward and backward, written once and shared by the training forward and the
// KV-cache inference path so both produce bit-identical numbers for the same inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace fp8rl::model::ops {

// Deterministic dot product (fixed 8-lane summation order, independent of the caller).
float dot(const float* a, const float* b, int64_t n);

// Rounds x[0, n) to bf16 in place.
void round_bf16_inplace(float* x, int64_t n);

// y[r] = x[r] * inv_rms[r] * g, inv_rms[r] = 1/sqrt(mean(x[r]^2) + eps), rows of width h.
void rmsnorm_forward(const float* x, const float* g, int64_t rows, int64_t h, float eps, float* y,
                     float* inv_rms);
// dx (overwritten) and dg (accumulated) from dy.
void rmsnorm_backward(const float* x, const float* g, const float* inv_rms, const float* dy,
                      int64_t rows, int64_t h, float* dx, float* dg);

// Rotary frequencies, half = head_dim / 2 values: inv_freq[i] = theta^(-2i/head_dim) as HF's fp32
// value; with rope_type llama3 (HF _compute_llama3_parameters, evaluated in double on those fp32
// values), with wavelength w = 2 pi / inv_freq, L = original_max_position_embeddings,
// lo = low_freq_factor, hi = high_freq_factor:
//   w > L / lo  -> inv_freq / factor                        (low frequencies)
//   w < L / hi  -> inv_freq                                 (high frequencies)
//   otherwise   -> (1 - s) inv_freq / factor + s inv_freq,  s = (L / w - lo) / (hi - lo)
std::vector<float> rope_inv_freq(double theta, int64_t head_dim, const RopeScaling& scaling);

// Rotary tables for positions [0, max_pos): cos/sin[pos * half + i] of pos * inv_freq[i] (angle in
// double) (HF "rotate half" layout).
struct RopeTable {
  int64_t half = 0;
  int64_t max_pos = 0;
  float* cos = nullptr;  // owned by the caller (model), [max_pos * half]
  float* sin = nullptr;
};
void rope_fill(const std::vector<float>& inv_freq, int64_t max_pos, float* cos, float* sin);
// Rotates each head of x[rows, heads * head_dim] in place, row r at position pos[r].
// inverse: applies the transposed rotation (the backward of the forward rotation).
void rope_apply(const RopeTable& t, const int32_t* pos, int64_t rows, int64_t heads,
                int64_t head_dim, float* x, bool inverse);

// One query row against n keys: out[hd] = sum_j softmax_j(scale * q.k_j) v_j. Keys/values rows
// are k + j * k_stride. `scores` is scratch of n floats.
void attend_row(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                int64_t n, int64_t hd, float scale, float* scores, float* out);
// Backward of attend_row: accumulates dq[hd], dk rows, dv rows.
void attend_row_backward(const float* q, const float* k, int64_t k_stride, const float* v,
                         int64_t v_stride, int64_t n, int64_t hd, float scale, const float* dout,
                         float* scores, float* dscores, float* dq, float* dk, float* dv);

// act = silu(g) * u (elementwise, n values).
void swiglu_forward(const float* g, const float* u, int64_t n, float* act);
// dg, du (overwritten) from dact.
void swiglu_backward(const float* g, const float* u, const float* dact, int64_t n, float* dg,
                     float* du);

// log(sum(exp(z[i] * inv_t))) over n logits.
float logsumexp_scaled(const float* z, int64_t n, float inv_t);

}  // namespace fp8rl::model::ops
