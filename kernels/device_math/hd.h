// The scalar building blocks of the shared host/device math: the FP8RL_HD qualifier, float bit
// access, BF16 rounding and E4M3 coding written once for the CPU reference and the CUDA kernels.
//
// Every function here is `__host__ __device__` when nvcc compiles it and a plain inline function
// otherwise, so the CPU reference (kernels/cpu/decoder_ops.cc) and the kernels
// (kernels/cuda/decoder_kernels.cu) run the same arithmetic in the same order. The kernels are
// compiled with --fmad=false, so a*b+c is two IEEE roundings on both sides; sqrt and division are
// IEEE on both sides (nvcc's -prec-sqrt/-prec-div defaults). Only exp/log differ: the host calls
// glibc, the device CUDA's libdevice (expf within 2 ulp), so ops that use them agree to a few ulp,
// not bit for bit (docs/design/gpu.md, "CUDA kernels").
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8RL_HD __host__ __device__ __forceinline__
#else
#define FP8RL_HD inline
#endif

namespace fp8rl::kernels::dm {

FP8RL_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

FP8RL_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

FP8RL_HD float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

FP8RL_HD double exp_f64(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

FP8RL_HD double log_f64(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}

FP8RL_HD float sqrt_f32(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// x rounded to the nearest BF16 (ties to even), returned as float; any NaN becomes the canonical
// quiet NaN. The same bit arithmetic as kernels/formats.h round_bf16.
FP8RL_HD float round_bf16(float x) {
  const uint32_t bits = f32_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return f32_from_bits(0x7FFF0000u);
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return f32_from_bits(rounded & 0xFFFF0000u);
}

FP8RL_HD uint16_t float_to_bf16(float x) {
  return static_cast<uint16_t>(f32_bits(round_bf16(x)) >> 16);
}

FP8RL_HD float bf16_to_float(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// E4M3 code -> float, exact (0x7F / 0xFF are NaN), as kernels/formats.h e4m3_to_float.
FP8RL_HD float e4m3_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xFu;
  const uint32_t man = code & 0x7u;
  if (exp == 0xFu && man == 0x7u) return f32_from_bits(sign | 0x7FC00000u);
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0.001953125f;  // man * 2^-9, exact
    return sign != 0 ? -mag : mag;
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
}

// float -> E4M3, round-to-nearest-even, saturating to +-448, NaN -> 0x7F: the same bit
// arithmetic as kernels/formats.h float_to_e4m3 (and CUDA's __NV_SATFINITE conversion).
FP8RL_HD uint8_t float_to_e4m3(float x) {
  const uint32_t bits = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return 0x7F;
  if (abs > 0x43E80000u) return sign | 0x7E;  // above 464: saturate to 448
  if (abs >= 0x3C800000u) {                   // >= 2^-6: normal
    const uint32_t rounded = abs + 0x7FFFFu + ((abs >> 20) & 1u);
    return sign | static_cast<uint8_t>((rounded >> 20) - ((127u - 7u) << 3));
  }
  const uint32_t exp = abs >> 23;
  if (exp == 0) return sign;
  const uint32_t significand = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 141u - exp;
  if (shift > 24) return sign;
  uint32_t m = significand >> shift;
  const uint32_t rem = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return sign | static_cast<uint8_t>(m);
}

// KV cache element types (the cache stores fp32, bf16 bits, or e4m3 codes with a per-layer scale).
enum class KvDtype : int { kF32 = 0, kBF16 = 1, kFP8 = 2 };

// Element i of a KV row stored as `dtype`, dequantized: fp8 as e4m3_to_float(code) * scale (one
// fp32 multiply, as kernels::dequantize_with_scale), bf16 exactly, fp32 as is.
FP8RL_HD float kv_load(const void* row, int64_t i, KvDtype dtype, float scale) {
  switch (dtype) {
    case KvDtype::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(row)[i]);
    case KvDtype::kFP8:
      return e4m3_to_float(static_cast<const uint8_t*>(row)[i]) * scale;
    default:
      return static_cast<const float*>(row)[i];
  }
}

// Stores x as element i of a KV row: fp8 as e4m3(x / scale) (a true division, as
// kernels::quantize_with_scale), bf16 rounded to nearest even.
FP8RL_HD void kv_store(void* row, int64_t i, KvDtype dtype, float scale, float x) {
  switch (dtype) {
    case KvDtype::kBF16:
      static_cast<uint16_t*>(row)[i] = float_to_bf16(x);
      return;
    case KvDtype::kFP8:
      static_cast<uint8_t*>(row)[i] = float_to_e4m3(x / scale);
      return;
    default:
      static_cast<float*>(row)[i] = x;
  }
}

FP8RL_HD int64_t kv_elem_bytes(KvDtype dtype) {
  return dtype == KvDtype::kF32 ? 4 : dtype == KvDtype::kBF16 ? 2 : 1;
}

}  // namespace fp8rl::kernels::dm
