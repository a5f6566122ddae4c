// The decoder's non-GEMM ops on the GPU: embedding gather, RMSNorm, RoPE, SwiGLU, causal GQA
// prefill attention, a paged KV cache (write + attention with in-kernel FP8 dequantization),
// log-softmax and temperature/top-p/top-k sampling with per-sample random streams. 1x128
// activation quantization is quantize(..., kTile1x128, ...) in fp8_cuda.h.
//
// Each op is the same computation as its CPU reference in kernels/cpu/decoder_ops.h (same
// shapes, same layouts, same shared math from kernels/device_math), on device pointers and an
// explicit stream; see that header for the shapes. Agreement with the CPU: bit for bit where no
// exp/log is involved (embedding, RMSNorm, RoPE, paged KV writes, bf16/fp8 rounding), a few fp32
// ulp where one is (SwiGLU, attention, log-softmax), identical tokens in sampling unless a draw
// lands within ~1e-15 of a cumulative-mass boundary.
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
#include "kernels/device_math/paged_kv.h"
#include "kernels/device_math/sampling.h"

namespace fp8rl::kernels::cuda {

// Which kernels attention_prefill, attention_paged, log_softmax and sample launch. kFast: the
// block-parallel ones (split-context attention in dm::attend_row_split's order, block-reduced
// log-softmax and sampling) where the shape allows, else the simple ones; kSimple: the simple
// one-thread-per-row kernels (the reference mapping, kept to compare and benchmark against).
// kDefault is kFast unless the environment variable FP8RL_DECODER_KERNELS=simple is set (read once
// per process), so the old path can be selected without rebuilding.
enum class DecoderKernels { kDefault, kFast, kSimple };

// The choice kDefault resolves to in this process.
DecoderKernels default_decoder_kernels();

// bad_count (device int32, nullable) is incremented once per row whose token is out of range;
// such rows are filled with NaN.
absl::Status embed_gather(const float* table, int64_t vocab, int64_t h, const int32_t* tokens,
                          int64_t rows, float* x, int32_t* bad_count, Stream stream);

absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, float eps,
                     bool to_bf16, float* y, float* inv_rms, Stream stream);

// cos/sin: device tables [max_pos, head_dim / 2] (model/ops.cc rope_fill); pos[r] < max_pos.
absl::Status rope(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                  int64_t heads, int64_t head_dim, bool to_bf16, float* x, Stream stream);

absl::Status swiglu(const float* g, const float* u, int64_t n, bool to_bf16, float* act,
                    Stream stream);

// seq_start: device int32 [n_seq + 1], 0 = seq_start[0] < ... < seq_start[n_seq] = rows.
// The fast kernel (a block per (tile of 4 query rows, head), each key/value row loaded once for
// the tile, every row in dm::attend_row_split's order, the decode kernel's, so that prefill and
// decode on the device compute the same function bit for bit; reference
// cpu::attention_prefill_split) needs head_dim % 8 == 0, head_dim <= 256, 16-byte aligned k and
// v and rows * n_heads < 2^31; other shapes run the simple kernel (cpu::attention_prefill).
absl::Status attention_prefill(const float* q, const float* k, const float* v,
                               const int32_t* seq_start, int64_t n_seq, int64_t rows,
                               int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                               float* out, Stream stream,
                               DecoderKernels kernels = DecoderKernels::kDefault);

// Whether attention_prefill with `kernels` runs the split kernel for this shape.
bool attention_prefill_uses_split(const float* k, const float* v, int64_t rows, int64_t n_heads,
                                  int64_t head_dim,
                                  DecoderKernels kernels = DecoderKernels::kDefault);

// kv: device pools and block table (dm::PagedKvView documents the layout).
absl::Status kv_write_paged(const float* k, const float* v, int64_t rows, const int32_t* row_seq,
                            const int32_t* row_pos, const dm::PagedKvView& kv, Stream stream);
// The fast kernel (dm::attend_row_split's order; reference cpu::attention_paged_split) needs
// kv.head_dim % 8 == 0, kv.head_dim <= dm::kSplitMaxHeadDim (256), 16-byte aligned pools and
// rows * n_heads < 2^31; other shapes run the simple kernel (reference cpu::attention_paged).
absl::Status attention_paged(const float* q, int64_t rows, const int32_t* row_seq,
                             const int32_t* row_pos, const dm::PagedKvView& kv, int64_t n_heads,
                             float scale, float* out, Stream stream,
                             DecoderKernels kernels = DecoderKernels::kDefault);

// Whether attention_paged with `kernels` runs the split kernel for this shape.
bool attention_paged_uses_split(const dm::PagedKvView& kv, int64_t rows, int64_t n_heads,
                                DecoderKernels kernels = DecoderKernels::kDefault);

// The fast kernel (one block per row; reference dm::logsumexp_scaled_blocked) sums in another
// order than cpu::log_softmax: the same fp32 lse except where a float64 rounding decides.
absl::Status log_softmax(const float* z, int64_t rows, int64_t vocab, float inv_t,
                         const int32_t* targets, float* lse, float* target_logprob, Stream stream,
                         DecoderKernels kernels = DecoderKernels::kDefault);

// params, rng (advanced in place), scratch (rows * vocab int32) and out are device arrays. The
// fast kernel (one block per row; reference dm::sample_row_blocked) parallelizes the log-sum-exp,
// greedy argmax and untruncated draws; top-k/top-p rows still run the heap on one thread.
absl::Status sample(const float* z, int64_t rows, int64_t vocab, const dm::SampleParams* params,
                    dm::RngState* rng, int32_t* scratch, dm::SampleResult* out, Stream stream,
                    DecoderKernels kernels = DecoderKernels::kDefault);

}  // namespace fp8rl::kernels::cuda
