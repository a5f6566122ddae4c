// Shared helpers of the GPU tests: the sm_90 skip, random data with outliers, calc_diff
// (from kernels/calc_diff.h), and small device-buffer conveniences.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/calc_diff.h"
#include "kernels/cuda/fp8_cuda.h"

namespace fp8rl::kernels::cuda::testing {

// Skips the current test (from a fixture's SetUp or a test body) without an sm_90 device.
#define FP8RL_REQUIRE_SM90()                                             \
  do {                                                                   \
    absl::StatusOr<::fp8rl::kernels::cuda::DeviceInfo> _dev =            \
        ::fp8rl::kernels::cuda::require_sm90();                          \
    if (!_dev.ok()) {                                                    \
      GTEST_SKIP() << "needs an sm_90 GPU: " << _dev.status().message(); \
    }                                                                    \
  } while (0)

#define FP8RL_ASSERT_OK(expr)                      \
  do {                                             \
    const absl::Status _st = (expr);               \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st; \
  } while (0)

// Non-zero normal values whose magnitude varies by row (2^[-6, 6]) and with ~0.5% outliers
// (x 100..1000), so a scale applied to the wrong tile or block shows up in the numbers.
inline std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-6, 6);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, exp_dist(gen));
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(gen);
      if (v == 0.0f) v = 0.5f;
      v *= row_scale;
      if (uni(gen) < 0.005f) v *= 100.0f + 900.0f * uni(gen);
      x[r * cols + c] = v;
    }
  }
  return x;
}

using ::fp8rl::kernels::calc_diff;  // kernels/calc_diff.h

// Bit-exact equality of two floats, except that any two NaNs are equal: a NaN's sign and payload
// are not part of the recipe, and the device writes other NaN bit patterns than the CPU does.
inline bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

template <typename T>
std::vector<double> to_f64(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// y[M,N] = a[M,K] . b[N,K]^T in float64.
inline std::vector<double> gemm_f64(const std::vector<float>& a, const std::vector<float>& b,
                                    int64_t m, int64_t n, int64_t k) {
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += double(a[i * k + p]) * double(b[j * k + p]);
      y[i * n + j] = acc;
    }
  }
  return y;
}

inline std::vector<float> transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  }
  return t;
}

// Uploads host data to a fresh device buffer (test helper: fails the test on error).
template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::allocate(sizeof(T) * host.size());
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return DeviceBuffer();
  const absl::Status st =
      copy_to_device(buf->data(), host.data(), sizeof(T) * host.size(), nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return *std::move(buf);
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& buf, size_t count) {
  std::vector<T> host(count);
  const absl::Status st = copy_to_host(host.data(), buf.data(), sizeof(T) * count, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return host;
}

}  // namespace fp8rl::kernels::cuda::testing
