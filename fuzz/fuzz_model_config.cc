// Fuzz target: a Hugging Face config.json (from a checkpoint folder or a job's inline
// model.init.config) through parse_model_config. An accepted config must be valid and survive
// model_config_to_json and a second parse unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/config.h"

namespace {

bool same(const fp8rl::model::ModelConfig& a, const fp8rl::model::ModelConfig& b) {
  return a.model_type == b.model_type && a.vocab_size == b.vocab_size &&
         a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.rope_scaling.rope_type == b.rope_scaling.rope_type &&
         a.rope_scaling.factor == b.rope_scaling.factor &&
         a.rope_scaling.low_freq_factor == b.rope_scaling.low_freq_factor &&
         a.rope_scaling.high_freq_factor == b.rope_scaling.high_freq_factor &&
         a.rope_scaling.original_max_position_embeddings ==
             b.rope_scaling.original_max_position_embeddings &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.attention_bias == b.attention_bias &&
         a.bos_token_id == b.bos_token_id && a.eos_token_id == b.eos_token_id;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fp8rl::model::ModelConfig> config = fp8rl::model::parse_model_config(text);
  if (!config.ok()) return 0;
  if (!fp8rl::model::validate_model_config(*config).ok()) __builtin_trap();
  absl::StatusOr<fp8rl::model::ModelConfig> again =
      fp8rl::model::parse_model_config(fp8rl::model::model_config_to_json(*config));
  if (!again.ok() || !same(*again, *config)) __builtin_trap();
  return 0;
}
