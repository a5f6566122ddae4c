// Names, the layer rule and the JSON encoding of the precision policy.
#include "common/precision.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fp8rl {
namespace {

absl::Status field_error(std::string_view where, std::string_view key, std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(where), ".", std::string(key), ": ", std::string(message)));
}

// One key of a policy or config object; `formats` are the keys holding a Precision.
absl::Status read_key(std::string_view where, const std::string& key, const nlohmann::json& value,
                      Precision* format, bool* pow2_scales, int64_t* first, int64_t* last) {
  if (format != nullptr) {
    if (!value.is_string()) return field_error(where, key, "expected a string");
    absl::StatusOr<Precision> p = parse_precision(value.get<std::string>());
    if (!p.ok()) return field_error(where, key, std::string(p.status().message()));
    *format = *p;
  } else if (key == "pow2_scales") {
    if (!value.is_boolean()) return field_error(where, key, "expected a boolean");
    *pow2_scales = value.get<bool>();
  } else {
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      return field_error(where, key, "expected an integer >= 0");
    }
    *(key == "bf16_first_layers" ? first : last) = value.get<int64_t>();
  }
  return absl::OkStatus();
}

absl::Status read_object(const nlohmann::json& json, std::string_view where,
                         std::initializer_list<std::pair<const char*, Precision*>> formats,
                         bool* pow2_scales, int64_t* first, int64_t* last) {
  if (!json.is_object())
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": expected an object"));
  for (const auto& [key, value] : json.items()) {
    Precision* format = nullptr;
    bool known = key == "pow2_scales" || key == "bf16_first_layers" || key == "bf16_last_layers";
    for (const auto& [name, target] : formats) {
      if (key == name) format = target, known = true;
    }
    if (!known) {
      std::vector<std::string> keys;
      for (const auto& f : formats) keys.emplace_back(f.first);
      keys.insert(keys.end(), {"pow2_scales", "bf16_first_layers", "bf16_last_layers"});
      return field_error(where, key,
                         absl::StrCat("unknown key (expected ", absl::StrJoin(keys, ", "), ")"));
    }
    if (auto s = read_key(where, key, value, format, pow2_scales, first, last); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<Precision> parse_precision(std::string_view name) {
  if (name == "fp32" || name == "f32") return Precision::kF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return Precision::kFP8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", std::string(name), "' (expected fp32, bf16 or fp8)"));
}

Precision PrecisionPolicy::layer_linear(int64_t layer, int64_t num_layers) const {
  if (linear != Precision::kFP8) return linear;
  if (layer < bf16_first_layers || layer >= num_layers - bf16_last_layers) {
    return Precision::kBF16;
  }
  return Precision::kFP8;
}

PrecisionPolicy PrecisionConfig::policy(Precision linear) const {
  PrecisionPolicy p;
  p.linear = linear;
  p.kv_cache = kv_cache;
  p.bf16_first_layers = bf16_first_layers;
  p.bf16_last_layers = bf16_last_layers;
  p.pow2_scales = pow2_scales;
  return p;
}

nlohmann::ordered_json precision_policy_to_json(const PrecisionPolicy& p) {
  return {{"linear", std::string(precision_name(p.linear))},
          {"kv_cache", std::string(precision_name(p.kv_cache))},
          {"pow2_scales", p.pow2_scales},
          {"bf16_first_layers", p.bf16_first_layers},
          {"bf16_last_layers", p.bf16_last_layers}};
}

nlohmann::ordered_json precision_config_to_json(const PrecisionConfig& c) {
  return {{"generation", std::string(precision_name(c.generation))},
          {"training", std::string(precision_name(c.training))},
          {"kv_cache", std::string(precision_name(c.kv_cache))},
          {"pow2_scales", c.pow2_scales},
          {"bf16_first_layers", c.bf16_first_layers},
          {"bf16_last_layers", c.bf16_last_layers}};
}

absl::Status precision_policy_from_json(const nlohmann::json& json, std::string_view where,
                                        PrecisionPolicy* out) {
  PrecisionPolicy p = *out;
  if (auto s = read_object(json, where, {{"linear", &p.linear}, {"kv_cache", &p.kv_cache}},
                           &p.pow2_scales, &p.bf16_first_layers, &p.bf16_last_layers);
      !s.ok()) {
    return s;
  }
  *out = p;
  return absl::OkStatus();
}

absl::Status precision_config_from_json(const nlohmann::json& json, std::string_view where,
                                        PrecisionConfig* out) {
  PrecisionConfig c = *out;
  if (auto s = read_object(
          json, where,
          {{"generation", &c.generation}, {"training", &c.training}, {"kv_cache", &c.kv_cache}},
          &c.pow2_scales, &c.bf16_first_layers, &c.bf16_last_layers);
      !s.ok()) {
    return s;
  }
  *out = c;
  return absl::OkStatus();
}

}  // namespace fp8rl
