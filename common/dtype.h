// Element types of tensors on disk and on the wire (safetensors dtype names).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fp8rl {

enum class DType { kF32, kF16, kBF16, kF8E4M3, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "F64", "I64", ...
std::string_view dtype_name(DType dtype);
absl::StatusOr<DType> parse_dtype(std::string_view name);
int64_t dtype_size(DType dtype);  // bytes per element

}  // namespace fp8rl
