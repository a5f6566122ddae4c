// CUDA's own host-side conversions judge our encoders bit for bit: __nv_cvt_float_to_fp8
// (SATFINITE, E4M3) and __float2bfloat16_rn, from the toolkit headers, no GPU needed.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/formats.h"

namespace fp8rl::kernels {
namespace {

uint8_t cuda_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

uint16_t cuda_bf16(float x) { return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x; }

// The inputs that matter: specials, every code value and every midpoint between neighbouring
// codes (both signs) with the floats a few ulps around them, and the subnormal and overflow edges.
std::vector<float> boundary_inputs() {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           kInf,
                           -kInf,
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x7F800001u),
                           std::bit_cast<float>(0xFFBFFFFFu),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::lowest(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(),
                           464.0f,
                           -464.0f};
  std::vector<float> centers;
  for (int c = 0; c < 0x7F; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    centers.push_back(v);
    if (c < 0x7E) centers.push_back((v + e4m3_to_float(static_cast<uint8_t>(c + 1))) / 2.0f);
  }
  centers.push_back(464.0f);                 // max + half ulp
  centers.push_back(std::ldexp(1.0f, -10));  // half the smallest subnormal
  for (float center : centers) {
    for (float sign : {1.0f, -1.0f}) {
      float up = sign * center;
      float down = sign * center;
      xs.push_back(up);
      for (int i = 0; i < 4; ++i) {
        up = std::nextafter(up, std::numeric_limits<float>::infinity());
        down = std::nextafter(down, -std::numeric_limits<float>::infinity());
        xs.push_back(up);
        xs.push_back(down);
      }
    }
  }
  return xs;
}

TEST(CudaOracle, E4M3MatchesOnBoundaries) {
  for (float x : boundary_inputs()) {
    ASSERT_EQ(float_to_e4m3(x), cuda_e4m3(x))
        << "x = " << x << " bits 0x" << std::hex << std::bit_cast<uint32_t>(x);
  }
}

TEST(CudaOracle, E4M3MatchesOnAStrideThroughAllFloatBitPatterns) {
  // ~16.7M patterns, stride 257 (odd, so every exponent and mantissa pattern is visited often).
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 257) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(b));
    ASSERT_EQ(float_to_e4m3(x), cuda_e4m3(x)) << "bits 0x" << std::hex << b;
  }
}

TEST(CudaOracle, E4M3MatchesOnRandomFloatsOfAllMagnitudes) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> exponent(-20.0f, 12.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int i = 0; i < 2000000; ++i) {
    const float x =
        (i % 2 == 0) ? std::bit_cast<float>(any_bits(rng)) : unit(rng) * std::exp2(exponent(rng));
    ASSERT_EQ(float_to_e4m3(x), cuda_e4m3(x))
        << "x = " << x << " bits 0x" << std::hex << std::bit_cast<uint32_t>(x);
  }
}

TEST(CudaOracle, BF16MatchesOnBoundariesAndAStrideThroughAllFloats) {
  for (float x : boundary_inputs()) ASSERT_EQ(float_to_bf16(x), cuda_bf16(x)) << x;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 251) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(b));
    ASSERT_EQ(float_to_bf16(x), cuda_bf16(x)) << "bits 0x" << std::hex << b;
  }
  // Every exact bf16 tie (low half 0x8000) for every upper half.
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    const float x = std::bit_cast<float>((hi << 16) | 0x8000u);
    ASSERT_EQ(float_to_bf16(x), cuda_bf16(x)) << "bits 0x" << std::hex << ((hi << 16) | 0x8000u);
  }
}

}  // namespace
}  // namespace fp8rl::kernels
