// Block-scaled E4M3 quantization on the CPU: the reference every other path (CUDA kernels,
// checkpoint writer, KV cache) must match bit for bit.
#include "kernels/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "kernels/formats.h"

namespace fp8rl::kernels {
namespace {

constexpr float kFloatMax = std::numeric_limits<float>::max();
constexpr int kMinPow2Exponent = -149;  // 2^-149, the smallest positive float
// Elements per parallel chunk for element-wise loops (a few tens of microseconds of work).
constexpr int64_t kElementGrain = 1 << 15;

[[noreturn]] void fatal(const char* what) {
  std::fprintf(stderr, "fp8rl::kernels: %s\n", what);
  std::abort();
}

// Largest finite |x| of x[0, n) (NaN and +-inf ignored). Works on the bit patterns: for finite
// non-negative floats the integer order is the numeric order, and this form vectorizes.
float finite_amax(const float* x, int64_t n) {
  int32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t a = std::bit_cast<int32_t>(x[i]) & 0x7FFFFFFF;
    const int32_t finite = a < 0x7F800000 ? a : 0;
    amax_bits = finite > amax_bits ? finite : amax_bits;
  }
  return std::bit_cast<float>(amax_bits);
}

// q[i] = e4m3(x[i] / scale_inv) for i in [0, n). The divisions run as a separate (vectorized)
// loop over a small buffer; IEEE division gives the same quotients either way.
void encode(const float* x, int64_t n, float scale_inv, uint8_t* q) {
  constexpr int64_t kChunk = 256;
  float quotient[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    for (int64_t i = 0; i < len; ++i) quotient[i] = x[i0 + i] / scale_inv;
    for (int64_t i = 0; i < len; ++i) q[i0 + i] = float_to_e4m3(quotient[i]);
  }
}

// Quantizes the block x[r0:r1, c0:c1] of a row-major matrix with `cols` columns; returns its
// scale_inv.
float quantize_block(const float* x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                     bool pow2, uint8_t* q) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r) amax = std::max(amax, finite_amax(x + r * cols + c0, c1 - c0));
  const float scale_inv = compute_scale_inv(amax, pow2);
  for (int64_t r = r0; r < r1; ++r)
    encode(x + r * cols + c0, c1 - c0, scale_inv, q + r * cols + c0);
  return scale_inv;
}

void check_kv_scale_or_die(float scale) {
  if (!(scale > 0.0f && scale <= kFloatMax)) fatal("KV-cache scale must be positive and finite");
}

}  // namespace

const char* scaling_mode_name(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kPerTensor:
      return "per_tensor";
    case ScalingMode::kTile1x128:
      return "tile_1x128";
    case ScalingMode::kBlock128x128:
      return "block_128x128";
  }
  return "unknown";
}

int64_t Fp8Matrix::scale_rows() const {
  switch (mode) {
    case ScalingMode::kPerTensor:
      return 1;
    case ScalingMode::kTile1x128:
      return rows;
    case ScalingMode::kBlock128x128:
      return ceil_div(rows, kBlock);
  }
  return 0;
}

int64_t Fp8Matrix::scale_cols() const {
  return mode == ScalingMode::kPerTensor ? 1 : ceil_div(cols, kBlock);
}

float Fp8Matrix::scale_at(int64_t r, int64_t c) const {
  switch (mode) {
    case ScalingMode::kPerTensor:
      return scale_inv[0];
    case ScalingMode::kTile1x128:
      return scale_inv[r * scale_cols() + c / kBlock];
    case ScalingMode::kBlock128x128:
      return scale_inv[(r / kBlock) * scale_cols() + c / kBlock];
  }
  return 0.0f;
}

float compute_scale_inv(float amax, bool pow2_scales) {
  if (!(amax > 0.0f && amax <= kFloatMax)) return 1.0f;  // 0, negative, NaN, inf
  if (!pow2_scales) {
    const float s = amax / kE4M3Max;
    return s > 0.0f ? s : std::numeric_limits<float>::denorm_min();
  }
  // Smallest k with 448 * 2^k >= amax; the comparisons are exact in double.
  int k = 0;
  std::frexp(static_cast<double>(amax) / kE4M3Max, &k);  // amax/448 in [2^(k-1), 2^k)
  while (std::ldexp(static_cast<double>(kE4M3Max), k) < amax) ++k;
  while (std::ldexp(static_cast<double>(kE4M3Max), k - 1) >= amax) --k;
  return static_cast<float>(std::ldexp(1.0, std::max(k, kMinPow2Exponent)));
}

absl::Status check_fp8_matrix(const Fp8Matrix& q) {
  if (q.rows < 0 || q.cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 matrix: negative shape [", q.rows, ", ", q.cols, "]"));
  }
  if (static_cast<int64_t>(q.data.size()) != q.rows * q.cols) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 matrix: data has ", q.data.size(),
                                                   " codes, expected rows*cols = ", q.rows, "*",
                                                   q.cols, " = ", q.rows * q.cols));
  }
  const int64_t want = q.scale_rows() * q.scale_cols();
  if (static_cast<int64_t>(q.scale_inv.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 matrix: scale_inv has ", q.scale_inv.size(), " values, expected ",
                     q.scale_rows(), "x", q.scale_cols(), " = ", want, " for ",
                     scaling_mode_name(q.mode), " [", q.rows, ", ", q.cols, "]"));
  }
  for (size_t i = 0; i < q.scale_inv.size(); ++i) {
    const float s = q.scale_inv[i];
    if (!(s > 0.0f && s <= kFloatMax)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fp8 matrix: scale_inv[", i, "] = ", s, " is not positive and finite"));
    }
  }
  return absl::OkStatus();
}

Fp8Matrix quantize(const float* x, int64_t rows, int64_t cols, ScalingMode mode,
                   QuantOptions options) {
  if (rows < 0 || cols < 0) fatal("quantize: negative shape");
  Fp8Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.mode = mode;
  q.data.resize(static_cast<size_t>(rows * cols));
  q.scale_inv.assign(static_cast<size_t>(q.scale_rows() * q.scale_cols()), 1.0f);
  const int64_t n = rows * cols;
  if (n == 0) return q;
  const bool pow2 = options.pow2_scales;

  switch (mode) {
    case ScalingMode::kPerTensor: {
      // Two passes: a parallel amax reduction, then a parallel encode with the one scale.
      const int64_t num_chunks = ceil_div(n, kElementGrain);
      std::vector<float> partial(static_cast<size_t>(num_chunks), 0.0f);
      parallel_for(num_chunks, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          const int64_t lo = c * kElementGrain;
          partial[c] = finite_amax(x + lo, std::min(n, lo + kElementGrain) - lo);
        }
      });
      const float amax = *std::max_element(partial.begin(), partial.end());
      const float scale_inv = compute_scale_inv(amax, pow2);
      q.scale_inv[0] = scale_inv;
      parallel_for(
          n,
          [&](int64_t begin, int64_t end) {
            encode(x + begin, end - begin, scale_inv, q.data.data() + begin);
          },
          kElementGrain);
      break;
    }
    case ScalingMode::kTile1x128: {
      const int64_t tiles = q.scale_cols();
      parallel_for(
          rows,
          [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
              for (int64_t t = 0; t < tiles; ++t) {
                const int64_t c0 = t * kBlock;
                const int64_t c1 = std::min(cols, c0 + kBlock);
                q.scale_inv[r * tiles + t] =
                    quantize_block(x, cols, r, r + 1, c0, c1, pow2, q.data.data());
              }
            }
          },
          std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, cols)));
      break;
    }
    case ScalingMode::kBlock128x128: {
      const int64_t block_cols = q.scale_cols();
      const int64_t blocks = q.scale_rows() * block_cols;
      parallel_for(blocks, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const int64_t br = b / block_cols;
          const int64_t bc = b % block_cols;
          const int64_t r0 = br * kBlock;
          const int64_t c0 = bc * kBlock;
          q.scale_inv[b] = quantize_block(x, cols, r0, std::min(rows, r0 + kBlock), c0,
                                          std::min(cols, c0 + kBlock), pow2, q.data.data());
        }
      });
      break;
    }
  }
  return q;
}

void dequantize(const Fp8Matrix& q, float* out) {
  const float* table = e4m3_decode_table();
  const int64_t cols = q.cols;
  parallel_for(
      q.rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const uint8_t* src = q.data.data() + r * cols;
          float* dst = out + r * cols;
          for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
            const int64_t c1 = std::min(cols, c0 + kBlock);
            const float s = q.scale_at(r, c0);
            for (int64_t c = c0; c < c1; ++c) dst[c] = table[src[c]] * s;
          }
        }
      },
      std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, cols)));
}

Fp8Matrix transpose_blocks(const Fp8Matrix& w) {
  if (w.mode != ScalingMode::kBlock128x128) {
    fatal("transpose_blocks: the matrix must use 128x128 block scaling");
  }
  Fp8Matrix t;
  t.rows = w.cols;
  t.cols = w.rows;
  t.mode = ScalingMode::kBlock128x128;
  t.data.resize(w.data.size());
  t.scale_inv.resize(w.scale_inv.size());
  const int64_t src_block_rows = w.scale_rows();
  const int64_t src_block_cols = w.scale_cols();
  for (int64_t br = 0; br < src_block_rows; ++br) {
    for (int64_t bc = 0; bc < src_block_cols; ++bc) {
      t.scale_inv[bc * src_block_rows + br] = w.scale_inv[br * src_block_cols + bc];
    }
  }
  // Codes: t[c, r] = w[r, c], in 128-row bands of t (contiguous writes per band).
  parallel_for(ceil_div(t.rows, kBlock), [&](int64_t begin, int64_t end) {
    for (int64_t band = begin; band < end; ++band) {
      const int64_t c0 = band * kBlock;
      const int64_t c1 = std::min(t.rows, c0 + kBlock);
      for (int64_t r = 0; r < w.rows; ++r) {
        const uint8_t* src = w.data.data() + r * w.cols;
        for (int64_t c = c0; c < c1; ++c) t.data[c * t.cols + r] = src[c];
      }
    }
  });
  return t;
}

absl::Status check_kv_scale(float scale, const char* what) {
  if (scale > 0.0f && scale <= kFloatMax) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " = ", scale, ": must be positive and finite"));
}

void quantize_with_scale(const float* x, int64_t n, float scale, uint8_t* out) {
  check_kv_scale_or_die(scale);
  parallel_for(
      n, [&](int64_t begin, int64_t end) { encode(x + begin, end - begin, scale, out + begin); },
      kElementGrain);
}

void dequantize_with_scale(const uint8_t* q, int64_t n, float scale, float* out) {
  check_kv_scale_or_die(scale);
  const float* table = e4m3_decode_table();
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = table[q[i]] * scale;
      },
      kElementGrain);
}

void fake_quantize_with_scale(float* x, int64_t n, float scale) {
  check_kv_scale_or_die(scale);
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          x[i] = e4m3_to_float(float_to_e4m3(x[i] / scale)) * scale;
      },
      kElementGrain);
}

}  // namespace fp8rl::kernels
