// Launchers of the training kernels (train_kernels.cu), internal to kernels/cuda: arguments are
// already checked by train_cuda.cc; each returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::cuda::internal {

cudaError_t launch_rmsnorm_backward(const float* x, const float* g, const float* inv,
                                    const float* dy, int64_t rows, int64_t h, float* dx, float* dg,
                                    cudaStream_t stream);
cudaError_t launch_rope_inverse(const float* cos, const float* sin, const int32_t* pos,
                                int64_t rows, int64_t heads, int64_t head_dim, float* x,
                                cudaStream_t stream);
cudaError_t launch_swiglu_backward(const float* g, const float* u, const float* dact, int64_t n,
                                   float* dg, float* du, cudaStream_t stream);
cudaError_t launch_attention_backward(const float* q, const float* k, const float* v,
                                      const float* dout, const int32_t* seq_start,
                                      const int32_t* row_seq, int64_t rows, int64_t n_heads,
                                      int64_t n_kv, int64_t head_dim, float scale, float* stats,
                                      float* dq, float* dk, float* dv, cudaStream_t stream);
cudaError_t launch_head_dlogits(float* z, int64_t rows, int64_t vocab, float inv_t,
                                const int32_t* targets, const float* lse, const float* dlogp,
                                cudaStream_t stream);
cudaError_t launch_embed_backward(const float* dx, const int32_t* tokens, int64_t rows, int64_t h,
                                  float* dembed, cudaStream_t stream);
cudaError_t launch_kv_fake_quant(float* x, int64_t n, dm::KvDtype dtype, float scale,
                                 cudaStream_t stream);
cudaError_t launch_seq_amax(const float* x, int64_t width, const int32_t* seq_start, int64_t n_seq,
                            float* amax, cudaStream_t stream);
cudaError_t launch_transpose_pad(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out,
                                 uint16_t* out_bf16, cudaStream_t stream);
cudaError_t launch_to_bf16_bits(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);
cudaError_t launch_gemm_nt_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                                  int64_t k, bool accumulate, cudaStream_t stream);
cudaError_t launch_gemm_nn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                                  int64_t k, cudaStream_t stream);
cudaError_t launch_gemm_tn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                                  int64_t k, cudaStream_t stream);
cudaError_t launch_column_sum(const float* x, int64_t rows, int64_t cols, float* out,
                              cudaStream_t stream);
cudaError_t launch_add(float* y, const float* x, int64_t n, bool to_bf16, cudaStream_t stream);

}  // namespace fp8rl::kernels::cuda::internal
