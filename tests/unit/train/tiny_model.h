// The tiny Llama config the train/ tests build their learners from (random init, 2 layers).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace fp8rl::train::test_model {

inline constexpr int64_t kVocab = 48;

inline model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  return c;
}

}  // namespace fp8rl::train::test_model
