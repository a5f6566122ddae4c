// Block-scaled FP8 GEMM tests: accuracy against float64 GEMMs of the unquantized data
// (calc_diff < 1e-3, the DeepGEMM criterion), exactness against a float64 evaluation of the
// per-K-block formula on the codes, the three training GEMMs, output options and errors.
#include "kernels/gemm.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/calc_diff.h"
#include "kernels/formats.h"
#include "kernels/quantize.h"
#include "kernels/tolerances.h"

namespace fp8rl::kernels {
namespace {

constexpr double kMaxCalcDiff = kFp8GemmMaxCalcDiff;
// Rounding every operand to a 3-bit mantissa leaves calc_diff near 6e-4 for Gaussian data; a
// value well below that means the operands were not quantized at all.
constexpr double kMinFp8CalcDiff = 1e-4;
constexpr double kFormulaRelTol = kFp8GemmFormulaRelTol;

std::vector<float> random_data(int64_t n, uint32_t seed, float spread = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-spread, spread);
  std::vector<float> x(n);
  for (auto& v : x) {
    v = normal(rng) * std::exp2(log_mag(rng));
    if (v == 0.0f) v = 0.25f;
  }
  return x;
}

// y[m, n] = a[m, k] . b[n, k]^T in float64.
std::vector<double> gemm_f64(const std::vector<float>& a, const std::vector<float>& b, int64_t m,
                             int64_t n, int64_t k) {
  std::vector<double> y(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[i * k + p]) * b[j * k + p];
      y[i * n + j] = s;
    }
  }
  return y;
}

std::vector<float> transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  }
  return t;
}

struct Shape {
  int64_t m, n, k;
};

class GemmShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(GemmShapes, MatchesFloat64GemmOfUnquantizedData) {
  const auto [m, n, k] = GetParam();
  const std::vector<float> x = random_data(m * k, 1 + m);
  const std::vector<float> w = random_data(n * k, 2 + n);
  const Fp8Matrix qx = quantize(x.data(), m, k, ScalingMode::kTile1x128);
  const Fp8Matrix qw = quantize(w.data(), n, k, ScalingMode::kBlock128x128);
  std::vector<float> y(m * n, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(gemm_fp8(qx, qw, y.data()).ok());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double diff = calc_diff(y, gemm_f64(x, w, m, n, k));
  std::printf("gemm_fp8 %ldx%ldx%ld: calc_diff %.3g, %.2f GFLOP/s\n", static_cast<long>(m),
              static_cast<long>(n), static_cast<long>(k), diff, 2.0 * m * n * k / secs / 1e9);
  EXPECT_LT(diff, kMaxCalcDiff);
  // E4M3 rounds Gaussian data: with more than one value per tile the result must differ from the
  // exact one, or the GEMM did not run on the quantized operands.
  if (k > 1) {
    EXPECT_GT(diff, kMinFp8CalcDiff);
  }

  // bf16 output is the fp32 output rounded.
  std::vector<float> yb(m * n, 0.0f);
  ASSERT_TRUE(gemm_fp8(qx, qw, yb.data(), OutDtype::kBF16).ok());
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(yb[i], round_bf16(y[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmShapes,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 300, 1000}, Shape{16, 257, 300},
                                           Shape{17, 129, 130}, Shape{33, 70, 200},
                                           Shape{256, 384, 512}, Shape{130, 257, 1000},
                                           Shape{300, 520, 384}));

// Y[m,n] = sum_kb sa(m,kb) * sb(n,kb) * sum_{k in kb} qa[m,k] * qb[n,k], in float64, and
// sum_kb |sa * sb| * sum |qa * qb| for the tolerance.
void formula_f64(const Fp8Matrix& a, const Fp8Matrix& b, std::vector<double>* y,
                 std::vector<double>* mag) {
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  y->assign(m * n, 0.0);
  mag->assign(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k0 = 0; k0 < k; k0 += 128) {
        double dot = 0.0, abs_dot = 0.0;
        for (int64_t p = k0; p < std::min(k, k0 + 128); ++p) {
          const double t = static_cast<double>(e4m3_to_float(a.data[i * k + p])) *
                           e4m3_to_float(b.data[j * k + p]);
          dot += t;
          abs_dot += std::fabs(t);
        }
        const double s = static_cast<double>(a.scale_at(i, k0)) * b.scale_at(j, k0);
        (*y)[i * n + j] += s * dot;
        (*mag)[i * n + j] += s * abs_dot;
      }
    }
  }
}

class GemmFormula : public ::testing::TestWithParam<int64_t> {};

// m <= 16 takes the small-M path (no BLAS), larger m the tiled sgemm path.
TEST_P(GemmFormula, FollowsThePerKBlockFormulaOnTheCodesForEveryScalingPair) {
  const int64_t m = GetParam(), n = 150, k = 333;
  const std::vector<float> a = random_data(m * k, 5, 6.0f);
  const std::vector<float> b = random_data(n * k, 6, 6.0f);
  for (ScalingMode ma : {ScalingMode::kTile1x128, ScalingMode::kBlock128x128}) {
    for (ScalingMode mb : {ScalingMode::kTile1x128, ScalingMode::kBlock128x128}) {
      const Fp8Matrix qa = quantize(a.data(), m, k, ma);
      const Fp8Matrix qb = quantize(b.data(), n, k, mb, {.pow2_scales = true});
      std::vector<float> y(m * n);
      ASSERT_TRUE(gemm_fp8(qa, qb, y.data()).ok());
      std::vector<double> want, mag;
      formula_f64(qa, qb, &want, &mag);
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_NEAR(y[i], want[i], kFormulaRelTol * mag[i] + 1e-30)
            << scaling_mode_name(ma) << " x " << scaling_mode_name(mb) << " at " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SmallAndTiled, GemmFormula, ::testing::Values(1, 5, 16, 70, 300));

TEST(GemmFp8, TheThreeTrainingGemms) {
  const int64_t m = 160, n = 200, k = 300;  // tokens, out features, in features
  const std::vector<float> x = random_data(m * k, 11);
  const std::vector<float> w = random_data(n * k, 12);
  const std::vector<float> dy = random_data(m * n, 13);
  const Fp8Matrix qw = quantize(w.data(), n, k, ScalingMode::kBlock128x128);

  // fprop Y[m,n] = X . W^T
  std::vector<float> y(m * n);
  ASSERT_TRUE(gemm_fp8(quantize(x.data(), m, k, ScalingMode::kTile1x128), qw, y.data()).ok());
  EXPECT_LT(calc_diff(y, gemm_f64(x, w, m, n, k)), kMaxCalcDiff);

  // dgrad dX[m,k] = dY . W = dY . (W^T)^T, with W^T from transpose_blocks (no requantization).
  std::vector<float> dx(m * k);
  ASSERT_TRUE(
      gemm_fp8(quantize(dy.data(), m, n, ScalingMode::kTile1x128), transpose_blocks(qw), dx.data())
          .ok());
  EXPECT_LT(calc_diff(dx, gemm_f64(dy, transpose(w, n, k), m, k, n)), kMaxCalcDiff);

  // wgrad dW[n,k] = dY^T . X: both operands 1x128 along m, the reduced dimension.
  const std::vector<float> dyt = transpose(dy, m, n);  // [n, m]
  const std::vector<float> xt = transpose(x, m, k);    // [k, m]
  std::vector<float> dw(n * k);
  ASSERT_TRUE(gemm_fp8(quantize(dyt.data(), n, m, ScalingMode::kTile1x128),
                       quantize(xt.data(), k, m, ScalingMode::kTile1x128), dw.data())
                  .ok());
  EXPECT_LT(calc_diff(dw, gemm_f64(dyt, xt, n, k, m)), kMaxCalcDiff);
}

// OpenBLAS's value for an output element can depend on how many of its threads split the matrix;
// a GEMM must give the same bits whatever a caller (or an earlier library call) set, so every GEMM
// sets OpenBLAS back to one thread first (use_single_threaded_blas).
TEST(GemmFp8, RunsOnOneBlasThreadWhateverWasSetBefore) {
  const int64_t m = 768, n = 384, k = 384;
  const std::vector<float> x = random_data(m * k, 41), w = random_data(n * k, 42);
  const Fp8Matrix qx = quantize(x.data(), m, k, ScalingMode::kTile1x128);
  const Fp8Matrix qw = quantize(w.data(), n, k, ScalingMode::kBlock128x128);
  std::vector<float> one(m * n), again(m * n), f32_one(m * n), f32_again(m * n);
  openblas_set_num_threads(1);
  ASSERT_TRUE(gemm_fp8(qx, qw, one.data()).ok());
  gemm_f32(x.data(), w.data(), f32_one.data(), m, n, k);
  openblas_set_num_threads(2);
  ASSERT_TRUE(gemm_fp8(qx, qw, again.data()).ok());
  EXPECT_EQ(openblas_get_num_threads(), 1);
  openblas_set_num_threads(2);
  gemm_f32(x.data(), w.data(), f32_again.data(), m, n, k);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  EXPECT_EQ(0, std::memcmp(one.data(), again.data(), one.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(f32_one.data(), f32_again.data(), f32_one.size() * sizeof(float)));
  double norm = 0;
  for (float v : one) norm += std::fabs(v);
  EXPECT_GT(norm, 0.0);
}

TEST(GemmFp8, AccumulateAddsIntoY) {
  const int64_t m = 40, n = 130, k = 260;
  const std::vector<float> a = random_data(m * k, 21);
  const std::vector<float> b = random_data(n * k, 22);
  const Fp8Matrix qa = quantize(a.data(), m, k, ScalingMode::kTile1x128);
  const Fp8Matrix qb = quantize(b.data(), n, k, ScalingMode::kBlock128x128);
  std::vector<float> fresh(m * n);
  ASSERT_TRUE(gemm_fp8(qa, qb, fresh.data()).ok());
  const std::vector<float> y0 = random_data(m * n, 23);
  std::vector<float> y = y0;
  // (m = 40 takes the tiled path; the small-M path is checked below with m = 3.)
  ASSERT_TRUE(gemm_fp8(qa, qb, y.data(), OutDtype::kF32, /*accumulate=*/true).ok());
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(y[i], y0[i] + fresh[i]);
  y = y0;
  ASSERT_TRUE(gemm_fp8(qa, qb, y.data(), OutDtype::kBF16, /*accumulate=*/true).ok());
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(y[i], round_bf16(y0[i] + fresh[i]));

  const Fp8Matrix qa3 = quantize(a.data(), 3, k, ScalingMode::kTile1x128);
  std::vector<float> fresh3(3 * n), y3(y0.begin(), y0.begin() + 3 * n);
  ASSERT_TRUE(gemm_fp8(qa3, qb, fresh3.data()).ok());
  ASSERT_TRUE(gemm_fp8(qa3, qb, y3.data(), OutDtype::kBF16, /*accumulate=*/true).ok());
  for (int64_t i = 0; i < 3 * n; ++i) {
    ASSERT_NEAR(fresh3[i], fresh[i], 1e-5 * (1.0 + std::fabs(fresh[i])));  // other sum order
    ASSERT_EQ(y3[i], round_bf16(y0[i] + fresh3[i]));
  }
}

TEST(GemmFp8, RejectsBadOperandsWithAClearError) {
  const std::vector<float> a = random_data(8 * 256, 31);
  const std::vector<float> b = random_data(16 * 256, 32);
  const Fp8Matrix qa = quantize(a.data(), 8, 256, ScalingMode::kTile1x128);
  const Fp8Matrix qb = quantize(b.data(), 16, 256, ScalingMode::kBlock128x128);
  std::vector<float> y(8 * 16, 7.0f);
  auto expect_error = [&](const Fp8Matrix& x, const Fp8Matrix& w, const std::string& needle) {
    const absl::Status s = gemm_fp8(x, w, y.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find(needle), std::string::npos) << s;
  };
  expect_error(qa, quantize(b.data(), 32, 128, ScalingMode::kBlock128x128), "K mismatch");
  expect_error(quantize(a.data(), 8, 256, ScalingMode::kPerTensor), qb,
               "operand a uses per_tensor");
  Fp8Matrix bad = qb;
  bad.scale_inv.pop_back();
  expect_error(qa, bad, "operand b: fp8 matrix: scale_inv has 1");
  bad = qa;
  bad.data.resize(10);
  expect_error(bad, qb, "operand a: fp8 matrix: data has 10");
  for (float v : y) ASSERT_EQ(v, 7.0f);  // nothing written on error
  EXPECT_FALSE(gemm_fp8(qa, qb, nullptr).ok());
}

TEST(GemmF32, MatchesFloat64AndAccumulates) {
  const int64_t m = 37, n = 91, k = 150;
  const std::vector<float> a = random_data(m * k, 41);
  const std::vector<float> b = random_data(n * k, 42);
  std::vector<float> y(m * n);
  gemm_f32(a.data(), b.data(), y.data(), m, n, k);
  const std::vector<double> want = gemm_f64(a, b, m, n, k);
  EXPECT_LT(calc_diff(y, want), 1e-10);
  std::vector<float> y2 = y;
  gemm_f32(a.data(), b.data(), y2.data(), m, n, k, /*accumulate=*/true);
  for (int64_t i = 0; i < m * n; ++i)
    ASSERT_NEAR(y2[i], 2.0 * want[i], 1e-4 * (1 + std::fabs(want[i])));
}

}  // namespace
}  // namespace fp8rl::kernels
