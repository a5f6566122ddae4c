// The CUDA backend's own small kernels: the glue between the decoder kernels (kernels/cuda) and
// the GEMMs -- residual adds and bf16 rounding at the training step's points, the linear
// epilogue (bias, then one bf16 rounding), fp32 -> bf16 bits for the BF16 GEMM operand, an fp32
// GEMM accumulated in double (the CPU's fp32/bf16 linears accumulate in double, model/linear.h),
// and the row gather of the output rows. Each is the loop of its CPU counterpart in
// engine/cpu/decoder_ops.cc / model/linear.cc with the same float arithmetic (built with
// --fmad=false). Device pointers, one stream, nothing synchronizes. Ran on an H200.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/fp8_cuda.h"

namespace fp8rl::engine::cuda {

using Stream = kernels::cuda::Stream;

// y[i] += x[i], then bf16 rounding when rb (n values).
absl::Status add_round(float* y, const float* x, int64_t n, bool rb, Stream stream);
// x[i] = round_bf16(x[i]).
absl::Status round_bf16(float* x, int64_t n, Stream stream);
// y[r, j] += bias[j] (bias nullable), then bf16 rounding when rb; y is [rows, n].
absl::Status bias_round(float* y, const float* bias, int64_t rows, int64_t n, bool rb,
                        Stream stream);
// out[i] = bf16 bits of x[i] (round to nearest even; x already bf16-valued on our paths).
absl::Status to_bf16_bits(const float* x, int64_t n, uint16_t* out, Stream stream);
// y[m, n] = x[m, k] . w[n, k]^T, each dot product summed in double over k = 0..k-1 in order and
// rounded to fp32 once (the CPU's dgemm-on-a-double-copy path, independent of the batch shape).
absl::Status gemm_f64acc(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                         Stream stream);
// out[i, :] = x[rows[i], :] (width h), i < n.
absl::Status gather_rows(const float* x, int64_t h, const int32_t* rows, int64_t n, float* out,
                         Stream stream);

}  // namespace fp8rl::engine::cuda
