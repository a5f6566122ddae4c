// The one proto <-> struct converter of the precision settings: v1::PrecisionSpec and
// v1::WeightFormat (proto/fp8rl/v1/) to and from the plain types of common/precision.h.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/precision.h"
#include "fp8rl/v1/common.pb.h"
#include "fp8rl/v1/trainer.pb.h"

namespace fp8rl {

// kFP8 -> WEIGHT_FORMAT_FP8, kBF16 -> WEIGHT_FORMAT_BF16. The proto has no fp32 format: kF32
// gives WEIGHT_FORMAT_UNSPECIFIED (job configs reject fp32 before it gets here).
v1::WeightFormat weight_format_to_proto(Precision p);
// FP8 or BF16; InvalidArgument "<field>: unknown weight format N" otherwise (UNSPECIFIED too).
absl::StatusOr<Precision> weight_format_from_proto(v1::WeightFormat f, std::string_view field);

v1::PrecisionSpec precision_to_proto(const PrecisionConfig& config);
// UNSPECIFIED formats take the defaults (training fp8, generation = training, KV cache bf16);
// negative layer counts are rejected. Errors name "<where>.<field>".
absl::StatusOr<PrecisionConfig> precision_from_proto(const v1::PrecisionSpec& spec,
                                                     std::string_view where);

}  // namespace fp8rl
