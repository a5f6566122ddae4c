// The decoder's shape and hyper-parameters, read from and written to a Hugging Face config.json
// (LlamaForCausalLM / Qwen2ForCausalLM spelling), so checkpoints move between fp8rl and HF tools.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace fp8rl::model {

struct ModelConfig {
  std::string model_type = "llama";  // "llama" or "qwen2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA: divides num_attention_heads
  int64_t head_dim = 0;             // hidden_size / num_attention_heads unless given
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (always true for qwen2)
  int64_t bos_token_id = -1;    // -1: none
  int64_t eos_token_id = -1;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Parses config.json text. Errors name the field ("config.json: hidden_size: must be > 0").
// A "quantization_config" entry is accepted (FP8 block checkpoints) and otherwise ignored here.
absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text);

// Checks the invariants (sizes positive, heads divide, even head_dim, ...).
absl::Status validate_model_config(const ModelConfig& config);

// HF-style config.json text. With fp8_block_quantization, adds the quantization_config of the
// FP8 checkpoint format (docs/design.md "FP8 checkpoint format").
std::string model_config_to_json(const ModelConfig& config, bool fp8_block_quantization = false);

}  // namespace fp8rl::model
