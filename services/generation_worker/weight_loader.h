// Turns a verified weight version (model::WeightSet from weight sync) into the inference Model a
// generation worker serves, and decides the precision policy it runs with. The policy must match
// the trainer's exactly (same FP8 kernels on both sides), so how it is chosen is spelled out here.
//
// How the precision policy reaches the worker (first match wins, per field):
//   1. Worker flags --precision (fp32|bf16|fp8) and --kv-cache (fp32|bf16|fp8): operator override.
//   2. The version's config.json (the manifest's model_config_json) may carry an object
//        "fp8rl_precision": {"linear": "fp8", "kv_cache": "fp8", "pow2_scales": false,
//                            "bf16_first_layers": 0, "bf16_last_layers": 0}
//      (every key optional; unknown keys are rejected). The trainer writes it from the job's
//      PrecisionSpec when it publishes; HF loaders ignore the extra key.
//   3. The payload itself: linear = fp8 when any tensor is F8_E4M3, else bf16; bf16_first/last
//      layers = the leading/trailing decoder layers whose linears are not F8_E4M3 in an FP8
//      payload; kv_cache = bf16 (an FP8 KV cache is only used when asked for, because the scales
//      are only meaningful once the trainer has calibrated them); pow2_scales = false.
// An FP8 KV cache requires model.layers.{i}.self_attn.k_scale / v_scale for every layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "fp8rl/v1/common.pb.h"
#include "model/model.h"
#include "model/precision.h"
#include "model/weight_set.h"
#include "model/weight_view.h"

namespace fp8rl::generation {

// The config.json key carrying the job's generation precision (see above); defined beside the
// policy's JSON encoding.
using ::fp8rl::kPrecisionConfigKey;

// Operator overrides from the worker's flags; unset fields come from the version.
struct PrecisionOverrides {
  std::optional<model::Precision> linear;
  std::optional<model::KvCacheDtype> kv_cache;
};

// WEIGHT_FORMAT_FP8 when any tensor is F8_E4M3, WEIGHT_FORMAT_BF16 when every non-scalar tensor
// is BF16, WEIGHT_FORMAT_UNSPECIFIED otherwise (an F32 set, only built in-process).
v1::WeightFormat weight_set_format(const model::WeightSet& set);
v1::WeightFormat weight_set_format(const model::WeightView& set);

// The policy the worker runs `set` with. InvalidArgument naming the field for a malformed
// "fp8rl_precision" entry, an FP8 payload with BF16 linears in a middle layer, explicit
// bf16_first/last_layers that disagree with the payload, or an FP8 KV cache without KV scales.
absl::StatusOr<model::PrecisionPolicy> resolve_precision_policy(
    const model::WeightSet& set, const PrecisionOverrides& overrides);
absl::StatusOr<model::PrecisionPolicy> resolve_precision_policy(
    const model::WeightView& set, const PrecisionOverrides& overrides);

// A version ready to serve.
struct LoadedWeights {
  std::shared_ptr<const model::Model> model;
  int64_t version = 0;
  v1::WeightFormat format = v1::WEIGHT_FORMAT_UNSPECIFIED;
  model::PrecisionPolicy policy;
};

// resolve_precision_policy + Model::FromWeightSet. InvalidArgument for a version <= 0.
absl::StatusOr<LoadedWeights> load_weights(const model::WeightSet& set,
                                           const PrecisionOverrides& overrides);

}  // namespace fp8rl::generation
