// Block-scaled FP8 GEMM on the CPU: the reference the CUDA path is tested against, and fast
// enough (OpenBLAS for the per-block inner products) to serve the CPU model engine.
//
// Y[m,n] = sum_kb (sa(m,kb) * sb(n,kb)) * P_kb[m,n],  P_kb = sum_{k in kb} qa[m,k] * qb[n,k]
//
// How: both operands' codes are decoded to fp32 once (exact: E4M3 values fit in fp32). Y is
// computed in tiles of kTileM x kTileN; for each tile and each 128-wide K block one sgemm gives
// P_kb (products of two E4M3 values are exact in fp32; the 128-term sums are fp32), which is then
// scaled by sa * sb in fp32 and added to the tile's fp32 accumulator, in K-block order. A tile's
// P_kb and accumulator stay in cache, so the promotion costs little next to the sgemm itself.
#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "kernels/formats.h"

namespace fp8rl::kernels {
namespace {

// Output tile. Large enough for efficient sgemm calls, small enough that P_kb (kTileM*kTileN
// floats) and the accumulator stay in L2.
constexpr int64_t kTileM = 256;
constexpr int64_t kTileN = 256;
// Elements per parallel chunk for decode loops and for the scale-and-accumulate pass.
constexpr int64_t kDecodeGrain = 1 << 16;
constexpr int64_t kScaleGrain = 1 << 14;
// Up to this many rows in A the small-M path (no BLAS, no decoded copy of B) is used.
constexpr int64_t kSmallM = 16;
// BLAS takes int sizes and leading dimensions.
constexpr int64_t kMaxBlasDim = std::numeric_limits<int>::max();

absl::Status check_operand(const Fp8Matrix& m, const char* name) {
  if (m.mode == ScalingMode::kPerTensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemm_fp8: operand ", name,
                     " uses per_tensor scaling; it must be tile_1x128 or "
                     "block_128x128 along K"));
  }
  absl::Status s = check_fp8_matrix(m);
  if (!s.ok())
    return absl::InvalidArgumentError(absl::StrCat("gemm_fp8: operand ", name, ": ", s.message()));
  return absl::OkStatus();
}

// Decodes E4M3 codes to fp32 (no scaling).
std::vector<float> decode_codes(const std::vector<uint8_t>& codes) {
  std::vector<float> out(codes.size());
  const float* table = e4m3_decode_table();
  parallel_for(
      static_cast<int64_t>(codes.size()),
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = table[codes[i]];
      },
      kDecodeGrain);
  return out;
}

// Scales of an operand per K block: out[kb * rows + r] = s(r, kb) (contiguous along rows).
std::vector<float> scales_by_k_block(const Fp8Matrix& m, int64_t num_k_blocks) {
  std::vector<float> out(static_cast<size_t>(num_k_blocks * m.rows));
  for (int64_t kb = 0; kb < num_k_blocks; ++kb) {
    for (int64_t r = 0; r < m.rows; ++r) out[kb * m.rows + r] = m.scale_at(r, kb * kBlock);
  }
  return out;
}

// y = (accumulate ? y + v : v), rounded to bf16 when asked.
inline float finish(float v, float y_in, OutDtype out, bool accumulate) {
  const float s = accumulate ? y_in + v : v;
  return out == OutDtype::kBF16 ? round_bf16(s) : s;
}

// sum_t x[t] * y[t] in fp32 over kLanes interleaved partial sums (so the compiler vectorizes it).
float dot(const float* x, const float* y, int64_t n) {
  constexpr int64_t kLanes = 8;
  float lanes[kLanes] = {};
  int64_t t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[t + l] * y[t + l];
  }
  for (; t < n; ++t) lanes[0] += x[t] * y[t];
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  return sum;
}

// The general path: decoded operands, per-tile per-K-block sgemm, fp32 promotion.
void gemm_tiled(const Fp8Matrix& a, const Fp8Matrix& b, float* y, OutDtype out, bool accumulate) {
  const int64_t m = a.rows;
  const int64_t n = b.rows;
  const int64_t k = a.cols;
  const std::vector<float> af = decode_codes(a.data);  // [m, k]
  const std::vector<float> bf = decode_codes(b.data);  // [n, k]
  const int64_t num_k_blocks = ceil_div(k, kBlock);
  const std::vector<float> sa = scales_by_k_block(a, num_k_blocks);  // [kb][m]
  const std::vector<float> sb = scales_by_k_block(b, num_k_blocks);  // [kb][n]

  std::vector<float> partial(static_cast<size_t>(kTileM * kTileN));  // P_kb of one tile
  std::vector<float> acc(static_cast<size_t>(kTileM * kTileN));
  for (int64_t m0 = 0; m0 < m; m0 += kTileM) {
    const int64_t tm = std::min(kTileM, m - m0);
    for (int64_t n0 = 0; n0 < n; n0 += kTileN) {
      const int64_t tn = std::min(kTileN, n - n0);
      std::fill(acc.begin(), acc.begin() + tm * tn, 0.0f);
      for (int64_t kb = 0; kb < num_k_blocks; ++kb) {
        const int64_t k0 = kb * kBlock;
        const int64_t kw = std::min(kBlock, k - k0);
        // partial[tm, tn] = A[m0:, k0:k0+kw] . B[n0:, k0:k0+kw]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tm),
                    static_cast<int>(tn), static_cast<int>(kw), 1.0f, af.data() + m0 * k + k0,
                    static_cast<int>(k), bf.data() + n0 * k + k0, static_cast<int>(k), 0.0f,
                    partial.data(), static_cast<int>(tn));
        const float* sa_kb = sa.data() + kb * m + m0;
        const float* sb_kb = sb.data() + kb * n + n0;
        // acc += (sa * sb) * partial, rows split across the pool.
        parallel_for(
            tm,
            [&](int64_t row_begin, int64_t row_end) {
              for (int64_t i = row_begin; i < row_end; ++i) {
                const float sa_i = sa_kb[i];
                const float* p = partial.data() + i * tn;
                float* acc_row = acc.data() + i * tn;
                for (int64_t j = 0; j < tn; ++j) acc_row[j] += (sa_i * sb_kb[j]) * p[j];
              }
            },
            std::max<int64_t>(1, kScaleGrain / tn));
      }
      for (int64_t i = 0; i < tm; ++i) {
        float* y_row = y + (m0 + i) * n + n0;
        const float* acc_row = acc.data() + i * tn;
        for (int64_t j = 0; j < tn; ++j) y_row[j] = finish(acc_row[j], y_row[j], out, accumulate);
      }
    }
  }
}

// Few rows in A (token-by-token generation): no BLAS and no decoded copy of B. Each B row's K
// block is decoded into a 128-float buffer that stays in L1 and is dotted with every A row; the
// work is split over B's rows (output columns).
void gemm_small_m(const Fp8Matrix& a, const Fp8Matrix& b, float* y, OutDtype out, bool accumulate) {
  const int64_t m = a.rows;
  const int64_t n = b.rows;
  const int64_t k = a.cols;
  const std::vector<float> af = decode_codes(a.data);  // [m, k]
  const int64_t num_k_blocks = ceil_div(k, kBlock);
  const std::vector<float> sa = scales_by_k_block(a, num_k_blocks);  // [kb][m]
  const float* table = e4m3_decode_table();
  parallel_for(
      n,
      [&](int64_t j_begin, int64_t j_end) {
        float decoded[kBlock];
        float acc[kSmallM];
        for (int64_t j = j_begin; j < j_end; ++j) {
          std::fill(acc, acc + m, 0.0f);
          for (int64_t kb = 0; kb < num_k_blocks; ++kb) {
            const int64_t k0 = kb * kBlock;
            const int64_t kw = std::min(kBlock, k - k0);
            const uint8_t* qb = b.data.data() + j * k + k0;
            for (int64_t t = 0; t < kw; ++t) decoded[t] = table[qb[t]];
            const float sb = b.scale_at(j, k0);
            for (int64_t i = 0; i < m; ++i) {
              const float partial = dot(af.data() + i * k + k0, decoded, kw);
              acc[i] += (sa[kb * m + i] * sb) * partial;
            }
          }
          for (int64_t i = 0; i < m; ++i)
            y[i * n + j] = finish(acc[i], y[i * n + j], out, accumulate);
        }
      },
      std::max<int64_t>(1, kDecodeGrain / k));
}

}  // namespace

void use_single_threaded_blas() {
  // A read is cheap; the write happens once per process (or after something else changed it).
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

absl::Status gemm_fp8(const Fp8Matrix& a, const Fp8Matrix& b, float* y, OutDtype out,
                      bool accumulate) {
  use_single_threaded_blas();
  FP8RL_RETURN_IF_ERROR(check_operand(a, "a"));
  FP8RL_RETURN_IF_ERROR(check_operand(b, "b"));
  if (a.cols != b.cols) {
    return absl::InvalidArgumentError(absl::StrCat("gemm_fp8: K mismatch: a is [", a.rows, ", ",
                                                   a.cols, "] and b is [", b.rows, ", ", b.cols,
                                                   "]; Y = a . b^T needs equal column counts"));
  }
  const int64_t m = a.rows;
  const int64_t n = b.rows;
  const int64_t k = a.cols;
  if (m > kMaxBlasDim || n > kMaxBlasDim || k > kMaxBlasDim) {
    return absl::InvalidArgumentError(absl::StrCat("gemm_fp8: shape M=", m, " N=", n, " K=", k,
                                                   " exceeds the BLAS index limit ", kMaxBlasDim));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (y == nullptr) return absl::InvalidArgumentError("gemm_fp8: output y is null");
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) y[i] = finish(0.0f, y[i], out, accumulate);
    return absl::OkStatus();
  }

  if (m <= kSmallM) {
    gemm_small_m(a, b, y, out, accumulate);
  } else {
    gemm_tiled(a, b, y, out, accumulate);
  }
  return absl::OkStatus();
}

void gemm_f32(const float* a, const float* b, float* y, int64_t m, int64_t n, int64_t k,
              bool accumulate) {
  use_single_threaded_blas();
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) std::fill(y, y + m * n, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(k),
              accumulate ? 1.0f : 0.0f, y, static_cast<int>(n));
}

}  // namespace fp8rl::kernels
