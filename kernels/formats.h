// The number formats of the FP8 recipe: OCP E4M3 and BF16, bit-exact with CUDA's conversions.
#pragma once

#include <cstdint>

namespace fp8rl::kernels {

// E4M3 (OCP FP8): bias 7, max finite 448, no infinities, NaN = S.1111.111.
inline constexpr float kE4M3Max = 448.0f;

// float -> E4M3, round-to-nearest-even, saturating to +-448, NaN -> 0x7F (sign kept).
// Bit-exact with __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3).
uint8_t float_to_e4m3(float x);
// E4M3 -> float (exact).
float e4m3_to_float(uint8_t code);

// float -> BF16 bits, round-to-nearest-even, NaN stays NaN (quiet).
uint16_t float_to_bf16(float x);
// BF16 bits -> float (exact).
float bf16_to_float(uint16_t bits);
// x rounded to the nearest BF16 value, returned as float.
float round_bf16(float x);

}  // namespace fp8rl::kernels
