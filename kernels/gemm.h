// Block-scaled FP8 GEMM, CPU reference: Y[M,N] = A[M,K] . B[N,K]^T ("TN", K contiguous in both).
//
// Each operand carries its scaling (kTile1x128 or kBlock128x128 along K). Accumulation is fp32
// and promoted per 128-wide K block:
//   Y[m,n] = sum_kb sa(m,kb) * sb(n,kb) * sum_{k in kb} qa[m,k] * qb[n,k]
// The three training GEMMs map onto it:
//   fprop  Y  = X . W^T      A = X  [M,K] 1x128,     B = W [N,K] 128x128
//   dgrad  dX = dY . W       A = dY [M,N] 1x128,     B = transpose_blocks(W) [K,N] 128x128
//   wgrad  dW = dY^T . X     A = dY^T [N,M] 1x128,   B = X^T [K,M] 1x128
//
// CPU implementation (kernels/cpu/gemm.cc): the codes of both operands are decoded to fp32
// (exact), then per output tile and per K block one OpenBLAS sgemm gives the block's partial
// sums, which are scaled by sa * sb and accumulated in fp32 in K-block order. Temporary memory:
// 4 * (M + N) * K bytes. OpenBLAS threads the sgemms; the decode and scaling passes run on
// common/parallel's pool. Measured at ~1.2-2.5x the time of a plain sgemm of the same shape
// (bench/gemm_cpu).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/quantize.h"

namespace fp8rl::kernels {

enum class OutDtype { kF32, kBF16 };  // kBF16: every output rounded to bf16 (kept in a float)

// y[M, N] (row-major, ldy = N). InvalidArgument (y untouched; never wrong numbers) on
// mismatched K, per-tensor operands, data or scale tensors of the wrong size or non-positive /
// non-finite scales (see check_fp8_matrix), a null y, or M, N, K beyond what BLAS indexes
// (2^31 - 1). With accumulate, y = y + A.B^T (the product is formed first, then added; the bf16
// rounding then applies to the sum).
absl::Status gemm_fp8(const Fp8Matrix& a, const Fp8Matrix& b, float* y,
                      OutDtype out = OutDtype::kF32, bool accumulate = false);

// Plain fp32 reference: y[M,N] = a[M,K] . b[N,K]^T (+ y when accumulate), through BLAS sgemm on
// one BLAS thread. Preconditions: 0 <= M, N, K < 2^31; K == 0 gives zeros.
void gemm_f32(const float* a, const float* b, float* y, int64_t m, int64_t n, int64_t k,
              bool accumulate = false);

// Sets OpenBLAS to one thread when it is not (every GEMM above calls it first; so does
// model/linear.cc before its own BLAS calls). Two reasons: OpenBLAS's value for an output element
// can depend on how many threads split the matrix (edge micro-tiles sum in another order), so a
// GEMM would give other bits in a process, or a part of one, that ran with another count -- the
// sampler and the learner must not; and our thread pool already splits large GEMMs by rows.
void use_single_threaded_blas();

// The CPU kernel set OpenBLAS chose at run time ("Haswell", "SkylakeX", "Zen", ...): which
// micro-kernels, and so which summation order, the BLAS calls above use on this machine.
std::string blas_core_name();

}  // namespace fp8rl::kernels
