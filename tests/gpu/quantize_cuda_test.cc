// CUDA quantization against the CPU reference, bit for bit: 1x128 tiles, 128x128 blocks,
// per-tensor, pow2 scales, partial edge tiles, special values, and the KV cache's given scale.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cuda/fp8_cuda.h"
#include "kernels/formats.h"
#include "kernels/quantize.h"
#include "tests/gpu/gpu_test_util.h"

namespace fp8rl::kernels::cuda {
namespace {

using testing::random_matrix;
using testing::to_device;
using testing::to_host;

class GpuQuantizeTest : public ::testing::Test {
 protected:
  void SetUp() override { FP8RL_REQUIRE_SM90(); }
};

void expect_bit_exact(const Fp8Matrix& gpu, const Fp8Matrix& cpu, const std::string& what) {
  ASSERT_EQ(gpu.data.size(), cpu.data.size()) << what;
  ASSERT_EQ(gpu.scale_inv.size(), cpu.scale_inv.size()) << what;
  for (size_t i = 0; i < cpu.scale_inv.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(gpu.scale_inv[i]), std::bit_cast<uint32_t>(cpu.scale_inv[i]))
        << what << ": scale " << i << " gpu " << gpu.scale_inv[i] << " cpu " << cpu.scale_inv[i];
  }
  for (size_t i = 0; i < cpu.data.size(); ++i) {
    ASSERT_EQ(gpu.data[i], cpu.data[i])
        << what << ": code " << i << " (row " << i / cpu.cols << ", col " << i % cpu.cols << ")";
  }
}

// Quantizes x on the GPU (optionally from a misaligned copy) and compares with the CPU.
void check_against_cpu(const std::vector<float>& x, int64_t rows, int64_t cols, ScalingMode mode,
                       bool pow2, bool misaligned = false) {
  const std::string what = std::string(scaling_mode_name(mode)) + " [" + std::to_string(rows) +
                           ", " + std::to_string(cols) + "]" + (pow2 ? " pow2" : "") +
                           (misaligned ? " misaligned" : "");
  std::vector<float> padded(x.size() + 1);
  std::memcpy(padded.data() + (misaligned ? 1 : 0), x.data(), sizeof(float) * x.size());
  DeviceBuffer dx = to_device(padded);
  const float* x_dev = dx.as<float>() + (misaligned ? 1 : 0);
  absl::StatusOr<Fp8DeviceMatrix> q = Fp8DeviceMatrix::allocate(rows, cols, mode);
  ASSERT_TRUE(q.ok()) << q.status();
  FP8RL_ASSERT_OK(quantize(x_dev, QuantOptions{pow2}, *q, nullptr));
  absl::StatusOr<Fp8Matrix> gpu = download(q->view(), nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const Fp8Matrix cpu = kernels::quantize(x.data(), rows, cols, mode, QuantOptions{pow2});
  expect_bit_exact(*gpu, cpu, what);

  // The raw device scale tensor: padding holds 1.
  std::vector<float> dev_scales(gemm_scale_count(mode, rows, cols));
  FP8RL_ASSERT_OK(
      copy_to_host(dev_scales.data(), q->scale_inv(), sizeof(float) * dev_scales.size(), nullptr));
  absl::StatusOr<std::vector<float>> expect = scales_to_gemm_layout(cpu);
  ASSERT_TRUE(expect.ok()) << expect.status();
  ASSERT_EQ(dev_scales, *expect) << what << ": device scale layout or padding differs";

  // Dequantization matches the CPU bit for bit too.
  absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::allocate(sizeof(float) * x.size());
  ASSERT_TRUE(dout.ok());
  FP8RL_ASSERT_OK(dequantize(q->view(), dout->as<float>(), nullptr));
  const std::vector<float> gpu_deq = to_host<float>(*dout, x.size());
  std::vector<float> cpu_deq(x.size());
  kernels::dequantize(cpu, cpu_deq.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(testing::same_float(gpu_deq[i], cpu_deq[i]))
        << what << ": dequantized " << i << " gpu " << gpu_deq[i] << " cpu " << cpu_deq[i];
  }
}

constexpr std::pair<int64_t, int64_t> kShapes[] = {{1, 1},     {3, 200},   {7, 129},    {128, 128},
                                                   {130, 257}, {256, 384}, {257, 1000}, {64, 4096}};

TEST_F(GpuQuantizeTest, Tile1x128MatchesCpuBitExact) {
  uint32_t seed = 1;
  for (auto [rows, cols] : kShapes) {
    const auto x = random_matrix(rows, cols, seed++);
    for (bool pow2 : {false, true}) check_against_cpu(x, rows, cols, ScalingMode::kTile1x128, pow2);
  }
}

TEST_F(GpuQuantizeTest, Block128x128MatchesCpuBitExact) {
  uint32_t seed = 100;
  for (auto [rows, cols] : kShapes) {
    const auto x = random_matrix(rows, cols, seed++);
    for (bool pow2 : {false, true}) {
      check_against_cpu(x, rows, cols, ScalingMode::kBlock128x128, pow2);
    }
  }
}

TEST_F(GpuQuantizeTest, PerTensorMatchesCpuBitExact) {
  uint32_t seed = 200;
  for (auto [rows, cols] : kShapes) {
    const auto x = random_matrix(rows, cols, seed++);
    for (bool pow2 : {false, true}) check_against_cpu(x, rows, cols, ScalingMode::kPerTensor, pow2);
  }
}

TEST_F(GpuQuantizeTest, MisalignedInputTakesTheScalarPathAndStillMatches) {
  const auto x = random_matrix(96, 512, 300);
  for (ScalingMode mode :
       {ScalingMode::kTile1x128, ScalingMode::kBlock128x128, ScalingMode::kPerTensor}) {
    check_against_cpu(x, 96, 512, mode, false, /*misaligned=*/true);
  }
}

TEST_F(GpuQuantizeTest, SpecialValuesMatchCpu) {
  // NaN, +-inf, huge, tiny, subnormal, ties and a tile of zeros: the amax ignores NaN/inf, the
  // encoder saturates, an all-zero tile gets scale 1, a tiny tile a tiny (or 2^-149) scale.
  const int64_t rows = 4, cols = 384;
  std::vector<float> x = random_matrix(rows, cols, 400);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  x[0] = nan;
  x[1] = -nan;
  x[2] = inf;
  x[3] = -inf;
  x[4] = 3.0e38f;
  x[5] = -0.0f;
  for (int64_t c = 128; c < 256; ++c) x[c] = 0.0f;                     // row 0, tile 1: zeros
  for (int64_t c = 256; c < 384; ++c) x[c] = 1e-42f * float(c - 255);  // row 0, tile 2: subnormal
  for (int64_t c = 0; c < cols; ++c) x[cols + c] = float(c % 17) * 0.0625f - 0.5f;  // ties
  for (ScalingMode mode :
       {ScalingMode::kTile1x128, ScalingMode::kBlock128x128, ScalingMode::kPerTensor}) {
    for (bool pow2 : {false, true}) check_against_cpu(x, rows, cols, mode, pow2);
  }
}

TEST_F(GpuQuantizeTest, KvCacheGivenScaleMatchesCpu) {
  const auto x = random_matrix(37, 333, 500);  // 12321 values, not a multiple of anything
  const int64_t n = static_cast<int64_t>(x.size());
  DeviceBuffer dx = to_device(x);
  absl::StatusOr<DeviceBuffer> dq = DeviceBuffer::allocate(x.size());
  absl::StatusOr<DeviceBuffer> dback = DeviceBuffer::allocate(sizeof(float) * x.size());
  ASSERT_TRUE(dq.ok() && dback.ok());
  for (float scale : {0.0123f, 1.0f, 3.7f}) {
    FP8RL_ASSERT_OK(quantize_with_scale(dx.as<float>(), n, scale, dq->as<uint8_t>(), nullptr));
    const std::vector<uint8_t> gpu = to_host<uint8_t>(*dq, x.size());
    std::vector<uint8_t> cpu(x.size());
    kernels::quantize_with_scale(x.data(), n, scale, cpu.data());
    ASSERT_EQ(gpu, cpu) << "scale " << scale;

    FP8RL_ASSERT_OK(
        dequantize_with_scale(dq->as<uint8_t>(), n, scale, dback->as<float>(), nullptr));
    const std::vector<float> back = to_host<float>(*dback, x.size());
    std::vector<float> cpu_back(x.size());
    kernels::dequantize_with_scale(cpu.data(), n, scale, cpu_back.data());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(testing::same_float(back[i], cpu_back[i]))
          << i << " gpu " << back[i] << " cpu " << cpu_back[i];
    }
  }
}

TEST_F(GpuQuantizeTest, TransposeBlocksMatchesCpu) {
  const int64_t rows = 300, cols = 520;
  const auto w = random_matrix(rows, cols, 600);
  DeviceBuffer dw = to_device(w);
  absl::StatusOr<Fp8DeviceMatrix> q =
      Fp8DeviceMatrix::allocate(rows, cols, ScalingMode::kBlock128x128);
  absl::StatusOr<Fp8DeviceMatrix> t =
      Fp8DeviceMatrix::allocate(cols, rows, ScalingMode::kBlock128x128);
  ASSERT_TRUE(q.ok() && t.ok());
  FP8RL_ASSERT_OK(quantize(dw.as<float>(), QuantOptions{}, *q, nullptr));
  FP8RL_ASSERT_OK(transpose_blocks(q->view(), *t, nullptr));
  absl::StatusOr<Fp8Matrix> gpu = download(t->view(), nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const Fp8Matrix cpu = kernels::transpose_blocks(
      kernels::quantize(w.data(), rows, cols, ScalingMode::kBlock128x128));
  expect_bit_exact(*gpu, cpu, "transpose_blocks");
}

TEST(GpuQuantizeArgsTest, BadArgumentsGiveErrorsNotCrashes) {
  // These fail in argument checking, before any device work, so they run everywhere.
  uint8_t* q = reinterpret_cast<uint8_t*>(0x1000);
  float* s = reinterpret_cast<float*>(0x2000);
  const float* x = reinterpret_cast<const float*>(0x3000);
  EXPECT_EQ(quantize(x, 0, 128, ScalingMode::kTile1x128, {}, q, s, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(quantize(nullptr, 4, 128, ScalingMode::kTile1x128, {}, q, s, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(quantize_with_scale(x, 16, 0.0f, q, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(quantize_with_scale(x, 16, std::numeric_limits<float>::infinity(), q, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dequantize_with_scale(q, -1, 1.0f, s, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fp8rl::kernels::cuda
