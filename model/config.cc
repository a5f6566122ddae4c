// config.json <-> ModelConfig with field-named errors.
#include "model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"

namespace fp8rl::model {
namespace {

using Json = nlohmann::ordered_json;

absl::Status field_error(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, ": ", message));
}

absl::Status read_int(const Json& j, const char* key, bool required, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? field_error(key, "missing") : absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return field_error(key, absl::StrCat("expected an integer, got ", json_type_name(*it)));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status read_double(const Json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return field_error(key, absl::StrCat("expected a number, got ", json_type_name(*it)));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status read_bool(const Json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return field_error(key, absl::StrCat("expected a boolean, got ", json_type_name(*it)));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// eos_token_id may be an int or a list of ints (HF); we keep the first.
absl::Status read_token_id(const Json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    *out = (*it)[0].get<int64_t>();
  } else {
    return field_error(key, "expected an integer or a list of integers");
  }
  return absl::OkStatus();
}

absl::Status validate_rope_scaling(const RopeScaling& r, const std::string& field) {
  if (r.rope_type == "default") return absl::OkStatus();
  if (r.rope_type != "llama3") {
    return field_error(
        field + ".rope_type",
        absl::StrCat("'", r.rope_type, "' is not supported (expected \"default\" or \"llama3\")"));
  }
  if (!(r.factor >= 1.0) || !std::isfinite(r.factor)) {
    return field_error(field + ".factor", absl::StrCat("must be >= 1, got ", r.factor));
  }
  if (!(r.low_freq_factor > 0) || !std::isfinite(r.low_freq_factor)) {
    return field_error(field + ".low_freq_factor", "must be > 0");
  }
  if (!(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
    return field_error(field + ".high_freq_factor", "must be > low_freq_factor");
  }
  if (r.original_max_position_embeddings <= 0) {
    return field_error(field + ".original_max_position_embeddings", "must be > 0");
  }
  return absl::OkStatus();
}

// HF "rope_scaling" (or transformers 5's "rope_parameters", which also carries rope_theta).
// Every key is known or an error: a scaling we do not implement must not be silently dropped.
absl::Status read_rope_scaling(const Json& j, const std::string& field, RopeScaling* out,
                               double* rope_theta) {
  if (!j.is_object()) return field_error(field, "expected an object or null");
  const auto type_it = j.contains("rope_type") ? j.find("rope_type") : j.find("type");
  if (type_it == j.end()) return field_error(field + ".rope_type", "missing");
  if (!type_it->is_string()) return field_error(field + ".rope_type", "expected a string");
  out->rope_type = type_it->get<std::string>();
  const bool llama3 = out->rope_type == "llama3";
  if (out->rope_type != "default" && !llama3) {
    return field_error(field + ".rope_type",
                       absl::StrCat("'", out->rope_type,
                                    "' is not supported (expected \"default\" or \"llama3\")"));
  }
  for (const auto& [key, value] : j.items()) {
    const std::string name = absl::StrCat(field, ".", key);
    if (key == "rope_type" || key == "type") continue;
    if (key == "rope_theta") {
      if (!value.is_number()) return field_error(name, "expected a number");
      *rope_theta = value.get<double>();
      continue;
    }
    const bool llama3_key = key == "factor" || key == "low_freq_factor" ||
                            key == "high_freq_factor" || key == "original_max_position_embeddings";
    if (!llama3 || !llama3_key) {
      return field_error(name, absl::StrCat("not supported with rope_type '", out->rope_type, "'"));
    }
  }
  if (!llama3) return absl::OkStatus();
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (!j.contains(key)) return field_error(absl::StrCat(field, ".", key), "missing");
  }
  const std::string f = field + ".";
  if (!j["factor"].is_number()) return field_error(f + "factor", "expected a number");
  if (!j["low_freq_factor"].is_number()) {
    return field_error(f + "low_freq_factor", "expected a number");
  }
  if (!j["high_freq_factor"].is_number()) {
    return field_error(f + "high_freq_factor", "expected a number");
  }
  if (!j["original_max_position_embeddings"].is_number_integer()) {
    return field_error(f + "original_max_position_embeddings", "expected an integer");
  }
  out->factor = j["factor"].get<double>();
  out->low_freq_factor = j["low_freq_factor"].get<double>();
  out->high_freq_factor = j["high_freq_factor"].get<double>();
  out->original_max_position_embeddings = j["original_max_position_embeddings"].get<int64_t>();
  return validate_rope_scaling(*out, field);
}

// Keys of HF configs that change the decoder's math in ways we do not implement: refuse them
// unless they hold the value that means "off".
absl::Status check_unsupported(const Json& j) {
  auto truthy = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>());
  };
  for (const char* key : {"mlp_bias", "use_sliding_window"}) {
    if (truthy(key)) return field_error(key, "only false is supported");
  }
  if (auto it = j.find("attention_dropout"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return field_error("attention_dropout", "only 0 is supported (no dropout)");
    }
  }
  if (auto it = j.find("partial_rotary_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 1.0) {
      return field_error("partial_rotary_factor", "only 1 is supported (full rotary dims)");
    }
  }
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return field_error("layer_types", "expected a list");
    for (size_t i = 0; i < it->size(); ++i) {
      if ((*it)[i] != "full_attention") {
        return field_error(absl::StrCat("layer_types[", i, "]"),
                           "only \"full_attention\" is supported");
      }
    }
  }
  if (auto it = j.find("hidden_act"); it != j.end() && *it != "silu") {
    return field_error("hidden_act", "only \"silu\" is supported");
  }
  return absl::OkStatus();
}

bool moe_type(const std::string& t) { return t == "qwen3_moe" || t == "qwen2_moe"; }

// The mixture-of-experts keys of Qwen3MoeConfig / Qwen2MoeConfig (HF names and defaults, except
// that the sizes have no default: a checkpoint states them).
absl::Status read_moe(const Json& j, MoeConfig* m) {
  absl::Status s;
  if (!(s = read_int(j, "num_experts", true, &m->num_experts)).ok()) return s;
  if (!(s = read_int(j, "num_experts_per_tok", true, &m->num_experts_per_tok)).ok()) return s;
  if (!(s = read_int(j, "moe_intermediate_size", true, &m->moe_intermediate_size)).ok()) return s;
  if (!(s = read_bool(j, "norm_topk_prob", &m->norm_topk_prob)).ok()) return s;
  if (!(s = read_int(j, "decoder_sparse_step", false, &m->decoder_sparse_step)).ok()) return s;
  if (!(s = read_int(j, "shared_expert_intermediate_size", false,
                     &m->shared_expert_intermediate_size))
           .ok()) {
    return s;
  }
  if (!(s = read_double(j, "router_aux_loss_coef", &m->router_aux_loss_coef)).ok()) return s;
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return field_error("mlp_only_layers", "expected a list of integers");
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_number_integer()) {
        return field_error(absl::StrCat("mlp_only_layers[", i, "]"), "expected an integer");
      }
      m->mlp_only_layers.push_back((*it)[i].get<int64_t>());
    }
  }
  return absl::OkStatus();
}

absl::Status validate_moe(const ModelConfig& c) {
  const MoeConfig& m = c.moe;
  if (m.num_experts <= 0) return field_error("num_experts", "must be > 0");
  if (m.num_experts > 4096) return field_error("num_experts", "must be <= 4096");
  if (m.num_experts_per_tok <= 0 || m.num_experts_per_tok > m.num_experts) {
    return field_error("num_experts_per_tok",
                       absl::StrCat("must be in [1, num_experts = ", m.num_experts, "], got ",
                                    m.num_experts_per_tok));
  }
  if (m.moe_intermediate_size <= 0) return field_error("moe_intermediate_size", "must be > 0");
  if (m.decoder_sparse_step <= 0) return field_error("decoder_sparse_step", "must be >= 1");
  if (m.shared_expert_intermediate_size < 0) {
    return field_error("shared_expert_intermediate_size", "must be >= 0");
  }
  if (!(m.router_aux_loss_coef >= 0) || !std::isfinite(m.router_aux_loss_coef)) {
    return field_error("router_aux_loss_coef", "must be >= 0");
  }
  for (size_t i = 0; i < m.mlp_only_layers.size(); ++i) {
    if (m.mlp_only_layers[i] < 0 || m.mlp_only_layers[i] >= c.num_hidden_layers) {
      return field_error(absl::StrCat("mlp_only_layers[", i, "]"),
                         absl::StrCat("must be a layer index in [0, ", c.num_hidden_layers, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool ModelConfig::sparse_layer(int64_t l) const {
  if (!is_moe()) return false;
  for (int64_t d : moe.mlp_only_layers) {
    if (d == l) return false;
  }
  return (l + 1) % moe.decoder_sparse_step == 0;
}

int64_t ModelConfig::num_sparse_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += sparse_layer(l) ? 1 : 0;
  return n;
}

int64_t ModelConfig::sparse_index(int64_t l) const {
  if (!sparse_layer(l)) return -1;
  int64_t n = 0;
  for (int64_t i = 0; i < l; ++i) n += sparse_layer(i) ? 1 : 0;
  return n;
}

absl::Status validate_model_config(const ModelConfig& c) {
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" &&
      !moe_type(c.model_type)) {
    return field_error("model_type", absl::StrCat("unsupported '", c.model_type,
                                                  "' (expected \"llama\", \"qwen2\", \"qwen3\", "
                                                  "\"qwen3_moe\" or \"qwen2_moe\")"));
  }
  if (moe_type(c.model_type)) {
    if (auto s = validate_moe(c); !s.ok()) return s;
  } else if (c.is_moe()) {
    return field_error(
        "num_experts",
        absl::StrCat("experts need model_type qwen3_moe or qwen2_moe, not '", c.model_type, "'"));
  }
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [name, value] : positive) {
    if (value <= 0) return field_error(name, absl::StrCat("must be > 0, got ", value));
  }
  if (c.vocab_size > (int64_t{1} << 31) - 1) return field_error("vocab_size", "too large");
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return field_error("num_key_value_heads",
                       absl::StrCat("must divide num_attention_heads (", c.num_attention_heads,
                                    "), got ", c.num_key_value_heads));
  }
  if (c.head_dim % 2 != 0) return field_error("head_dim", "must be even (rotary embeddings)");
  if (!(c.rms_norm_eps > 0)) return field_error("rms_norm_eps", "must be > 0");
  if (!(c.rope_theta > 0)) return field_error("rope_theta", "must be > 0");
  if (c.bos_token_id >= c.vocab_size) return field_error("bos_token_id", "must be < vocab_size");
  if (c.eos_token_id >= c.vocab_size) return field_error("eos_token_id", "must be < vocab_size");
  return validate_rope_scaling(c.rope_scaling, "rope_scaling");
}

absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text) {
  auto parsed = parse_json_strict(json_text, "config.json");
  if (!parsed.ok()) return parsed.status();
  const Json& j = *parsed;
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: expected a JSON object");
  ModelConfig c;
  if (auto it = j.find("model_type"); it != j.end()) {
    if (!it->is_string()) return field_error("model_type", "expected a string");
    c.model_type = it->get<std::string>();
  }
  absl::Status s;
  if (!(s = read_int(j, "vocab_size", true, &c.vocab_size)).ok()) return s;
  if (!(s = read_int(j, "hidden_size", true, &c.hidden_size)).ok()) return s;
  if (!(s = read_int(j, "intermediate_size", true, &c.intermediate_size)).ok()) return s;
  if (!(s = read_int(j, "num_hidden_layers", true, &c.num_hidden_layers)).ok()) return s;
  if (!(s = read_int(j, "num_attention_heads", true, &c.num_attention_heads)).ok()) return s;
  c.num_key_value_heads = c.num_attention_heads;
  if (!(s = read_int(j, "num_key_value_heads", false, &c.num_key_value_heads)).ok()) return s;
  // HF defaults: Qwen3Config has head_dim 128; Llama and Qwen2 derive it.
  c.head_dim = c.model_type == "qwen3"     ? 128
               : c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads
                                           : 0;
  if (!(s = read_int(j, "head_dim", false, &c.head_dim)).ok()) return s;
  if (!(s = read_int(j, "max_position_embeddings", false, &c.max_position_embeddings)).ok()) {
    return s;
  }
  if (!(s = read_double(j, "rms_norm_eps", &c.rms_norm_eps)).ok()) return s;
  if (!(s = read_double(j, "rope_theta", &c.rope_theta)).ok()) return s;
  if (!(s = read_bool(j, "tie_word_embeddings", &c.tie_word_embeddings)).ok()) return s;
  c.attention_bias = c.model_type == "qwen2" || c.model_type == "qwen2_moe";
  if (!(s = read_bool(j, "attention_bias", &c.attention_bias)).ok()) return s;
  if (!(s = read_token_id(j, "bos_token_id", &c.bos_token_id)).ok()) return s;
  if (!(s = read_token_id(j, "eos_token_id", &c.eos_token_id)).ok()) return s;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      if (!(s = read_rope_scaling(*it, key, &c.rope_scaling, &c.rope_theta)).ok()) return s;
    }
  }
  if (moe_type(c.model_type)) {
    if (!(s = read_moe(j, &c.moe)).ok()) return s;
  }
  if (!(s = check_unsupported(j)).ok()) return s;
  if (auto st = validate_model_config(c); !st.ok()) return st;
  return c;
}

std::string model_config_to_json(const ModelConfig& c, bool fp8_block_quantization) {
  Json j;
  j["architectures"] = Json::array({c.model_type == "qwen2"       ? "Qwen2ForCausalLM"
                                    : c.model_type == "qwen3"     ? "Qwen3ForCausalLM"
                                    : c.model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                    : c.model_type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                                                                  : "LlamaForCausalLM"});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.llama3()) {
    const RopeScaling& r = c.rope_scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["hidden_act"] = "silu";
  if (c.is_moe()) {
    const MoeConfig& m = c.moe;
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
    if (c.model_type == "qwen2_moe" || m.shared_expert_intermediate_size > 0) {
      j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
    }
    j["router_aux_loss_coef"] = m.router_aux_loss_coef;
    j["output_router_logits"] = false;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = "float32";
  if (fp8_block_quantization) {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", Json::array({128, 128})}};
  }
  return j.dump(2) + "\n";
}

}  // namespace fp8rl::model
