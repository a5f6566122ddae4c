// The precision policy: which number format the linear layers and the KV cache use. One plain-data
// type shared by rl/ (job configs), model/ (the engine) and the services (payloads, checkpoints),
// with one JSON encoding, so generation and training compute the same function
// (docs/design/fp8-recipe.md, "FP8 recipe"). The proto <-> struct converter lives beside the protos
// (proto/precision_proto.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fp8rl {

// The config.json key under which a published weight payload carries its generation policy
// (precision_policy_to_json), read by the generation worker's weight loader.
inline constexpr char kPrecisionConfigKey[] = "fp8rl_precision";

// A number format of the linear layers or of the KV cache.
//   kF32:  fp32, no rounding.
//   kBF16: bf16 weights, every op output rounded to bf16 (the CPU emulation of a bf16 GPU path);
//          as a KV-cache format, K/V stored as bf16.
//   kFP8:  linears q/k/v/o/gate/up/down through the block-scaled FP8 GEMM (1x128 activation tiles,
//          128x128 weight blocks, bf16 outputs), the rest as kBF16; as a KV-cache format, E4M3 with
//          a per-layer per-tensor scale (k_scale / v_scale).
enum class Precision { kF32, kBF16, kFP8 };

std::string_view precision_name(Precision p);  // "fp32" | "bf16" | "fp8"
// Accepts the names above, plus "f32" and "fp8_e4m3"; otherwise InvalidArgument
// "unknown precision 'x' (expected fp32, bf16 or fp8)".
absl::StatusOr<Precision> parse_precision(std::string_view name);

// What one model (a generation engine or the trainer's policy) runs with.
struct PrecisionPolicy {
  Precision linear = Precision::kF32;
  Precision kv_cache = Precision::kF32;
  // With kFP8 linears, the first/last N decoder layers keep their linears in bf16.
  int64_t bf16_first_layers = 0;
  int64_t bf16_last_layers = 0;
  // Power-of-two scales for weight blocks and activation tiles.
  bool pow2_scales = false;
  // Training forward applies the KV-cache rounding (bf16, or E4M3 with the same k/v scales) to K
  // (after RoPE) and V, with straight-through gradients, so it matches generation. Not part of the
  // JSON encoding (an engine setting, not a property of the weights).
  bool train_kv_fake_quant = true;

  // True when non-linear ops round to bf16 (kBF16 and kFP8).
  bool bf16_activations() const { return linear != Precision::kF32; }
  // The format used by the linears of decoder layer `layer` of `num_layers`.
  Precision layer_linear(int64_t layer, int64_t num_layers) const;
  bool operator==(const PrecisionPolicy&) const = default;
};

// A job's precision: training and generation may run different linear formats; the KV cache,
// the scales and the bf16 layers are shared, so the two policies differ only in `linear`.
struct PrecisionConfig {
  Precision training = Precision::kFP8;
  Precision generation = Precision::kFP8;
  Precision kv_cache = Precision::kFP8;
  bool pow2_scales = false;
  int64_t bf16_first_layers = 0;
  int64_t bf16_last_layers = 0;

  // The policy with linears in `linear` and everything else from this config.
  PrecisionPolicy policy(Precision linear) const;
  PrecisionPolicy training_policy() const { return policy(training); }
  PrecisionPolicy generation_policy() const { return policy(generation); }
  bool operator==(const PrecisionConfig&) const = default;
};

// The JSON encodings (the weight payload's config.json "fp8rl_precision" object, a checkpoint's
// trainer_state.json "precision" object, the job config's "precision" section):
//   policy: {"linear": "fp8", "kv_cache": "fp8", "pow2_scales": false, "bf16_first_layers": 0,
//            "bf16_last_layers": 0}
//   config: {"generation": "fp8", "training": "fp8", "kv_cache": "fp8", "pow2_scales": false,
//            "bf16_first_layers": 0, "bf16_last_layers": 0}
nlohmann::ordered_json precision_policy_to_json(const PrecisionPolicy& policy);
nlohmann::ordered_json precision_config_to_json(const PrecisionConfig& config);
// Read the keys present in the object `json` over `*out` (absent keys keep their value). Errors
// name the field as "<where>.<key>: ..." (wrong type, unknown name, negative layer count, unknown
// key); `where` is e.g. "config.json: fp8rl_precision".
absl::Status precision_policy_from_json(const nlohmann::json& json, std::string_view where,
                                        PrecisionPolicy* out);
absl::Status precision_config_from_json(const nlohmann::json& json, std::string_view where,
                                        PrecisionConfig* out);

}  // namespace fp8rl
