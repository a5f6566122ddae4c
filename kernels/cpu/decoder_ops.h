// The CPU reference of the CUDA decoder kernels (kernels/cuda/decoder_kernels.h): the same index
// mapping around the same shared math (kernels/device_math/*), one plain loop per kernel. The GPU
// tests compare each kernel with these; a CPU test checks these against model/ops.cc, the
// model's own reference, so CPU and GPU compute one recipe.
//
// Shapes: x is [rows, h]; q is [rows, n_heads * head_dim]; k, v are [rows, n_kv * head_dim];
// logits z are [rows, vocab]. All row-major fp32 unless said otherwise.
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"
#include "kernels/device_math/paged_kv.h"
#include "kernels/device_math/sampling.h"

namespace fp8rl::kernels::cpu {

// x[r] = table[tokens[r]] (table is [vocab, h]). Rows whose token is outside [0, vocab) are filled
// with NaN; returns how many there were.
int64_t embed_gather(const float* table, int64_t vocab, int64_t h, const int32_t* tokens,
                     int64_t rows, float* x);
// The same from a table held in double (an inference-only model's tied embedding: bf16 values,
// exact in double and in float, stored once as the lm_head's operand).
int64_t embed_gather(const double* table, int64_t vocab, int64_t h, const int32_t* tokens,
                     int64_t rows, float* x);

// y[r] = rmsnorm(x[r]) * g, inv_rms[r] (nullable) = 1/rms; y rounded to bf16 when to_bf16.
void rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, float eps, bool to_bf16,
             float* y, float* inv_rms);

// Rotates each head of x[rows, heads * head_dim] in place (row r at position pos[r]) with the
// tables cos/sin[pos * head_dim/2 + i]; rounds x to bf16 afterwards when to_bf16.
void rope(const float* cos, const float* sin, const int32_t* pos, int64_t rows, int64_t heads,
          int64_t head_dim, bool to_bf16, float* x);

// act[i] = silu(g[i]) * u[i] over n values, rounded to bf16 when to_bf16.
void swiglu(const float* g, const float* u, int64_t n, bool to_bf16, float* act);

// Causal GQA attention over packed sequences: sequence s holds rows [seq_start[s],
// seq_start[s+1]); row i of a sequence attends to its rows 0..i. Head hh reads kv head
// hh / (n_heads / n_kv). out is [rows, n_heads * head_dim].
void attention_prefill(const float* q, const float* k, const float* v, const int32_t* seq_start,
                       int64_t n_seq, int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                       float* out);

// attention_prefill in the split-context order of the CUDA kernels (dm::attend_row_split with
// dm::kDecodeStripes stripes, as attention_paged_split): the GPU test's reference for the fast
// prefill kernel. head_dim % 8 == 0.
void attention_prefill_split(const float* q, const float* k, const float* v,
                             const int32_t* seq_start, int64_t n_seq, int64_t n_heads, int64_t n_kv,
                             int64_t head_dim, float scale, float* out);

// Writes k, v rows into the paged cache: row r to sequence row_seq[r], position row_pos[r].
void kv_write_paged(const float* k, const float* v, int64_t rows, const int32_t* row_seq,
                    const int32_t* row_pos, const dm::PagedKvView& kv);

// Attention of q rows over the paged cache: row r (sequence row_seq[r], position row_pos[r])
// attends to that sequence's positions 0..row_pos[r] (prefill chunks and decode alike).
void attention_paged(const float* q, int64_t rows, const int32_t* row_seq, const int32_t* row_pos,
                     const dm::PagedKvView& kv, int64_t n_heads, float scale, float* out);

// attention_paged in the split-context order of the CUDA decode kernel (dm::attend_row_split with
// dm::kDecodeStripes stripes): the GPU test's reference for that kernel. head_dim % 8 == 0.
void attention_paged_split(const float* q, int64_t rows, const int32_t* row_seq,
                           const int32_t* row_pos, const dm::PagedKvView& kv, int64_t n_heads,
                           float scale, float* out);

// lse[r] = log sum exp(z[r] * inv_t) (nullable); target_logprob[r] = z[r][targets[r]] * inv_t -
// lse[r] when targets and target_logprob are both given.
void log_softmax(const float* z, int64_t rows, int64_t vocab, float inv_t, const int32_t* targets,
                 float* lse, float* target_logprob);

// One token per row with its own parameters and random stream (advanced in place); scratch is
// rows * vocab int32.
void sample(const float* z, int64_t rows, int64_t vocab, const dm::SampleParams* params,
            dm::RngState* rng, int32_t* scratch, dm::SampleResult* out);

}  // namespace fp8rl::kernels::cpu
