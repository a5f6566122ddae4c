// The decoder's shape and hyper-parameters, read from and written to a Hugging Face config.json
// (LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM spelling), so checkpoints move between
// fp8rl and HF tools.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::model {

// Rotary frequency scaling, HF "rope_scaling" (or "rope_parameters"). "default": plain
// theta^(-2i/d) frequencies; "llama3": Llama 3.1's piecewise rescaling of the low and medium
// frequencies (docs/design/model.md "Architectures").
struct RopeScaling {
  std::string rope_type = "default";  // "default" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;

  bool llama3() const { return rope_type == "llama3"; }
};

// Mixture-of-experts MLP of qwen3_moe / qwen2_moe checkpoints (docs/design/model.md "Mixture of
// experts"). num_experts == 0: every layer is a dense MLP.
struct MoeConfig {
  int64_t num_experts = 0;               // E
  int64_t num_experts_per_tok = 0;       // top-k
  int64_t moe_intermediate_size = 0;     // each expert's SwiGLU width
  bool norm_topk_prob = false;           // renormalize the k kept router probabilities to sum 1
  int64_t decoder_sparse_step = 1;       // layer l is sparse when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and l is not listed here
  // qwen2_moe: a dense SwiGLU of this width added to every sparse layer, gated by
  // sigmoid(shared_expert_gate . x); 0: none (qwen3_moe).
  int64_t shared_expert_intermediate_size = 0;
  double router_aux_loss_coef = 0.0;  // carried through config.json; the job option decides
};

struct ModelConfig {
  // "llama", "qwen2", "qwen3", or the mixture-of-experts "qwen3_moe" / "qwen2_moe"
  std::string model_type = "llama";
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
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (always true for qwen2)
  int64_t bos_token_id = -1;    // -1: none
  int64_t eos_token_id = -1;
  MoeConfig moe;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // Qwen3: per-head RMSNorm (weights q_norm / k_norm [head_dim]) on q and k before RoPE.
  bool qk_norm() const { return model_type == "qwen3" || model_type == "qwen3_moe"; }
  bool is_moe() const { return moe.num_experts > 0; }
  // Layer l runs the experts (HF Qwen3MoeDecoderLayer's rule); false for every layer of a dense
  // model.
  bool sparse_layer(int64_t l) const;
  // Number of sparse layers, and the index of layer l among them (-1 for a dense layer).
  int64_t num_sparse_layers() const;
  int64_t sparse_index(int64_t l) const;
};

// Parses config.json text. Errors name the field ("config.json: hidden_size: must be > 0").
// A "quantization_config" entry is accepted (FP8 block checkpoints) and otherwise ignored here.
// Keys that would change the math and are not implemented (another rope_type, mlp_bias,
// use_sliding_window, attention_dropout > 0, ...) are errors naming the key, never ignored.
// Defaults follow the HF config classes (qwen3: head_dim 128, no q/k/v bias).
absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text);

// Checks the invariants (sizes positive, heads divide, even head_dim, ...).
absl::Status validate_model_config(const ModelConfig& config);

// HF-style config.json text. With fp8_block_quantization, adds the quantization_config of the
// FP8 checkpoint format (docs/design/fp8-recipe.md "FP8 checkpoint format").
std::string model_config_to_json(const ModelConfig& config, bool fp8_block_quantization = false);

}  // namespace fp8rl::model
