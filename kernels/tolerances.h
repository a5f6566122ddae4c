// Named numerical tolerances of the FP8 module, in one place, so every test (CPU, CUDA, model)
// judges the same function by the same bar. Quantization itself has no tolerance: codes and
// scales are compared bit for bit.
#pragma once

namespace fp8rl::kernels {

// calc_diff (kernels/calc_diff.h) = 1 - 2*sum(x*y) / (sum(x*x) + sum(y*y)), in float64, between
// an FP8 GEMM and the exact GEMM of the unquantized data. E4M3 on both operands lands near 6e-4 for
// Gaussian data; below this bar the FP8 GEMM computes the same function (DeepGEMM's criterion).
inline constexpr double kFp8GemmMaxCalcDiff = 1e-3;

// |gemm_fp8 - exact per-K-block formula on the codes| <= this * sum_kb |sa*sb| * sum |qa*qb|.
// The products of two E4M3 values are exact in fp32; what is left is fp32 summation over a
// 128-wide block (OpenBLAS may reorder it) and the fp32 promotion over K blocks.
inline constexpr double kFp8GemmFormulaRelTol = 2e-6;

// Round trip through E4M3 with scale s: |x - deq(q(x))| <= max(2^-4 * |x|, 2^-10 * s)
// (half an ulp of a 3-bit mantissa in the normal range, half the subnormal step below it).
inline constexpr double kE4M3RoundTripRelError = 0.0625;              // 2^-4
inline constexpr double kE4M3SubnormalAbsErrorPerScale = 1.0 / 1024;  // 2^-10

// A CUDA FP8 GEMM against gemm_fp8 on the same codes and scales: tensor cores sum in a different
// order (and with limited internal precision before the per-block promotion), so the outputs are
// compared scale-free.
inline constexpr double kCudaVsCpuGemmMaxCalcDiff = 1e-5;

}  // namespace fp8rl::kernels
