// The linear layers' backend boundary: a weight prepared in the format its precision needs and
// the three GEMMs of training (fprop, dgrad, wgrad) on it. fp32/bf16 go through BLAS, fp8 through
// the shared kernel module (kernels::gemm_fp8), so a CUDA backend replaces only this file's
// implementation.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/quantize.h"
#include "model/precision.h"

namespace fp8rl::model {

struct LinearWeight {
  int64_t out = 0;  // N
  int64_t in = 0;   // K
  Precision precision = Precision::kF32;
  bool pow2_scales = false;
  const float* master = nullptr;  // fp32 [out, in], owned by the model's parameter buffer
  std::vector<float> bf16;        // kBF16: master rounded to bf16
  kernels::Fp8Matrix q;           // kFP8: 128x128-block E4M3 weight
  kernels::Fp8Matrix qt;          // kFP8: transpose_blocks(q), the dgrad operand
  // Forward GEMM accumulated in double (dgemm on this copy of dense()) and rounded to fp32 once.
  // BLAS sgemm results for a row change in the last bit with the number of rows in the call;
  // when the output is then rounded (bf16 outputs, bf16/E4M3 KV cache) such a bit can flip a
  // rounding, and prefill (many rows) and decode (few rows) would disagree. With double
  // accumulation the fp32 result is the same for any batch shape (up to ~2^-29 per element).
  std::vector<double> exact;
  // fp32 operand for the BLAS paths.
  const float* dense() const { return precision == Precision::kF32 ? master : bf16.data(); }
};

// Derives the weight's working copy from `master` (rounding or quantizing it). kBF16 always
// accumulates in double; `exact_accumulate` asks for it with kF32 too (outputs that get rounded).
void prepare_linear(const float* master, int64_t out, int64_t in, Precision precision,
                    bool pow2_scales, LinearWeight* w, bool exact_accumulate = false);
// kFP8 with codes and scales given (an FP8 checkpoint, used as is); `master` holds their
// dequantized values.
void prepare_linear_fp8(const float* master, kernels::Fp8Matrix q, bool pow2_scales,
                        LinearWeight* w);

// y[m, out] = x[m, in] . W^T (+ bias); rounded to bf16 unless the precision is kF32.
absl::Status linear_forward(const LinearWeight& w, const float* x, int64_t m, const float* bias,
                            float* y);
// dx[m, in] = dy . W (overwritten); dw[out, in] += dy^T . x; db[out] += sum_rows dy (if db).
absl::Status linear_backward(const LinearWeight& w, const float* x, const float* dy, int64_t m,
                             float* dx, float* dw, float* db);

}  // namespace fp8rl::model
