// Launchers of the decoder kernels (decoder_kernels.cu), internal to kernels/cuda: arguments are
// already checked by decoder_cuda.cc; each returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/device_math/paged_kv.h"
#include "kernels/device_math/sampling.h"

namespace fp8rl::kernels::cuda::internal {

cudaError_t launch_embed_gather(const float* table, int64_t vocab, int64_t h, const int32_t* tokens,
                                int64_t rows, float* x, int32_t* bad_count, cudaStream_t stream);
cudaError_t launch_rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, float eps,
                           bool to_bf16, float* y, float* inv_rms, cudaStream_t stream);
cudaError_t launch_rope(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                        int64_t heads, int64_t head_dim, bool to_bf16, float* x,
                        cudaStream_t stream);
cudaError_t launch_swiglu(const float* g, const float* u, int64_t n, bool to_bf16, float* act,
                          cudaStream_t stream);
cudaError_t launch_attention_prefill(const float* q, const float* k, const float* v,
                                     const int32_t* seq_start, int64_t n_seq, int64_t rows,
                                     int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                                     float* out, cudaStream_t stream);
// The query-tiled split-context prefill (dm::attend_row_split's order per row): the conditions
// of launch_attention_paged_split on head_dim, k, v and rows * n_heads.
cudaError_t launch_attention_prefill_split(const float* q, const float* k, const float* v,
                                           const int32_t* seq_start, int64_t n_seq, int64_t rows,
                                           int64_t n_heads, int64_t n_kv, int64_t head_dim,
                                           float scale, float* out, cudaStream_t stream);
cudaError_t launch_kv_write_paged(const float* k, const float* v, int64_t rows,
                                  const int32_t* row_seq, const int32_t* row_pos,
                                  const dm::PagedKvView& kv, cudaStream_t stream);
cudaError_t launch_attention_paged(const float* q, int64_t rows, const int32_t* row_seq,
                                   const int32_t* row_pos, const dm::PagedKvView& kv,
                                   int64_t n_heads, float scale, float* out, cudaStream_t stream);
// The split-context kernel (dm::attend_row_split's order): head_dim % 8 == 0, head_dim <=
// dm::kSplitMaxHeadDim, 16-byte aligned pools, rows * n_heads < 2^31 (checked by the caller).
cudaError_t launch_attention_paged_split(const float* q, int64_t rows, const int32_t* row_seq,
                                         const int32_t* row_pos, const dm::PagedKvView& kv,
                                         int64_t n_heads, float scale, float* out,
                                         cudaStream_t stream);
cudaError_t launch_log_softmax(const float* z, int64_t rows, int64_t vocab, float inv_t,
                               const int32_t* targets, float* lse, float* target_logprob,
                               cudaStream_t stream);
cudaError_t launch_sample(const float* z, int64_t rows, int64_t vocab,
                          const dm::SampleParams* params, dm::RngState* rng, int32_t* scratch,
                          dm::SampleResult* out, cudaStream_t stream);

// One block of dm::kRowThreads per row (dm::sampling_blocked.h's order); rows < 2^31.
cudaError_t launch_log_softmax_block(const float* z, int64_t rows, int64_t vocab, float inv_t,
                                     const int32_t* targets, float* lse, float* target_logprob,
                                     cudaStream_t stream);
cudaError_t launch_sample_block(const float* z, int64_t rows, int64_t vocab,
                                const dm::SampleParams* params, dm::RngState* rng, int32_t* scratch,
                                dm::SampleResult* out, cudaStream_t stream);

}  // namespace fp8rl::kernels::cuda::internal
