// Block-scaled FP8 quantization: the scaling mode is carried by the tensor (per-tensor, 1x128
// tiles, 128x128 blocks) and one `quantize` entry point dispatches on it. CPU reference.
//
// Recipe (docs/design/fp8-recipe.md "The FP8 recipe"):
//   scale_inv = amax / 448 (fp32), a block with amax 0 gets scale_inv 1;
//   with pow2 scales scale_inv = 2^ceil(log2(amax / 448));
//   q = e4m3(x / scale_inv)   (a true fp32 division, not a multiply by the reciprocal);
//   x ~= e4m3_to_float(q) * scale_inv.
//
// Scale-tensor layouts of Fp8Matrix (row-major, no padding on the CPU):
//   kPerTensor      scale_inv[1]
//   kTile1x128      scale_inv[rows][ceil(cols/128)]          (tiles along the reduced dim, cols)
//   kBlock128x128   scale_inv[ceil(rows/128)][ceil(cols/128)]
// Partial edge tiles/blocks are scaled by the amax of the elements they hold.
// (The CUDA path may keep its own padded / M-major copy of 1x128 scales for cuBLASLt; that layout
// is documented in kernels/cuda/. The layout above is the one every module exchanges.)
//
// Non-finite input: amax is taken over the FINITE elements of a block only (NaN and +-inf are
// ignored), so one bad value does not wipe out the scale of its neighbours. +-inf then saturates
// to +-448 (dequantizes to +-448 * scale_inv) and NaN is stored as the E4M3 NaN 0x7F (dequantizes
// to NaN). A block with no finite non-zero element gets scale_inv 1.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace fp8rl::kernels {

inline constexpr int64_t kBlock = 128;

enum class ScalingMode { kPerTensor, kTile1x128, kBlock128x128 };

const char* scaling_mode_name(ScalingMode mode);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct QuantOptions {
  bool pow2_scales = false;
};

// An E4M3 matrix [rows, cols], row-major (cols contiguous), with its scales.
struct Fp8Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  ScalingMode mode = ScalingMode::kTile1x128;
  std::vector<uint8_t> data;     // rows * cols E4M3 codes
  std::vector<float> scale_inv;  // layout by mode, see above

  int64_t scale_rows() const;  // 1, rows, or ceil(rows/128)
  int64_t scale_cols() const;  // 1, ceil(cols/128), or ceil(cols/128)
  // Dequantization multiplier of element (r, c).
  float scale_at(int64_t r, int64_t c) const;
};

// scale_inv for a block whose largest finite |x| is amax:
//   amax / 448 in fp32, or with pow2_scales the smallest power of two p with 448 * p >= amax
//   (= 2^ceil(log2(amax/448)) computed exactly, so amax / p <= 448 always holds).
// amax <= 0 or not finite -> 1. If amax / 448 underflows to 0 (amax < ~6e-43) the smallest
// positive float is used so the division stays finite.
float compute_scale_inv(float amax, bool pow2_scales);

// Checks that q's data and scale_inv sizes match rows, cols and mode, and that every scale is
// positive and finite. Use it on matrices that come from outside (files, the network).
absl::Status check_fp8_matrix(const Fp8Matrix& q);

// Quantizes x[rows, cols] (row-major fp32; rows, cols >= 0). Multithreaded.
Fp8Matrix quantize(const float* x, int64_t rows, int64_t cols, ScalingMode mode,
                   QuantOptions options = {});

// out[rows, cols] = e4m3_to_float(q) * scale_inv of its block.
void dequantize(const Fp8Matrix& q, float* out);

// Exact transpose of a 128x128-block matrix: codes transposed, block scales transposed.
// (Block scaling is symmetric, so W^T needs no requantization; dgrad uses this.)
// Precondition: w.mode == kBlock128x128 (anything else is a programming error and aborts).
Fp8Matrix transpose_blocks(const Fp8Matrix& w);

// Per-tensor quantization with a given scale (KV cache, vLLM convention):
// out[i] = e4m3(x[i] / scale); read back as e4m3_to_float(q) * scale.
// The scale must be positive and finite: validate scales that come from outside with
// check_kv_scale (the functions below abort on an invalid scale rather than write garbage).
void quantize_with_scale(const float* x, int64_t n, float scale, uint8_t* out);
void dequantize_with_scale(const uint8_t* q, int64_t n, float scale, float* out);
// Round-trip x through E4M3 with a given scale, in place (fake quantization).
void fake_quantize_with_scale(float* x, int64_t n, float scale);
// OK when scale is positive and finite; otherwise InvalidArgument naming `what`.
absl::Status check_kv_scale(float scale, const char* what = "kv scale");

}  // namespace fp8rl::kernels
