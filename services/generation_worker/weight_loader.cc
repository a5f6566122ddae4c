// Precision-policy resolution and model construction for a received weight version (see
// weight_loader.h for the rules).
#include "services/generation_worker/weight_loader.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/config.h"
#include "model/params.h"
#include "model/weight_view.h"

namespace fp8rl::generation {
namespace {

using Json = nlohmann::json;

absl::Status field_error(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: ", kPrecisionConfigKey, ".", field, ": ", message));
}

// Values read from the optional "fp8rl_precision" object.
struct ExplicitPrecision {
  std::optional<model::Precision> linear;
  std::optional<model::KvCacheDtype> kv_cache;
  std::optional<bool> pow2_scales;
  std::optional<int64_t> bf16_first_layers;
  std::optional<int64_t> bf16_last_layers;
};

// The "fp8rl_precision" object through the one JSON reader of common/precision.h, remembering
// which keys were present (explicit values take precedence over what the payload implies).
absl::StatusOr<ExplicitPrecision> read_explicit(const std::string& config_json) {
  ExplicitPrecision out;
  Json root = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("config.json: expected a JSON object");
  }
  auto it = root.find(kPrecisionConfigKey);
  if (it == root.end() || it->is_null()) return out;
  model::PrecisionPolicy p;
  if (auto s =
          precision_policy_from_json(*it, absl::StrCat("config.json: ", kPrecisionConfigKey), &p);
      !s.ok()) {
    return s;
  }
  if (it->contains("linear")) out.linear = p.linear;
  if (it->contains("kv_cache")) out.kv_cache = p.kv_cache;
  if (it->contains("pow2_scales")) out.pow2_scales = p.pow2_scales;
  if (it->contains("bf16_first_layers")) out.bf16_first_layers = p.bf16_first_layers;
  if (it->contains("bf16_last_layers")) out.bf16_last_layers = p.bf16_last_layers;
  return out;
}

// Per decoder layer: true when its linears are F8_E4M3 in the payload. All linears of a layer
// (attention, MLP or a mixture-of-experts layer's experts; the layout of `config`) must agree.
absl::StatusOr<std::vector<bool>> fp8_layers(const model::WeightView& set,
                                             const model::ModelConfig& config) {
  const int64_t num_layers = config.num_hidden_layers;
  std::vector<int64_t> fp8(num_layers, 0), total(num_layers, 0);
  const model::ParamLayout layout(config);
  for (const model::ParamInfo& p : layout.params()) {
    if (p.kind != model::ParamKind::kLinear) continue;
    const model::TensorView* t = set.find(p.name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight set v", set.version, ": missing tensor '", p.name, "'"));
    }
    fp8[p.layer] += t->dtype == DType::kF8E4M3 ? 1 : 0;
    ++total[p.layer];
  }
  std::vector<bool> out(num_layers, false);
  for (int64_t l = 0; l < num_layers; ++l) {
    if (fp8[l] != 0 && fp8[l] != total[l]) {
      return absl::InvalidArgumentError(absl::StrCat("weight set v", set.version, ": layer ", l,
                                                     " mixes F8_E4M3 and other linear weights"));
    }
    out[l] = fp8[l] == total[l];
  }
  return out;
}

}  // namespace

v1::WeightFormat weight_set_format(const model::WeightSet& set) {
  absl::StatusOr<model::WeightView> view = model::view_of(set);
  return view.ok() ? weight_set_format(*view) : v1::WEIGHT_FORMAT_UNSPECIFIED;
}

v1::WeightFormat weight_set_format(const model::WeightView& set) {
  bool all_bf16 = true;
  for (const model::TensorView& t : set.tensors()) {
    if (t.dtype == DType::kF8E4M3) return v1::WEIGHT_FORMAT_FP8;
    // KV scales are F32 scalars in every format.
    if (t.dtype != DType::kBF16 && !t.shape.empty()) all_bf16 = false;
  }
  return all_bf16 ? v1::WEIGHT_FORMAT_BF16 : v1::WEIGHT_FORMAT_UNSPECIFIED;
}

absl::StatusOr<model::PrecisionPolicy> resolve_precision_policy(
    const model::WeightSet& set, const PrecisionOverrides& overrides) {
  absl::StatusOr<model::WeightView> view = model::view_of(set);
  if (!view.ok()) return view.status();
  return resolve_precision_policy(*view, overrides);
}

absl::StatusOr<model::PrecisionPolicy> resolve_precision_policy(
    const model::WeightView& set, const PrecisionOverrides& overrides) {
  absl::StatusOr<model::ModelConfig> config = model::parse_model_config(set.config_json);
  if (!config.ok()) return config.status();
  absl::StatusOr<ExplicitPrecision> explicit_policy = read_explicit(set.config_json);
  if (!explicit_policy.ok()) return explicit_policy.status();
  const int64_t n_layers = config->num_hidden_layers;
  const bool fp8_payload = weight_set_format(set) == v1::WEIGHT_FORMAT_FP8;

  model::PrecisionPolicy policy;
  policy.linear = overrides.linear.value_or(explicit_policy->linear.value_or(
      fp8_payload ? model::Precision::kFP8 : model::Precision::kBF16));
  policy.kv_cache =
      overrides.kv_cache.value_or(explicit_policy->kv_cache.value_or(model::KvCacheDtype::kBF16));
  policy.pow2_scales = explicit_policy->pow2_scales.value_or(false);
  policy.bf16_first_layers = explicit_policy->bf16_first_layers.value_or(0);
  policy.bf16_last_layers = explicit_policy->bf16_last_layers.value_or(0);

  if (fp8_payload) {
    // The BF16 layers of an FP8 payload must be a prefix and a suffix of the layer stack; they
    // are what the trainer's policy kept in BF16, so the worker's policy must say the same.
    absl::StatusOr<std::vector<bool>> fp8 = fp8_layers(set, *config);
    if (!fp8.ok()) return fp8.status();
    int64_t first = 0, last = 0;
    while (first < n_layers && !(*fp8)[first]) ++first;
    if (first < n_layers) {
      while (!(*fp8)[n_layers - 1 - last]) ++last;
    }
    for (int64_t l = first; l < n_layers - last; ++l) {
      if (!(*fp8)[l]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "weight set v", set.version, ": layer ", l,
            " has non-FP8 linears in an FP8 payload (only the first/last layers may)"));
      }
    }
    const std::pair<const char*, std::pair<std::optional<int64_t>, int64_t>> checks[] = {
        {"bf16_first_layers", {explicit_policy->bf16_first_layers, first}},
        {"bf16_last_layers", {explicit_policy->bf16_last_layers, last}}};
    for (const auto& [name, values] : checks) {
      if (values.first.has_value() && *values.first != values.second) {
        return field_error(name,
                           absl::StrCat(*values.first, " disagrees with the payload, which has ",
                                        values.second, " such layers"));
      }
    }
    policy.bf16_first_layers = first;
    policy.bf16_last_layers = last;
  }

  if (policy.kv_cache == model::KvCacheDtype::kFP8) {
    for (int64_t l = 0; l < n_layers; ++l) {
      for (const char* kv : {"k_scale", "v_scale"}) {
        const std::string name = absl::StrCat("model.layers.", l, ".self_attn.", kv);
        if (set.find(name) == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("kv_cache fp8: weight set v", set.version, " lacks '", name, "'"));
        }
      }
    }
  }
  return policy;
}

absl::StatusOr<LoadedWeights> load_weights(const model::WeightSet& set,
                                           const PrecisionOverrides& overrides) {
  if (set.version <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight set: version must be > 0, got ", set.version));
  }
  absl::StatusOr<model::PrecisionPolicy> policy = resolve_precision_policy(set, overrides);
  if (!policy.ok()) return policy.status();
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::FromWeightSet(set, *policy);
  if (!m.ok()) return m.status();
  LoadedWeights out;
  out.model = std::shared_ptr<const model::Model>(std::move(*m));
  out.version = set.version;
  out.format = weight_set_format(set);
  out.policy = *policy;
  return out;
}

}  // namespace fp8rl::generation
