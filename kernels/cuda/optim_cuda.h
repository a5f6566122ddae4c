// The CUDA path of the trainer's optimizer step and of its per-step bookkeeping: the global
// gradient norm, the AdamW update, K/V amax for KV calibration, bf16 rounding for export, and the
// view-based block transpose the re-quantization needs. Plain C++ API over device pointers and an
// explicit stream, like fp8_cuda.h. CPU references: model::AdamW (model/optimizer.cc) with the
// shared element update kernels/device_math/adamw.h; kernels/cpu seq_amax; kernels::dm
// float_to_bf16; kernels::transpose_blocks.
//
// Sum of squares, order and bound: pass 1 runs B = min(1024, ceil(n / 256)) blocks of 256
// threads; thread t of block b adds, in index order, the squares of elements b*256 + t + k*B*256
// in double, the block then adds its 256 sums in a fixed tree; pass 2 adds the B block sums the
// same way (thread t: sums t, t+256, ...; then the tree). The order depends on n only, so the
// result is deterministic run to run. model::AdamW adds the same terms sequentially instead. Each
// term (a float squared) is exact in double and non-negative, so each order is within
// (n - 1) * 2^-53 of the exact sum relative to it (Higham, recursive summation of non-negative
// terms); the two norms therefore differ by at most (n - 1) * 2^-53 relative (sqrt halves the
// 2(n-1)u of the sums): 1.1e-7 at n = 1e9, under one fp32 ulp of the clip factor, and 1e-11 for
// the tiny models of the tests.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/device_math/adamw.h"

namespace fp8rl::kernels::cuda {

// Device workspace of scale_and_sum_squares: 1025 doubles.
inline constexpr int64_t kSumSquaresWorkspaceBytes = (1024 + 1) * 8;

// g[i] *= scale for i < n (in place), then the double sum of g[i]^2 in the fixed order above,
// returned to the host (waits for the stream). `workspace`: kSumSquaresWorkspaceBytes, device.
absl::StatusOr<double> scale_and_sum_squares(float* g, int64_t n, float scale, void* workspace,
                                             Stream stream);
// g[i] *= clip, then dm::adamw_update(g[i], decay, c, p[i], m[i], v[i]) for i < n.
absl::Status adamw_step(float* p, float* m, float* v, float* g, int64_t n, float clip, bool decay,
                        const dm::AdamWCoeffs& c, Stream stream);
// *slot = max(*slot, |x[i]| for i < n), NaN skipped, +-inf kept; *slot must be >= 0 (a zeroed
// slot). Order-independent (an atomic max), so exact.
absl::Status amax_into(const float* x, int64_t n, float* slot, Stream stream);
// The same over bf16 bits (K/V kept as bf16 by a bf16 forward).
absl::Status amax_into_bf16(const uint16_t* x, int64_t n, float* slot, Stream stream);
// out[i] = bf16 bits of x[i], round to nearest even.
absl::Status round_bf16(const float* x, int64_t n, uint16_t* out, Stream stream);
// transpose_blocks into caller-owned storage: t [w.cols, w.rows] codes and t_scales in the device
// layout of a [w.cols, w.rows] kBlock128x128 matrix.
absl::Status transpose_blocks_into(const Fp8DeviceView& w, uint8_t* t, float* t_scales,
                                   Stream stream);
// cudaMemsetAsync(dst, 0, bytes).
absl::Status fill_zero(void* dst, int64_t bytes, Stream stream);

}  // namespace fp8rl::kernels::cuda
