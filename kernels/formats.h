// The number formats of the FP8 recipe: OCP E4M3 and BF16, bit-exact with CUDA's conversions.
#pragma once

#include <bit>
#include <cstdint>

namespace fp8rl::kernels {

// E4M3 (OCP FP8): bias 7, max finite 448, no infinities, NaN = S.1111.111.
inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE4M3NaN = 0x7F;      // the NaN the encoder writes
inline constexpr uint8_t kE4M3MaxCode = 0x7E;  // +448

// float -> E4M3, round-to-nearest-even, saturating: every finite |x| > 448 and +-inf become
// +-448 (0x7E/0xFE); ties go to the even mantissa; -0 and negative values that round to zero
// keep the sign (0x80). Any NaN (either sign) becomes the canonical 0x7F, exactly as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and `cvt.rn.satfinite.e4m3x2.f32` do.
// Inline (defined below): it is the inner loop of every quantization.
inline uint8_t float_to_e4m3(float x);
// E4M3 -> float (exact). 0x7F and 0xFF decode to NaN (with that sign).
float e4m3_to_float(uint8_t code);
// The 256-entry decode table (index = code), for hot loops that decode many codes.
const float* e4m3_decode_table();

// float -> BF16 bits, round-to-nearest-even (finite values may round up to +-inf), +-inf kept.
// Any NaN becomes the canonical quiet 0x7FFF, as CUDA's __float2bfloat16_rn does.
inline uint16_t float_to_bf16(float x);
// BF16 bits -> float (exact).
inline float bf16_to_float(uint16_t bits);
// x rounded to the nearest BF16 value, returned as float.
inline float round_bf16(float x);

// ---- inline definitions (bit-field arithmetic, independent of the FPU rounding mode) ----

namespace detail {
inline constexpr uint32_t kF32Inf = 0x7F800000u;
inline constexpr uint32_t kF32E4M3Overflow = 0x43E80000u;   // 464 = 448 + half an ulp: ties to 448
inline constexpr uint32_t kF32E4M3MinNormal = 0x3C800000u;  // 2^-6
}  // namespace detail

inline uint8_t float_to_e4m3(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > detail::kF32Inf) return kE4M3NaN;
  if (abs > detail::kF32E4M3Overflow) return sign | kE4M3MaxCode;  // saturate (inf included)
  if (abs >= detail::kF32E4M3MinNormal) {
    // Keep 3 of the 23 mantissa bits, round-to-nearest-even on the 20 dropped ones; a carry
    // moves into the exponent, which is the correct next code. Rebias 127 -> 7.
    const uint32_t rounded = abs + 0x7FFFFu + ((abs >> 20) & 1u);
    return sign | static_cast<uint8_t>((rounded >> 20) - ((127u - 7u) << 3));
  }
  // Subnormal range: result M * 2^-9 with M = RNE(|x| * 2^9) in [0, 8] (8 is the min normal).
  const uint32_t exp = abs >> 23;
  if (exp == 0) return sign;  // fp32 subnormals are far below 2^-10
  const uint32_t significand = (abs & 0x7FFFFFu) | 0x800000u;  // |x| = sig * 2^(exp - 150)
  const uint32_t shift = 141u - exp;                           // |x| * 2^9 = sig >> shift
  if (shift > 24) return sign;                                 // |x| * 2^9 < 0.5
  uint32_t m = significand >> shift;
  const uint32_t rem = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return sign | static_cast<uint8_t>(m);
}

inline uint16_t float_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > detail::kF32Inf) return 0x7FFF;
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

}  // namespace fp8rl::kernels
