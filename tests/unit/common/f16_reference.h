// Reference IEEE binary16 -> fp32 decoders for tests, independent of common/dtype.cc's decoder
// (which computes sign * m * 2^e with std::ldexp), and buildable by every compiler we use: clang
// before 15 has no _Float16 on x86-64, so the compiler's own conversion is used only where the
// compiler has the type.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace fp8rl::testing_util {

// Builds the fp32 bit pattern with integer operations only: the exponent is re-biased (15 -> 127)
// and the 10-bit mantissa widened to 23 bits; a subnormal is normalised by shifting its mantissa
// up until the implicit bit appears. Inf and NaN keep their sign and payload.
inline float f16_bits_to_f32_by_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);  // +0 or -0
    // m * 2^-24 == (m << k) / 1024 * 2^(1 - k - 15): shift until bit 10 (the implicit 1) is set.
    int unbiased = 1 - 15;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --unbiased;
    }
    return std::bit_cast<float>(sign | (static_cast<uint32_t>(unbiased + 127) << 23) |
                                ((mantissa & 0x3FFu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

#if defined(__FLT16_MANT_DIG__)
// The compiler has _Float16 (GCC 12 on x86-64, clang 15+, AArch64): its own conversion.
inline constexpr bool kCompilerHasFloat16 = true;
inline float f16_bits_to_f32_by_compiler(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
#else
inline constexpr bool kCompilerHasFloat16 = false;
#endif

// The reference the tests decode with: the compiler's conversion where it exists, else the
// integer one (dtype_test checks that the two agree on all 65536 codes where both exist).
inline float f16_reference(uint16_t h) {
#if defined(__FLT16_MANT_DIG__)
  return f16_bits_to_f32_by_compiler(h);
#else
  return f16_bits_to_f32_by_bits(h);
#endif
}

}  // namespace fp8rl::testing_util
