// Where every parameter lives: one flat fp32 buffer in a fixed order with HF tensor names, so the
// optimizer, gradient clipping and checkpoint I/O treat all parameters the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace fp8rl::model {

// kRouter: a mixture-of-experts router (mlp.gate) or qwen2_moe's shared_expert_gate, a [out, H]
// matrix that stays bf16 (fp32 in an fp32 policy) and is never quantized to FP8
// (docs/design/model.md "Mixture of experts").
enum class ParamKind { kEmbedding, kLinear, kBias, kNorm, kLmHead, kRouter };

struct ParamInfo {
  std::string name;            // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // [out, in] for linears
  int64_t offset = 0;          // into the flat buffer
  int64_t numel = 0;
  ParamKind kind = ParamKind::kLinear;
  int64_t layer = -1;  // decoder layer, -1 for embedding / final norm / lm_head
};

// Offsets of one decoder layer's parameters (bias offsets are -1 without attention_bias,
// q_norm / k_norm offsets -1 without qk_norm).
// Sparse (mixture-of-experts) layers have gate = up = down = -1 and the router/expert offsets
// set; dense layers have router = -1 and no experts.
struct LayerOffsets {
  int64_t input_norm, q, k, v, o, q_bias, k_bias, v_bias, q_norm, k_norm, post_norm, gate, up, down;
  int64_t router = -1;  // mlp.gate.weight [E, H]
  // mlp.experts.{e}.{gate,up,down}_proj.weight: [F_moe, H], [F_moe, H], [H, F_moe]; E each.
  std::vector<int64_t> expert_gate, expert_up, expert_down;
  // qwen2_moe shared expert: mlp.shared_expert.{gate,up,down}_proj.weight and
  // mlp.shared_expert_gate.weight [1, H]; -1 without one.
  int64_t shared_gate = -1, shared_up = -1, shared_down = -1, shared_expert_gate = -1;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config);

  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }
  const LayerOffsets& layer(int64_t i) const { return layers_[i]; }
  int64_t embed() const { return embed_; }
  int64_t final_norm() const { return final_norm_; }
  // The lm_head weight: the embedding when tied.
  int64_t lm_head() const { return lm_head_; }
  // Index into params() by name, -1 if unknown.
  int64_t find(const std::string& name) const;

 private:
  int64_t add(std::string name, std::vector<int64_t> shape, ParamKind kind, int64_t layer);
  std::vector<ParamInfo> params_;
  std::vector<LayerOffsets> layers_;
  int64_t total_ = 0, embed_ = 0, final_norm_ = 0, lm_head_ = 0;
};

}  // namespace fp8rl::model
