// CUDA block-scaled FP8 GEMM (cuBLASLt) against the CPU gemm_fp8 and a float64 reference for the
// three training GEMMs (fprop, dgrad, wgrad) on several shapes, bf16 and fp32 outputs,
// accumulation, and the BF16 baseline GEMM; bad shapes must give errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/cuda/fp8_cuda.h"
#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "kernels/quantize.h"
#include "tests/gpu/gpu_test_util.h"

namespace fp8rl::kernels::cuda {
namespace {

using testing::calc_diff;
using testing::gemm_f64;
using testing::random_matrix;
using testing::to_device;
using testing::to_f64;
using testing::to_host;
using testing::transpose;

// FP8 block GEMM vs the exact product of the unquantized inputs (DeepGEMM's bar).
constexpr double kFp8VsF64 = 1e-3;
// GPU vs CPU on the same quantized operands: only summation order and the tensor cores'
// in-block accumulation differ.
constexpr double kGpuVsCpu = 1e-5;

class GpuGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FP8RL_REQUIRE_SM90();
    absl::StatusOr<std::unique_ptr<CublasLtGemm>> g = CublasLtGemm::create();
    ASSERT_TRUE(g.ok()) << g.status();
    gemm_ = *std::move(g);
  }

  // Quantizes host x [rows, cols] on the GPU.
  Fp8DeviceMatrix quantize_on_gpu(const std::vector<float>& x, int64_t rows, int64_t cols,
                                  ScalingMode mode) {
    DeviceBuffer dx = to_device(x);
    absl::StatusOr<Fp8DeviceMatrix> q = Fp8DeviceMatrix::allocate(rows, cols, mode);
    EXPECT_TRUE(q.ok()) << q.status();
    const absl::Status st = quantize(dx.as<float>(), QuantOptions{}, *q, nullptr);
    EXPECT_TRUE(st.ok()) << st;
    return *std::move(q);
  }

  // Runs y = a . b^T on the GPU (fp32 or bf16 out, optional accumulate onto y0) and checks it
  // against the CPU gemm_fp8 on the same quantized operands and against `exact` (float64).
  void run_and_check(const Fp8DeviceMatrix& a, const Fp8DeviceMatrix& b,
                     const std::vector<double>& exact, OutDtype out, const std::string& what,
                     const std::vector<float>* y0 = nullptr) {
    const int64_t m = a.rows(), n = b.rows();
    const size_t count = static_cast<size_t>(m * n);
    absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::allocate(sizeof(float) * count);
    ASSERT_TRUE(dy.ok());
    if (y0 != nullptr) {
      if (out == OutDtype::kF32) {
        FP8RL_ASSERT_OK(copy_to_device(dy->data(), y0->data(), sizeof(float) * count, nullptr));
      } else {
        std::vector<uint16_t> bits(count);
        for (size_t i = 0; i < count; ++i) bits[i] = float_to_bf16((*y0)[i]);
        FP8RL_ASSERT_OK(copy_to_device(dy->data(), bits.data(), 2 * count, nullptr));
      }
    }
    FP8RL_ASSERT_OK(gemm_->gemm_fp8(a.view(), b.view(), dy->data(), out, y0 != nullptr, nullptr));
    FP8RL_ASSERT_OK(synchronize(nullptr));
    std::vector<float> gpu(count);
    if (out == OutDtype::kF32) {
      gpu = to_host<float>(*dy, count);
    } else {
      const std::vector<uint16_t> bits = to_host<uint16_t>(*dy, count);
      for (size_t i = 0; i < count; ++i) gpu[i] = bf16_to_float(bits[i]);
    }

    absl::StatusOr<Fp8Matrix> ha = download(a.view(), nullptr);
    absl::StatusOr<Fp8Matrix> hb = download(b.view(), nullptr);
    ASSERT_TRUE(ha.ok() && hb.ok());
    std::vector<float> cpu = y0 != nullptr ? *y0 : std::vector<float>(count, 0.0f);
    if (y0 != nullptr && out == OutDtype::kBF16) {
      for (float& v : cpu) v = round_bf16(v);  // the GPU accumulates onto the bf16 y
    }
    FP8RL_ASSERT_OK(kernels::gemm_fp8(*ha, *hb, cpu.data(), out, y0 != nullptr));

    std::vector<double> want = exact;
    if (y0 != nullptr) {
      for (size_t i = 0; i < count; ++i) want[i] += (*y0)[i];
    }
    const double d_exact = calc_diff(to_f64(gpu), want);
    const double d_cpu = calc_diff(to_f64(gpu), to_f64(cpu));
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < count; ++i) {
      max_err = std::max(max_err, std::fabs(double(gpu[i]) - double(cpu[i])));
      max_ref = std::max(max_ref, std::fabs(double(cpu[i])));
    }
    const double rel_tol = out == OutDtype::kBF16 ? 1.6e-2 : 1e-3;
    std::printf(
        "[ gemm    ] %-44s calc_diff vs f64 %.2e, vs cpu %.2e, max|gpu-cpu|/max|cpu| %.2e\n",
        what.c_str(), d_exact, d_cpu, max_err / max_ref);
    EXPECT_LT(d_exact, kFp8VsF64) << what;
    EXPECT_LT(d_cpu, kGpuVsCpu) << what;
    EXPECT_LT(max_err, rel_tol * max_ref) << what;
  }

  std::unique_ptr<CublasLtGemm> gemm_;
};

struct Shape {
  int64_t m, n, k;
};
// Multiples of 128, and shapes with partial 128-blocks in every dimension the rules allow.
constexpr Shape kShapes[] = {{128, 128, 128}, {256, 384, 512}, {200, 136, 272}, {64, 1024, 1040}};

TEST_F(GpuGemmTest, FpropMatchesCpuAndFloat64) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    const auto x = random_matrix(s.m, s.k, seed++);
    const auto w = random_matrix(s.n, s.k, seed++);
    const auto exact = gemm_f64(x, w, s.m, s.n, s.k);
    const Fp8DeviceMatrix qx = quantize_on_gpu(x, s.m, s.k, ScalingMode::kTile1x128);
    const Fp8DeviceMatrix qw = quantize_on_gpu(w, s.n, s.k, ScalingMode::kBlock128x128);
    const std::string name = "fprop M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) +
                             " K=" + std::to_string(s.k);
    run_and_check(qx, qw, exact, OutDtype::kF32, name + " f32");
    run_and_check(qx, qw, exact, OutDtype::kBF16, name + " bf16");
  }
  EXPECT_EQ(gemm_->cached_plans(), 2 * std::size(kShapes));
}

TEST_F(GpuGemmTest, DgradThroughTransposedWeightBlocks) {
  // dX[M, K] = dY[M, N] . W[N, K]: A = dY (1x128 along N), B = W^T [K, N] (128x128 blocks).
  uint32_t seed = 50;
  for (const Shape& s : kShapes) {
    if (s.n % 16 != 0 || s.k % 8 != 0) continue;  // K = s.n, N = s.k here
    const auto dy = random_matrix(s.m, s.n, seed++);
    const auto w = random_matrix(s.n, s.k, seed++);
    const auto exact = gemm_f64(dy, transpose(w, s.n, s.k), s.m, s.k, s.n);
    const Fp8DeviceMatrix qdy = quantize_on_gpu(dy, s.m, s.n, ScalingMode::kTile1x128);
    const Fp8DeviceMatrix qw = quantize_on_gpu(w, s.n, s.k, ScalingMode::kBlock128x128);
    absl::StatusOr<Fp8DeviceMatrix> qwt =
        Fp8DeviceMatrix::allocate(s.k, s.n, ScalingMode::kBlock128x128);
    ASSERT_TRUE(qwt.ok());
    FP8RL_ASSERT_OK(transpose_blocks(qw.view(), *qwt, nullptr));
    run_and_check(qdy, *qwt, exact, OutDtype::kF32,
                  "dgrad M=" + std::to_string(s.m) + " N=" + std::to_string(s.k) +
                      " K=" + std::to_string(s.n));
  }
}

TEST_F(GpuGemmTest, WgradBothOperandsTiledAlongTokens) {
  // dW[N, K] = dY^T[N, T] . X[T, K]: A = dY^T (1x128 along tokens), B = X^T [K, T] (1x128).
  uint32_t seed = 80;
  for (const Shape& s : kShapes) {
    const int64_t tokens = s.k, n_out = s.m, k_in = s.n;
    const auto dy = random_matrix(tokens, n_out, seed++);
    const auto x = random_matrix(tokens, k_in, seed++);
    const auto dyt = transpose(dy, tokens, n_out);
    const auto xt = transpose(x, tokens, k_in);
    const auto exact = gemm_f64(dyt, xt, n_out, k_in, tokens);
    const Fp8DeviceMatrix qa = quantize_on_gpu(dyt, n_out, tokens, ScalingMode::kTile1x128);
    const Fp8DeviceMatrix qb = quantize_on_gpu(xt, k_in, tokens, ScalingMode::kTile1x128);
    run_and_check(qa, qb, exact, OutDtype::kF32,
                  "wgrad M=" + std::to_string(n_out) + " N=" + std::to_string(k_in) +
                      " K=" + std::to_string(tokens));
  }
}

TEST_F(GpuGemmTest, BlockTimesTileMirror) {
  // Y^T[N, M] = W[N, K] . X[M, K]^T with A 128x128-scaled and B 1x128-scaled.
  const Shape s{256, 384, 512};
  const auto x = random_matrix(s.m, s.k, 7);
  const auto w = random_matrix(s.n, s.k, 8);
  const auto exact = gemm_f64(w, x, s.n, s.m, s.k);
  const Fp8DeviceMatrix qw = quantize_on_gpu(w, s.n, s.k, ScalingMode::kBlock128x128);
  const Fp8DeviceMatrix qx = quantize_on_gpu(x, s.m, s.k, ScalingMode::kTile1x128);
  run_and_check(qw, qx, exact, OutDtype::kF32, "mirror 128x128 x 1x128");
}

TEST_F(GpuGemmTest, AccumulateAddsIntoY) {
  const Shape s{200, 136, 272};
  const auto x = random_matrix(s.m, s.k, 9);
  const auto w = random_matrix(s.n, s.k, 10);
  const auto y0 = random_matrix(s.m, s.n, 11);
  const auto exact = gemm_f64(x, w, s.m, s.n, s.k);
  const Fp8DeviceMatrix qx = quantize_on_gpu(x, s.m, s.k, ScalingMode::kTile1x128);
  const Fp8DeviceMatrix qw = quantize_on_gpu(w, s.n, s.k, ScalingMode::kBlock128x128);
  run_and_check(qx, qw, exact, OutDtype::kF32, "fprop accumulate f32", &y0);
  run_and_check(qx, qw, exact, OutDtype::kBF16, "fprop accumulate bf16", &y0);
}

TEST_F(GpuGemmTest, Bf16GemmMatchesFloat64) {
  for (const Shape& s : kShapes) {
    auto a = random_matrix(s.m, s.k, 20);
    auto b = random_matrix(s.n, s.k, 21);
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_float(a16[i] = float_to_bf16(a[i]));
    for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_to_float(b16[i] = float_to_bf16(b[i]));
    const auto exact = gemm_f64(a, b, s.m, s.n, s.k);  // of the bf16-rounded inputs
    DeviceBuffer da = to_device(a16), db = to_device(b16);
    absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::allocate(sizeof(float) * s.m * s.n);
    ASSERT_TRUE(dy.ok());
    FP8RL_ASSERT_OK(gemm_->gemm_bf16(da.as<uint16_t>(), db.as<uint16_t>(), dy->data(), s.m, s.n,
                                     s.k, OutDtype::kF32, false, nullptr));
    const std::vector<float> y = to_host<float>(*dy, s.m * s.n);
    const double d = calc_diff(to_f64(y), exact);
    std::printf("[ gemm    ] bf16 M=%ld N=%ld K=%ld calc_diff vs f64 %.2e\n", long(s.m), long(s.n),
                long(s.k), d);
    EXPECT_LT(d, 1e-6);
  }
}

TEST_F(GpuGemmTest, BadShapesAreRejectedBeforeTheDevice) {
  const auto x = random_matrix(256, 256, 30);
  const Fp8DeviceMatrix qx = quantize_on_gpu(x, 256, 256, ScalingMode::kTile1x128);
  const Fp8DeviceMatrix qw = quantize_on_gpu(x, 256, 256, ScalingMode::kBlock128x128);
  absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::allocate(sizeof(float) * 256 * 256 + 16);
  ASSERT_TRUE(dy.ok());
  Fp8DeviceView bad_k = qx.view();
  bad_k.cols = 120;
  EXPECT_EQ(gemm_->gemm_fp8(bad_k, qw.view(), dy->data(), OutDtype::kF32, false, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      gemm_->gemm_fp8(qw.view(), qw.view(), dy->data(), OutDtype::kF32, false, nullptr).code(),
      absl::StatusCode::kUnimplemented);
  EXPECT_EQ(
      gemm_->gemm_fp8(qx.view(), qw.view(), dy->as<char>() + 4, OutDtype::kF32, false, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm_->gemm_bf16(nullptr, nullptr, dy->data(), 8, 8, 12, OutDtype::kF32, false, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fp8rl::kernels::cuda
