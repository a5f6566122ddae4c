// Element types of tensors on disk and on the wire (safetensors dtype names), and the exact
// decoders from the narrow float formats to fp32 that checkpoint readers need. (The encoders live
// in kernels/formats.h; fp8rl_common must not depend on fp8rl_kernels.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl {

enum class DType { kF32, kF16, kBF16, kF8E4M3, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "F64", "I64", ...
std::string_view dtype_name(DType dtype);
absl::StatusOr<DType> parse_dtype(std::string_view name);
int64_t dtype_size(DType dtype);  // bytes per element
// F32, F16, BF16, F8_E4M3 and F64: the dtypes convert_to_f32 accepts.
bool is_float_dtype(DType dtype);

// Exact decoders (every finite input value is representable in fp32, subnormals included).
float f16_to_f32(uint16_t bits);   // IEEE binary16
float bf16_to_f32(uint16_t bits);  // bfloat16
float e4m3_to_f32(uint8_t code);   // OCP E4M3: bias 7, max 448, NaN = S.1111.111, no infinities

// Converts n little-endian elements of a float dtype at src to fp32 (F64 is rounded to nearest).
// InvalidArgument for non-float dtypes.
absl::Status convert_to_f32(DType dtype, const uint8_t* src, int64_t n, float* out);

}  // namespace fp8rl
