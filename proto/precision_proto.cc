// Precision settings between the protos and common/precision.h (see precision_proto.h).
#include "proto/precision_proto.h"

#include "absl/strings/str_cat.h"

namespace fp8rl {

v1::WeightFormat weight_format_to_proto(Precision p) {
  switch (p) {
    case Precision::kFP8:
      return v1::WEIGHT_FORMAT_FP8;
    case Precision::kBF16:
      return v1::WEIGHT_FORMAT_BF16;
    case Precision::kF32:
      break;
  }
  return v1::WEIGHT_FORMAT_UNSPECIFIED;
}

absl::StatusOr<Precision> weight_format_from_proto(v1::WeightFormat f, std::string_view field) {
  if (f == v1::WEIGHT_FORMAT_FP8) return Precision::kFP8;
  if (f == v1::WEIGHT_FORMAT_BF16) return Precision::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), ": unknown weight format ", static_cast<int>(f)));
}

v1::PrecisionSpec precision_to_proto(const PrecisionConfig& c) {
  v1::PrecisionSpec p;
  p.set_training(weight_format_to_proto(c.training));
  p.set_generation(weight_format_to_proto(c.generation));
  p.set_kv_cache(weight_format_to_proto(c.kv_cache));
  p.set_pow2_scales(c.pow2_scales);
  p.set_bf16_first_layers(static_cast<int32_t>(c.bf16_first_layers));
  p.set_bf16_last_layers(static_cast<int32_t>(c.bf16_last_layers));
  return p;
}

absl::StatusOr<PrecisionConfig> precision_from_proto(const v1::PrecisionSpec& p,
                                                     std::string_view where) {
  PrecisionConfig c;
  auto read = [&](v1::WeightFormat f, const char* name, Precision fallback,
                  Precision* out) -> absl::Status {
    if (f == v1::WEIGHT_FORMAT_UNSPECIFIED) {
      *out = fallback;
      return absl::OkStatus();
    }
    absl::StatusOr<Precision> v =
        weight_format_from_proto(f, absl::StrCat(std::string(where), ".", name));
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  };
  if (auto s = read(p.training(), "training", Precision::kFP8, &c.training); !s.ok()) return s;
  if (auto s = read(p.generation(), "generation", c.training, &c.generation); !s.ok()) return s;
  if (auto s = read(p.kv_cache(), "kv_cache", Precision::kBF16, &c.kv_cache); !s.ok()) return s;
  if (p.bf16_first_layers() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(where), ".bf16_first_layers: must be >= 0, got ", p.bf16_first_layers()));
  }
  if (p.bf16_last_layers() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(where), ".bf16_last_layers: must be >= 0, got ", p.bf16_last_layers()));
  }
  c.pow2_scales = p.pow2_scales();
  c.bf16_first_layers = p.bf16_first_layers();
  c.bf16_last_layers = p.bf16_last_layers();
  return c;
}

}  // namespace fp8rl
