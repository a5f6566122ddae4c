// The CPU reference of the CUDA training kernels (kernels/cuda/train_kernels.cu): the backward of
// the decoder's non-GEMM ops and the training forward's extra ops, each the same index mapping
// around the same shared math (kernels/device_math/*_bwd.h) as its kernel, one plain loop per
// kernel. A CPU test checks these against model/ops.cc (the model's own reference) through the
// training step; the GPU tests compare each kernel with these.
//
// Shapes: x is [rows, h]; q is [rows, n_heads * head_dim]; k, v are [rows, n_kv * head_dim];
// logits z are [rows, vocab]. Packed sequences: sequence s holds rows [seq_start[s],
// seq_start[s + 1]). All row-major fp32.
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::cpu {

// dx (overwritten) and dg (accumulated over rows in order) from dy: the backward of rmsnorm()
// without rounding (device_math/rmsnorm_bwd.h).
void rmsnorm_backward(const float* x, const float* g, const float* inv_rms, const float* dy,
                      int64_t rows, int64_t h, float* dx, float* dg);

// The transposed rotation of rope() (its backward), in place, never rounded.
void rope_inverse(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                  int64_t heads, int64_t head_dim, float* x);

// dg, du (overwritten) from dact (act = silu(g) * u).
void swiglu_backward(const float* g, const float* u, const float* dact, int64_t n, float* dg,
                     float* du);

// The backward of attention_prefill(): dq, dk, dv overwritten. Three passes as the kernels run
// them: the softmax statistics of every (row, head) into stats [rows * n_heads * 3] (mx, inv,
// pdp); dq of every (row, head) summed over keys in order; dk, dv of every (sequence, kv head,
// key row j) summed over the group's heads, then query rows in order -- the accumulation order of
// model/ops.cc attend_row_backward.
void attention_prefill_backward(const float* q, const float* k, const float* v, const float* dout,
                                const int32_t* seq_start, int64_t n_seq, int64_t n_heads,
                                int64_t n_kv, int64_t head_dim, float scale, float* stats,
                                float* dq, float* dk, float* dv);

// In place on z: dz of sum_r dlogp[r] * logprob[r] (device_math/logprob_bwd.h), targets[r] the
// target of row r, lse[r] its log-sum-exp at inv_t.
void head_dlogits(float* z, int64_t rows, int64_t vocab, float inv_t, const int32_t* targets,
                  const float* lse, const float* dlogp);

// dembed[tokens[r]] += dx[r] for r = 0..rows-1 in order (one column at a time, as the kernel).
void embed_backward(const float* dx, const int32_t* tokens, int64_t rows, int64_t h, float* dembed);

// x[i] through the KV cache format and back (device_math/logprob_bwd.h kv_round_trip).
void kv_fake_quant(float* x, int64_t n, dm::KvDtype dtype, float scale);

// amax[s] = max |x| over sequence s's rows ([rows, width]).
void seq_amax(const float* x, int64_t width, const int32_t* seq_start, int64_t n_seq, float* amax);

}  // namespace fp8rl::kernels::cpu
