// Host-only checks of the CUDA module's API: the documented device scale layouts, the FP8 GEMM
// argument rules, and a clean "no sm_90 device" answer. These run on every machine.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "kernels/cuda/fp8_cuda.h"
#include "kernels/quantize.h"
#include "tests/gpu/gpu_test_util.h"

namespace fp8rl::kernels::cuda {
namespace {

using testing::random_matrix;

TEST(GpuLayoutTest, Tile1x128IsMMajorWithRowsPaddedToFour) {
  // [6, 300]: 3 K tiles, ld = 8.
  EXPECT_EQ(gemm_scale_ld(ScalingMode::kTile1x128, 6, 300), 8);
  EXPECT_EQ(gemm_scale_count(ScalingMode::kTile1x128, 6, 300), 24);
  EXPECT_EQ(gemm_scale_index(ScalingMode::kTile1x128, 6, 300, 5, 0), 5);
  EXPECT_EQ(gemm_scale_index(ScalingMode::kTile1x128, 6, 300, 5, 127), 5);
  EXPECT_EQ(gemm_scale_index(ScalingMode::kTile1x128, 6, 300, 2, 128), 8 + 2);
  EXPECT_EQ(gemm_scale_index(ScalingMode::kTile1x128, 6, 300, 0, 299), 16);
  // A multiple of 4 needs no padding.
  EXPECT_EQ(gemm_scale_ld(ScalingMode::kTile1x128, 8, 128), 8);
}

TEST(GpuLayoutTest, Block128x128IsRowMajorWithBlockColsPaddedToFour) {
  // [300, 700]: 3 x 6 blocks, ld = 8.
  EXPECT_EQ(gemm_scale_ld(ScalingMode::kBlock128x128, 300, 700), 8);
  EXPECT_EQ(gemm_scale_count(ScalingMode::kBlock128x128, 300, 700), 24);
  EXPECT_EQ(gemm_scale_index(ScalingMode::kBlock128x128, 300, 700, 0, 0), 0);
  EXPECT_EQ(gemm_scale_index(ScalingMode::kBlock128x128, 300, 700, 129, 699), 8 + 5);
  EXPECT_EQ(gemm_scale_index(ScalingMode::kBlock128x128, 300, 700, 299, 128), 16 + 1);
  EXPECT_EQ(gemm_scale_count(ScalingMode::kPerTensor, 300, 700), 1);
}

TEST(GpuLayoutTest, ScalesRoundTripBetweenCpuAndGemmLayouts) {
  for (ScalingMode mode :
       {ScalingMode::kTile1x128, ScalingMode::kBlock128x128, ScalingMode::kPerTensor}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7, 129}, {130, 257}, {256, 384}}) {
      const std::vector<float> x = random_matrix(rows, cols, 11);
      const Fp8Matrix q = quantize(x.data(), rows, cols, mode);
      absl::StatusOr<std::vector<float>> gemm = scales_to_gemm_layout(q);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      ASSERT_EQ(static_cast<int64_t>(gemm->size()), gemm_scale_count(mode, rows, cols));
      // Every element's scale sits where gemm_scale_index says.
      for (int64_t r = 0; r < rows; r += 3) {
        for (int64_t c = 0; c < cols; c += 17) {
          ASSERT_EQ((*gemm)[gemm_scale_index(mode, rows, cols, r, c)], q.scale_at(r, c))
              << scaling_mode_name(mode) << " r=" << r << " c=" << c;
        }
      }
      // Padding entries are exactly the ones no element maps to, and hold 1.
      std::set<int64_t> used;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; c += kBlock)
          used.insert(gemm_scale_index(mode, rows, cols, r, c));
      }
      for (int64_t i = 0; i < static_cast<int64_t>(gemm->size()); ++i) {
        if (!used.count(i)) {
          EXPECT_EQ((*gemm)[i], 1.0f) << "padding " << i;
        }
      }
      absl::StatusOr<std::vector<float>> back = scales_from_gemm_layout(mode, rows, cols, *gemm);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, q.scale_inv);
    }
  }
}

TEST(GpuLayoutTest, LayoutConversionsRejectWrongSizes) {
  Fp8Matrix m;
  m.rows = 4;
  m.cols = 256;
  m.mode = ScalingMode::kTile1x128;
  m.data.assign(4 * 256, 0x38);
  m.scale_inv.assign(3, 1.0f);  // needs 8
  absl::StatusOr<std::vector<float>> g = scales_to_gemm_layout(m);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("needs 8"), std::string::npos) << g.status();
  absl::StatusOr<std::vector<float>> c =
      scales_from_gemm_layout(ScalingMode::kBlock128x128, 300, 700, std::vector<float>(18, 1.0f));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

// Fake, suitably aligned device addresses: the argument checks never dereference them.
Fp8DeviceView fake_view(int64_t rows, int64_t cols, ScalingMode mode, uintptr_t base) {
  return {rows, cols, mode, reinterpret_cast<const uint8_t*>(base),
          reinterpret_cast<const float*>(base + 0x100000)};
}

TEST(GpuGemmArgsTest, AcceptsTheThreeTrainingShapes) {
  const void* y = reinterpret_cast<const void*>(0x900000);
  // fprop / dgrad: 1x128 x 128x128; wgrad: 1x128 x 1x128; and the mirror.
  EXPECT_TRUE(check_gemm_fp8_args(fake_view(256, 512, ScalingMode::kTile1x128, 0x10000),
                                  fake_view(384, 512, ScalingMode::kBlock128x128, 0x20000), y)
                  .ok());
  EXPECT_TRUE(check_gemm_fp8_args(fake_view(200, 272, ScalingMode::kTile1x128, 0x10000),
                                  fake_view(136, 272, ScalingMode::kTile1x128, 0x20000), y)
                  .ok());
  EXPECT_TRUE(check_gemm_fp8_args(fake_view(130, 64, ScalingMode::kBlock128x128, 0x10000),
                                  fake_view(136, 64, ScalingMode::kTile1x128, 0x20000), y)
                  .ok());
}

TEST(GpuGemmArgsTest, RejectsBadShapesWithTheFieldNamed) {
  const void* y = reinterpret_cast<const void*>(0x900000);
  struct Case {
    Fp8DeviceView a, b;
    const void* y;
    absl::StatusCode code;
    const char* needle;
  };
  const Case cases[] = {
      {fake_view(256, 120, ScalingMode::kTile1x128, 0x10000),
       fake_view(256, 120, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kInvalidArgument, "multiple of 16"},
      {fake_view(256, 128, ScalingMode::kTile1x128, 0x10000),
       fake_view(252, 128, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kInvalidArgument, "N = b.rows = 252"},
      {fake_view(255, 128, ScalingMode::kTile1x128, 0x10000),
       fake_view(256, 128, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kInvalidArgument, "M = a.rows = 255"},
      {fake_view(256, 128, ScalingMode::kTile1x128, 0x10000),
       fake_view(256, 256, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kInvalidArgument, "K mismatch"},
      {fake_view(256, 128, ScalingMode::kBlock128x128, 0x10000),
       fake_view(256, 128, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kUnimplemented, "both 128x128"},
      {fake_view(256, 128, ScalingMode::kPerTensor, 0x10000),
       fake_view(256, 128, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kUnimplemented, "per-tensor"},
      {fake_view(0, 128, ScalingMode::kTile1x128, 0x10000),
       fake_view(256, 128, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kInvalidArgument, "a.rows (M)"},
      {fake_view(256, 128, ScalingMode::kTile1x128, 0x10000),
       fake_view(256, 128, ScalingMode::kBlock128x128, 0x20000),
       reinterpret_cast<const void*>(0x900004), absl::StatusCode::kInvalidArgument,
       "y must be 16-byte aligned"},
      {fake_view(256, 128, ScalingMode::kTile1x128, 0x10008),
       fake_view(256, 128, ScalingMode::kBlock128x128, 0x20000), y,
       absl::StatusCode::kInvalidArgument, "a.data must be 16-byte aligned"},
      {fake_view(256, 128, ScalingMode::kTile1x128, 0x10000),
       fake_view(256, 128, ScalingMode::kBlock128x128, 0x20000), nullptr,
       absl::StatusCode::kInvalidArgument, "y is null"},
  };
  for (const Case& c : cases) {
    const absl::Status st = check_gemm_fp8_args(c.a, c.b, c.y);
    EXPECT_EQ(st.code(), c.code) << st;
    EXPECT_NE(st.message().find(c.needle), std::string::npos)
        << "message '" << st.message() << "' lacks '" << c.needle << "'";
  }
}

TEST(GpuDeviceTest, RequireSm90AnswersWithoutCrashing) {
  absl::StatusOr<DeviceInfo> dev = require_sm90();
  if (dev.ok()) {
    EXPECT_EQ(dev->major, 9);
    EXPECT_GT(dev->sm_count, 0);
  } else {
    EXPECT_EQ(dev.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(dev.status().message().empty());
  }
}

}  // namespace
}  // namespace fp8rl::kernels::cuda
