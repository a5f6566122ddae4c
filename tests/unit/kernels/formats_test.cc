// Exhaustive and edge-case tests of the E4M3 and BF16 conversions against references computed
// independently from the bit fields (tests/unit/kernels/e4m3_reference.h).
#include "kernels/formats.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "tests/unit/kernels/e4m3_reference.h"

namespace fp8rl::kernels {
namespace {

using testing::e4m3_reference_encode;
using testing::e4m3_reference_value;

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

TEST(E4M3, DecodesAll256CodesFromTheirBitFields) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const double want = e4m3_reference_value(code);
    const float got = e4m3_to_float(code);
    EXPECT_EQ(bits_of(e4m3_decode_table()[c]), bits_of(got)) << "code " << c;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
  }
  EXPECT_EQ(e4m3_to_float(kE4M3MaxCode), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
}

TEST(E4M3, EncodeOfDecodeIsIdentityForEveryNonNaNCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(E4M3, MidpointsRoundToTheEvenMantissaAndNeighboursToTheNearest) {
  for (int c = 0; c < 0x7E; ++c) {
    for (uint8_t sign : {uint8_t{0x00}, uint8_t{0x80}}) {
      const uint8_t lo = sign | static_cast<uint8_t>(c);
      const uint8_t hi = sign | static_cast<uint8_t>(c + 1);
      // The midpoint has at most 5 significant bits: exact in fp32.
      const float mid = (e4m3_to_float(lo) + e4m3_to_float(hi)) / 2.0f;
      ASSERT_EQ(static_cast<double>(mid),
                (e4m3_reference_value(lo) + e4m3_reference_value(hi)) / 2.0);
      const uint8_t even = (c % 2 == 0) ? lo : hi;
      EXPECT_EQ(float_to_e4m3(mid), even) << "midpoint of codes " << int{lo} << ", " << int{hi};
      const float toward_lo = std::nextafter(mid, 0.0f);
      const float toward_hi = std::nextafter(mid, sign ? -kInf : kInf);
      EXPECT_EQ(float_to_e4m3(toward_lo), lo) << "just inside code " << int{lo};
      EXPECT_EQ(float_to_e4m3(toward_hi), hi) << "just inside code " << int{hi};
    }
  }
  // A few by hand: 1 + 1/16 is halfway between 1 (0x38) and 1.125 (0x39): even is 0x38.
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  // 1.1875 is halfway between 1.125 (0x39) and 1.25 (0x3A): even is 0x3A.
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);
  // 15.5 is halfway between 15 (0x57) and 16 (0x58): the carry into the exponent gives 0x58.
  EXPECT_EQ(float_to_e4m3(15.5f), 0x58);
  EXPECT_EQ(float_to_e4m3(-15.5f), 0xD8);
  EXPECT_EQ(float_to_e4m3(15.0f), 0x57);
}

TEST(E4M3, SaturatesToMaxFinite) {
  for (float x : {448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 480.0f, 1e6f,
                  std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7E) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xFE) << -x;
  }
  // 432 is halfway between 416 (0x7D) and 448 (0x7E): even is 0x7E.
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(std::nextafter(432.0f, 0.0f)), 0x7D);
  EXPECT_EQ(float_to_e4m3(std::nextafter(432.0f, kInf)), 0x7E);
}

TEST(E4M3, NaNBecomesTheCanonicalNaNAndDecodesToNaN) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float snan = std::bit_cast<float>(0x7F800001u);
  const float neg_nan = std::bit_cast<float>(0xFFC12345u);
  for (float x : {qnan, snan, neg_nan, -qnan}) EXPECT_EQ(float_to_e4m3(x), kE4M3NaN);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(E4M3, SubnormalsAndSignedZero) {
  const float tiny = std::ldexp(1.0f, -9);  // code 0x01
  EXPECT_EQ(float_to_e4m3(tiny), 0x01);
  EXPECT_EQ(float_to_e4m3(-tiny), 0x81);
  EXPECT_EQ(float_to_e4m3(tiny / 2), 0x00);  // tie between 0 and 2^-9: even is 0
  EXPECT_EQ(float_to_e4m3(-tiny / 2), 0x80);
  EXPECT_EQ(float_to_e4m3(std::nextafter(tiny / 2, 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3(1.5f * tiny), 0x02);  // tie between 1 and 2: even is 2
  EXPECT_EQ(float_to_e4m3(2.5f * tiny), 0x02);  // tie between 2 and 3: even is 2
  EXPECT_EQ(float_to_e4m3(7.5f * tiny), 0x08);  // tie between 7 and the min normal 8
  EXPECT_EQ(float_to_e4m3(3.0f * tiny), 0x03);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(bits_of(e4m3_to_float(0x80)), 0x80000000u);
}

TEST(E4M3, MatchesTheNearestValueSearchOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int i = 0; i < 100000; ++i) {
    // Half random bit patterns (every magnitude), half values around E4M3's range.
    const float x =
        (i % 2 == 0) ? std::bit_cast<float>(any_bits(rng)) : unit(rng) * std::exp2(exponent(rng));
    ASSERT_EQ(float_to_e4m3(x), e4m3_reference_encode(static_cast<double>(x)))
        << "x = " << x << " bits " << std::hex << bits_of(x);
  }
}

TEST(BF16, KnownValuesTiesAndSpecials) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie, even stays
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0xFF800001u)), 0x7FFF);
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(round_bf16(3.14159265f), 3.140625f);
}

TEST(BF16, RoundTripsEveryNonNaNPatternAndRoundsToNearestEven) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float x = bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_bf16(x), b);
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(any_bits(rng));
    if (std::isnan(x) || std::isinf(x)) continue;
    // Independent reference: the two bf16 neighbours of x, nearest wins, tie -> even.
    const uint32_t lo_bits = bits_of(x) & 0xFFFF0000u;
    const double lo = std::bit_cast<float>(lo_bits);
    // The next bf16 away from zero; past the largest finite one it is 2^128 (rounds to inf).
    const uint16_t hi_code = static_cast<uint16_t>((lo_bits >> 16) + 1);
    const double hi_mag = (hi_code & 0x7FFF) == 0x7F80
                              ? std::copysign(std::ldexp(1.0, 128), lo)
                              : static_cast<double>(bf16_to_float(hi_code));
    const double dx = x;
    const double err_lo = std::fabs(dx - lo);
    const double err_hi = std::fabs(dx - hi_mag);
    uint16_t want = static_cast<uint16_t>(lo_bits >> 16);
    if (err_hi < err_lo || (err_hi == err_lo && (want & 1))) ++want;
    ASSERT_EQ(float_to_bf16(x), want) << "bits " << std::hex << bits_of(x);
  }
}

}  // namespace
}  // namespace fp8rl::kernels
