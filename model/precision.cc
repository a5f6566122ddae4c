// Names and parsing of the precision policy.
#include "model/precision.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::model {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::kF32:
      return "fp32";
    case Precision::kBF16:
      return "bf16";
    case Precision::kFP8:
      return "fp8";
  }
  return "?";
}

std::string_view kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kF32:
      return "fp32";
    case KvCacheDtype::kBF16:
      return "bf16";
    case KvCacheDtype::kFP8:
      return "fp8";
  }
  return "?";
}

absl::StatusOr<Precision> parse_precision(std::string_view name) {
  if (name == "fp32" || name == "f32") return Precision::kF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return Precision::kFP8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", std::string(name), "' (expected fp32, bf16 or fp8)"));
}

absl::StatusOr<KvCacheDtype> parse_kv_cache_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32") return KvCacheDtype::kF32;
  if (name == "bf16") return KvCacheDtype::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDtype::kFP8;
  return absl::InvalidArgumentError(absl::StrCat("unknown kv-cache dtype '", std::string(name),
                                                 "' (expected fp32, bf16 or fp8)"));
}

Precision PrecisionPolicy::layer_linear(int64_t layer, int64_t num_layers) const {
  if (linear != Precision::kFP8) return linear;
  if (layer < bf16_first_layers || layer >= num_layers - bf16_last_layers) {
    return Precision::kBF16;
  }
  return Precision::kFP8;
}

}  // namespace fp8rl::model
