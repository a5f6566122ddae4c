// Dtype names/sizes and the exact F16/BF16/E4M3 -> fp32 decoders the checkpoint readers rely on.
#include "common/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/unit/common/f16_reference.h"

namespace fp8rl {
namespace {

TEST(Dtype, NamesAndSizesRoundTrip) {
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F64", 8}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U8", 1},      {"BOOL", 1}};
  for (const auto& [name, size] : expected) {
    absl::StatusOr<DType> d = parse_dtype(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_EQ(dtype_name(*d), name);
    EXPECT_EQ(dtype_size(*d), size) << name;
  }
}

TEST(Dtype, UnknownNameIsAnErrorNamingIt) {
  for (const char* bad : {"F8_E5M2", "f32", "", "FLOAT"}) {
    absl::StatusOr<DType> d = parse_dtype(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(std::string(d.status().message()).find(std::string("'") + bad + "'"),
              std::string::npos)
        << d.status();
  }
}

// Every one of the 65536 F16 codes against two independent decoders: an integer-only one
// (f16_reference.h, every compiler) and the compiler's own _Float16 conversion where the compiler
// has the type (GCC; not clang 14 on x86-64, which the sanitizer builds use).
bool same_float(float want, float got) {
  if (std::isnan(want)) return std::isnan(got);
  return std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want);
}

TEST(Dtype, F16DecodesEveryCodeExactly) {
  int compared_with_compiler = 0;
  for (uint32_t code = 0; code < 65536; ++code) {
    const uint16_t bits = static_cast<uint16_t>(code);
    const float got = f16_to_f32(bits);
    const float by_bits = testing_util::f16_bits_to_f32_by_bits(bits);
    EXPECT_TRUE(same_float(by_bits, got)) << code << ": " << got << " vs " << by_bits;
#if defined(__FLT16_MANT_DIG__)
    const float by_compiler = testing_util::f16_bits_to_f32_by_compiler(bits);
    EXPECT_TRUE(same_float(by_compiler, got)) << code << ": " << got << " vs " << by_compiler;
    ++compared_with_compiler;
#endif
  }
  EXPECT_EQ(compared_with_compiler, testing_util::kCompilerHasFloat16 ? 65536 : 0);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
}

TEST(Dtype, Bf16DecodesTheHighHalfOfFp32) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100);
    const uint32_t truncated = std::bit_cast<uint32_t>(x) & 0xFFFF0000u;
    EXPECT_EQ(bf16_to_f32(static_cast<uint16_t>(truncated >> 16)), std::bit_cast<float>(truncated));
  }
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));  // subnormal
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7FC0)));
}

TEST(Dtype, E4M3DecodesTheOcpFormat) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), std::ldexp(7.0f, -9));  // largest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x3C), 1.5f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x77), 240.0f);  // S.1110.111 is finite (no infinities)
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  // Codes 0..126 are strictly increasing, and negative codes mirror them.
  for (int c = 1; c < 127; ++c) {
    EXPECT_LT(e4m3_to_f32(static_cast<uint8_t>(c - 1)), e4m3_to_f32(static_cast<uint8_t>(c)));
    EXPECT_EQ(e4m3_to_f32(static_cast<uint8_t>(c | 0x80)), -e4m3_to_f32(static_cast<uint8_t>(c)));
  }
}

TEST(Dtype, ConvertToF32HandlesEveryFloatDtype) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> dist(-5.0, 5.0);
  std::vector<double> f64(33);
  for (double& v : f64) v = dist(rng);
  std::vector<float> out(f64.size());
  ASSERT_TRUE(convert_to_f32(DType::kF64, reinterpret_cast<const uint8_t*>(f64.data()),
                             static_cast<int64_t>(f64.size()), out.data())
                  .ok());
  for (size_t i = 0; i < f64.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(f64[i]));

  std::vector<uint16_t> h(17);
  for (uint16_t& v : h) v = static_cast<uint16_t>(rng() & 0x7BFF);  // finite values
  ASSERT_TRUE(convert_to_f32(DType::kF16, reinterpret_cast<const uint8_t*>(h.data()),
                             static_cast<int64_t>(h.size()), out.data())
                  .ok());
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(out[i], f16_to_f32(h[i]));

  std::vector<uint8_t> codes = {0x01, 0x38, 0xC4, 0x7E, 0x55};
  ASSERT_TRUE(convert_to_f32(DType::kF8E4M3, codes.data(), 5, out.data()).ok());
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], -3.0f);  // 1.100 x 2^(8-7)
  EXPECT_EQ(out[3], 448.0f);

  for (DType d : {DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    EXPECT_FALSE(is_float_dtype(d));
    absl::Status s = convert_to_f32(d, codes.data(), 1, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find(std::string(dtype_name(d))), std::string::npos);
  }
}

}  // namespace
}  // namespace fp8rl
