// Dtype names and sizes for safetensors, and exact narrow-float -> fp32 decoding for readers.
#include "common/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace fp8rl {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps");

namespace {

struct DTypeRow {
  DType dtype;
  std::string_view name;
  int64_t size;
};

constexpr std::array<DTypeRow, 11> kDTypes = {{
    {DType::kF32, "F32", 4},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF64, "F64", 8},
    {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
}};

const DTypeRow& row(DType dtype) {
  for (const auto& r : kDTypes) {
    if (r.dtype == dtype) return r;
  }
  return kDTypes[0];  // unreachable: every enumerator has a row
}

// All 256 E4M3 values, computed once from the bit fields.
std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const int sign = code >> 7;
    const int exponent = (code >> 3) & 0xF;
    const int mantissa = code & 0x7;
    float magnitude;
    if (exponent == 0xF && mantissa == 0x7) {
      magnitude = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
      magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // m/8 * 2^(1-7)
    } else {
      magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
    }
    table[code] = sign ? -magnitude : magnitude;
  }
  return table;
}

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

std::string_view dtype_name(DType dtype) { return row(dtype).name; }

int64_t dtype_size(DType dtype) { return row(dtype).size; }

absl::StatusOr<DType> parse_dtype(std::string_view name) {
  for (const auto& r : kDTypes) {
    if (r.name == name) return r.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", std::string(name),
                   "' (expected F32, F16, BF16, F8_E4M3, F64, I64, I32, I16, I8, U8 "
                   "or BOOL)"));
}

bool is_float_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF8E4M3 || dtype == DType::kF64;
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1F;
  const uint32_t mantissa = bits & 0x3FF;
  float magnitude;
  if (exponent == 0x1F) {
    magnitude =
        mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal: m * 2^-24
  } else {
    magnitude = std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

float e4m3_to_f32(uint8_t code) {
  static const std::array<float, 256> table = make_e4m3_table();
  return table[code];
}

absl::Status convert_to_f32(DType dtype, const uint8_t* src, int64_t n, float* out) {
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      return absl::OkStatus();
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load<uint16_t>(src + 2 * i));
      return absl::OkStatus();
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load<uint16_t>(src + 2 * i));
      return absl::OkStatus();
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(src[i]);
      return absl::OkStatus();
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(load<double>(src + 8 * i));
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", std::string(dtype_name(dtype)), " is not a float type"));
  }
}

}  // namespace fp8rl
