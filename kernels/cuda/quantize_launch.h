// Launchers of the quantization kernels (quantize_kernels.cu), kept free of absl so nvcc only
// sees plain C++; quantize_cuda.cc validates arguments and turns the results into absl::Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8rl::kernels::cuda::internal {

// 1x128 tiles along cols; scale_inv in the device layout, ld = round_up(rows, 4).
cudaError_t launch_quantize_tile1x128(const float* x, int64_t rows, int64_t cols, bool pow2,
                                      uint8_t* q, float* scale_inv, int64_t scale_ld,
                                      cudaStream_t stream);
// 128x128 blocks; scale_inv row-major over blocks, ld = round_up(ceil(cols/128), 4).
cudaError_t launch_quantize_block128x128(const float* x, int64_t rows, int64_t cols, bool pow2,
                                         uint8_t* q, float* scale_inv, int64_t scale_ld,
                                         cudaStream_t stream);
// One scale from the amax of all n elements (scale_inv[0] doubles as the amax accumulator).
cudaError_t launch_quantize_per_tensor(const float* x, int64_t n, bool pow2, uint8_t* q,
                                       float* scale_inv, cudaStream_t stream);
// q[i] = e4m3(x[i] / scale).
cudaError_t launch_quantize_with_scale(const float* x, int64_t n, float scale, uint8_t* q,
                                       cudaStream_t stream);
// out[i] = e4m3_to_float(q[i]) * scale.
cudaError_t launch_dequantize_with_scale(const uint8_t* q, int64_t n, float scale, float* out,
                                         cudaStream_t stream);
// mode: 0 per-tensor, 1 tile 1x128, 2 block 128x128 (device scale layout with scale_ld).
cudaError_t launch_dequantize(const uint8_t* q, int64_t rows, int64_t cols, int mode,
                              const float* scale_inv, int64_t scale_ld, float* out,
                              cudaStream_t stream);

// W [rows, cols] 128x128-block scaled -> W^T [cols, rows]: codes transposed, block scales
// transposed (ld_in / ld_out: the device scale lds of W and W^T).
cudaError_t launch_transpose_blocks(const uint8_t* w, const float* w_scales, int64_t rows,
                                    int64_t cols, int64_t ld_in, uint8_t* t, float* t_scales,
                                    int64_t ld_out, cudaStream_t stream);

}  // namespace fp8rl::kernels::cuda::internal
