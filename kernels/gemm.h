// Block-scaled FP8 GEMM, CPU reference: Y[M,N] = A[M,K] . B[N,K]^T ("TN", K contiguous in both).
//
// Each operand carries its scaling (kTile1x128 or kBlock128x128 along K). Accumulation is fp32
// and promoted per 128-wide K block:
//   Y[m,n] = sum_kb sa(m,kb) * sb(n,kb) * sum_{k in kb} qa[m,k] * qb[n,k]
// The three training GEMMs map onto it:
//   fprop  Y  = X . W^T      A = X  [M,K] 1x128,     B = W [N,K] 128x128
//   dgrad  dX = dY . W       A = dY [M,N] 1x128,     B = transpose_blocks(W) [K,N] 128x128
//   wgrad  dW = dY^T . X     A = dY^T [N,M] 1x128,   B = X^T [K,M] 1x128
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/quantize.h"

namespace fp8rl::kernels {

enum class OutDtype { kF32, kBF16 };  // kBF16: every output rounded to bf16 (kept in a float)

// y[M, N] (row-major, ldy = N). Errors (never wrong numbers) on mismatched K, per-tensor
// operands, or scale tensors of the wrong size. With accumulate, adds into y instead of
// overwriting (the bf16 rounding then applies to the sum).
absl::Status gemm_fp8(const Fp8Matrix& a, const Fp8Matrix& b, float* y,
                      OutDtype out = OutDtype::kF32, bool accumulate = false);

// Plain fp32 reference: y[M,N] = a[M,K] . b[N,K]^T (+ y when accumulate), through BLAS sgemm.
void gemm_f32(const float* a, const float* b, float* y, int64_t m, int64_t n, int64_t k,
              bool accumulate = false);

}  // namespace fp8rl::kernels
