// Quantization tests against a reference computed independently in the test: amax over each
// block in float64, scale_inv = amax / 448 as one fp32 division, codes = the nearest E4M3 value
// of the fp32 quotient (tests/unit/kernels/e4m3_reference.h).
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/tolerances.h"
#include "tests/unit/kernels/e4m3_reference.h"

namespace fp8rl::kernels {
namespace {

using testing::e4m3_reference_encode;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Random non-zero data whose magnitude changes by row and column band, so blocks differ in scale.
std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-6.0f, 6.0f);
  std::vector<float> row_mag(rows), col_mag(cols);
  for (auto& m : row_mag) m = std::exp2(log_mag(rng));
  for (auto& m : col_mag) m = std::exp2(log_mag(rng) / 2);
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng);
      if (v == 0.0f) v = 0.5f;
      x[r * cols + c] = v * row_mag[r] * col_mag[c];
    }
  }
  return x;
}

struct Block {
  int64_t r0, r1, c0, c1;
};

// The block holding (r, c) under a mode.
Block block_of(ScalingMode mode, int64_t rows, int64_t cols, int64_t r, int64_t c) {
  switch (mode) {
    case ScalingMode::kPerTensor:
      return {0, rows, 0, cols};
    case ScalingMode::kTile1x128:
      return {r, r + 1, c / 128 * 128, std::min(cols, c / 128 * 128 + 128)};
    case ScalingMode::kBlock128x128:
      break;
  }
  return {r / 128 * 128, std::min(rows, r / 128 * 128 + 128), c / 128 * 128,
          std::min(cols, c / 128 * 128 + 128)};
}

double reference_amax_uncached(const std::vector<float>& x, int64_t cols, const Block& b) {
  double amax = 0.0;
  for (int64_t r = b.r0; r < b.r1; ++r) {
    for (int64_t c = b.c0; c < b.c1; ++c) {
      const double a = std::fabs(static_cast<double>(x[r * cols + c]));
      if (std::isfinite(a)) amax = std::max(amax, a);
    }
  }
  return amax;
}

// Largest finite |x| of each block of one matrix, memoized so per-element checks stay linear.
class ReferenceAmax {
 public:
  ReferenceAmax(const std::vector<float>& x, int64_t cols) : x_(x), cols_(cols) {}
  double operator()(const Block& b) {
    const auto key = std::make_tuple(b.r0, b.r1, b.c0, b.c1);
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, reference_amax_uncached(x_, cols_, b)).first;
    return it->second;
  }

 private:
  const std::vector<float>& x_;
  int64_t cols_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, double> cache_;
};

// Checks every scale and every code of q against the reference.
void expect_matches_reference(const std::vector<float>& x, int64_t rows, int64_t cols,
                              ScalingMode mode, bool pow2, const Fp8Matrix& q) {
  ASSERT_EQ(q.rows, rows);
  ASSERT_EQ(q.cols, cols);
  ASSERT_EQ(q.mode, mode);
  ASSERT_EQ(static_cast<int64_t>(q.data.size()), rows * cols);
  const int64_t want_scale_rows = mode == ScalingMode::kPerTensor   ? 1
                                  : mode == ScalingMode::kTile1x128 ? rows
                                                                    : (rows + 127) / 128;
  const int64_t want_scale_cols = mode == ScalingMode::kPerTensor ? 1 : (cols + 127) / 128;
  ASSERT_EQ(static_cast<int64_t>(q.scale_inv.size()), want_scale_rows * want_scale_cols);
  ASSERT_TRUE(check_fp8_matrix(q).ok());
  ReferenceAmax reference_amax(x, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const Block b = block_of(mode, rows, cols, r, c);
      const double amax = reference_amax(b);
      const float scale = q.scale_at(r, c);
      if (amax == 0.0) {
        ASSERT_EQ(scale, 1.0f);
      } else if (pow2) {
        int e = 0;
        ASSERT_EQ(std::frexp(static_cast<double>(scale), &e), 0.5) << "not a power of two";
        ASSERT_GE(static_cast<double>(scale) * 448.0, amax);
        ASSERT_LT(static_cast<double>(scale) * 448.0, 2.0 * amax);
      } else {
        ASSERT_EQ(scale, static_cast<float>(amax) / 448.0f) << "at " << r << "," << c;
      }
      const float v = x[r * cols + c];
      const uint8_t want = e4m3_reference_encode(static_cast<double>(v / scale));
      ASSERT_EQ(q.data[r * cols + c], want) << "at " << r << "," << c << " x=" << v;
    }
  }
}

struct Shape {
  int64_t rows, cols;
};

class QuantizeShapes : public ::testing::TestWithParam<std::tuple<Shape, ScalingMode, bool>> {};

TEST_P(QuantizeShapes, MatchesFloat64ReferenceAndDequantizesWithinHalfAnUlp) {
  const auto [shape, mode, pow2] = GetParam();
  const std::vector<float> x = random_matrix(shape.rows, shape.cols, 42 + shape.rows);
  const Fp8Matrix q = quantize(x.data(), shape.rows, shape.cols, mode, {.pow2_scales = pow2});
  expect_matches_reference(x, shape.rows, shape.cols, mode, pow2, q);

  std::vector<float> back(x.size());
  dequantize(q, back.data());
  ReferenceAmax reference_amax(x, shape.cols);
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t c = 0; c < shape.cols; ++c) {
      const int64_t i = r * shape.cols + c;
      const float s = q.scale_at(r, c);
      ASSERT_EQ(back[i], e4m3_to_float(q.data[i]) * s);
      // E4M3 keeps 3 mantissa bits: relative error <= 2^-4 in the normal range, absolute error
      // <= 2^-10 * scale in the subnormal range (+ one fp32 rounding of the product).
      const double err = std::fabs(static_cast<double>(back[i]) - x[i]);
      const double bound = std::max(kE4M3RoundTripRelError * std::fabs(static_cast<double>(x[i])),
                                    kE4M3SubnormalAbsErrorPerScale * s);
      ASSERT_LE(err, bound * (1 + 1e-6)) << "at " << r << "," << c;
      const Block b = block_of(mode, shape.rows, shape.cols, r, c);
      ASSERT_LE(err, kE4M3RoundTripRelError * reference_amax(b));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EdgeBlocks, QuantizeShapes,
    ::testing::Combine(::testing::Values(Shape{1, 1}, Shape{1, 128}, Shape{3, 200}, Shape{127, 129},
                                         Shape{128, 128}, Shape{300, 257}),
                       ::testing::Values(ScalingMode::kPerTensor, ScalingMode::kTile1x128,
                                         ScalingMode::kBlock128x128),
                       ::testing::Bool()));

TEST(Quantize, LargeMatrixUsesTheThreadPoolAndStillMatchesTheReference) {
  const int64_t rows = 512, cols = 640;
  const std::vector<float> x = random_matrix(rows, cols, 9);
  for (ScalingMode mode : {ScalingMode::kTile1x128, ScalingMode::kBlock128x128}) {
    const Fp8Matrix q = quantize(x.data(), rows, cols, mode);
    expect_matches_reference(x, rows, cols, mode, false, q);
  }
}

TEST(Quantize, ZeroBlockGetsScaleOneAndZeroCodes) {
  const int64_t rows = 130, cols = 260;
  std::vector<float> x = random_matrix(rows, cols, 5);
  for (int64_t r = 0; r < 128; ++r) {
    for (int64_t c = 128; c < 256; ++c) x[r * cols + c] = 0.0f;  // block (0, 1) all zero
  }
  const Fp8Matrix q = quantize(x.data(), rows, cols, ScalingMode::kBlock128x128);
  EXPECT_EQ(q.scale_at(0, 128), 1.0f);
  EXPECT_EQ(q.data[5 * cols + 200], 0x00);
  EXPECT_NE(q.scale_at(0, 0), 1.0f);
  expect_matches_reference(x, rows, cols, ScalingMode::kBlock128x128, false, q);
}

TEST(Quantize, NonFiniteValuesDoNotSpoilTheirBlockScale) {
  std::vector<float> x = random_matrix(2, 256, 3);
  x[5] = kInf;
  x[6] = -kInf;
  x[7] = kNaN;
  const Fp8Matrix q = quantize(x.data(), 2, 256, ScalingMode::kTile1x128);
  double amax = 0.0;
  for (int c = 0; c < 128; ++c) {
    if (std::isfinite(x[c])) amax = std::max(amax, std::fabs(static_cast<double>(x[c])));
  }
  EXPECT_EQ(q.scale_inv[0], static_cast<float>(amax) / 448.0f);
  EXPECT_EQ(q.data[5], 0x7E);
  EXPECT_EQ(q.data[6], 0xFE);
  EXPECT_EQ(q.data[7], kE4M3NaN);
  expect_matches_reference(x, 2, 256, ScalingMode::kTile1x128, false, q);
  std::vector<float> back(x.size());
  dequantize(q, back.data());
  EXPECT_EQ(back[5], 448.0f * q.scale_inv[0]);
  EXPECT_TRUE(std::isnan(back[7]));
}

TEST(ComputeScaleInv, FormulaPow2AndEdgeCases) {
  EXPECT_EQ(compute_scale_inv(0.0f, false), 1.0f);
  EXPECT_EQ(compute_scale_inv(0.0f, true), 1.0f);
  EXPECT_EQ(compute_scale_inv(kNaN, false), 1.0f);
  EXPECT_EQ(compute_scale_inv(kInf, true), 1.0f);
  EXPECT_EQ(compute_scale_inv(3.7f, false), 3.7f / 448.0f);
  EXPECT_EQ(compute_scale_inv(448.0f, true), 1.0f);  // exactly 2^0
  EXPECT_EQ(compute_scale_inv(449.0f, true), 2.0f);
  EXPECT_EQ(compute_scale_inv(224.0f, true), 0.5f);
  EXPECT_EQ(compute_scale_inv(std::nextafter(224.0f, kInf), true), 1.0f);
  EXPECT_GT(compute_scale_inv(std::numeric_limits<float>::denorm_min(), false), 0.0f);
  EXPECT_GT(compute_scale_inv(std::numeric_limits<float>::denorm_min(), true), 0.0f);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> log_mag(-100.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(log_mag(rng));
    const float s = compute_scale_inv(amax, true);
    int e = 0;
    ASSERT_EQ(std::frexp(s, &e), 0.5f);
    ASSERT_GE(static_cast<double>(s) * 448.0, amax);
    ASSERT_LT(static_cast<double>(s) * 224.0, amax);
  }
}

TEST(TransposeBlocks, IsExactTransposeOfCodesAndScales) {
  const int64_t rows = 300, cols = 257;
  const std::vector<float> x = random_matrix(rows, cols, 77);
  const Fp8Matrix w = quantize(x.data(), rows, cols, ScalingMode::kBlock128x128);
  const Fp8Matrix t = transpose_blocks(w);
  ASSERT_EQ(t.rows, cols);
  ASSERT_EQ(t.cols, rows);
  ASSERT_TRUE(check_fp8_matrix(t).ok());
  std::vector<float> wd(x.size()), td(x.size());
  dequantize(w, wd.data());
  dequantize(t, td.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(t.data[c * rows + r], w.data[r * cols + c]);
      ASSERT_EQ(td[c * rows + r], wd[r * cols + c]);
    }
  }
  // Quantizing the transposed input gives the same result: block scaling is symmetric.
  std::vector<float> xt(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
  }
  const Fp8Matrix direct = quantize(xt.data(), cols, rows, ScalingMode::kBlock128x128);
  EXPECT_EQ(direct.data, t.data);
  EXPECT_EQ(direct.scale_inv, t.scale_inv);
}

TEST(TransposeBlocksDeathTest, RejectsTileScaling) {
  const std::vector<float> x = random_matrix(4, 8, 1);
  const Fp8Matrix q = quantize(x.data(), 4, 8, ScalingMode::kTile1x128);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(transpose_blocks(q), "128x128 block scaling");
}

TEST(KvCache, QuantizeDequantizeAndFakeWithAGivenScale) {
  const std::vector<float> x = random_matrix(64, 129, 21);
  const int64_t n = static_cast<int64_t>(x.size());
  const float scale = 0.0123f;
  std::vector<uint8_t> q(n);
  quantize_with_scale(x.data(), n, scale, q.data());
  std::vector<float> back(n), fake = x;
  dequantize_with_scale(q.data(), n, scale, back.data());
  fake_quantize_with_scale(fake.data(), n, scale);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(q[i], e4m3_reference_encode(static_cast<double>(x[i] / scale))) << i;
    ASSERT_EQ(back[i], e4m3_to_float(q[i]) * scale);
    ASSERT_EQ(fake[i], back[i]);
  }
}

TEST(KvCache, CheckKvScaleRejectsNonPositiveAndNonFinite) {
  EXPECT_TRUE(check_kv_scale(0.5f).ok());
  for (float bad : {0.0f, -1.0f, kNaN, kInf}) {
    const absl::Status s = check_kv_scale(bad, "layer 3 k_scale");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find("layer 3 k_scale"), std::string::npos) << s;
  }
  std::vector<float> x = {1.0f};
  std::vector<uint8_t> q(1);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(quantize_with_scale(x.data(), 1, 0.0f, q.data()), "positive and finite");
}

TEST(CheckFp8Matrix, NamesTheBrokenField) {
  const std::vector<float> x = random_matrix(130, 300, 8);
  Fp8Matrix q = quantize(x.data(), 130, 300, ScalingMode::kBlock128x128);
  ASSERT_TRUE(check_fp8_matrix(q).ok());
  Fp8Matrix bad = q;
  bad.data.pop_back();
  EXPECT_NE(std::string(check_fp8_matrix(bad).message()).find("data"), std::string::npos);
  bad = q;
  bad.scale_inv.push_back(1.0f);
  EXPECT_NE(std::string(check_fp8_matrix(bad).message()).find("scale_inv has 7"), std::string::npos)
      << check_fp8_matrix(bad);
  bad = q;
  bad.scale_inv[2] = -1.0f;
  EXPECT_NE(std::string(check_fp8_matrix(bad).message()).find("scale_inv[2]"), std::string::npos);
  bad = q;
  bad.mode = ScalingMode::kTile1x128;  // expects 130 x 3 scales
  EXPECT_FALSE(check_fp8_matrix(bad).ok());
}

}  // namespace
}  // namespace fp8rl::kernels
