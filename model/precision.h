// The engine's view of the precision policy: the shared plain-data type of common/precision.h
// under the names model/ has always used (docs/design/fp8-recipe.md "The FP8 recipe").
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/precision.h"

namespace fp8rl::model {

using Precision = ::fp8rl::Precision;
// The KV cache uses the same formats: kF32, kBF16 or kFP8 (E4M3 with per-layer k/v scales).
using KvCacheDtype = ::fp8rl::Precision;
using PrecisionPolicy = ::fp8rl::PrecisionPolicy;
using ::fp8rl::parse_precision;
using ::fp8rl::precision_name;

inline std::string_view kv_cache_dtype_name(KvCacheDtype d) { return precision_name(d); }
// Errors: "unknown kv-cache dtype 'x' (expected fp32, bf16 or fp8)".
absl::StatusOr<KvCacheDtype> parse_kv_cache_dtype(std::string_view name);

}  // namespace fp8rl::model
