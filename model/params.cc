// The HF parameter naming of Llama/Qwen2/Qwen3 (and Qwen3-MoE/Qwen2-MoE) decoders mapped onto one
// flat buffer.
#include "model/params.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::model {

int64_t ParamLayout::add(std::string name, std::vector<int64_t> shape, ParamKind kind,
                         int64_t layer) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  ParamInfo info{std::move(name), std::move(shape), total_, numel, kind, layer};
  params_.push_back(std::move(info));
  total_ += numel;
  return params_.back().offset;
}

ParamLayout::ParamLayout(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  embed_ = add("model.embed_tokens.weight", {c.vocab_size, h}, ParamKind::kEmbedding, -1);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerOffsets l{};
    l.input_norm = add(p + "input_layernorm.weight", {h}, ParamKind::kNorm, i);
    l.q = add(p + "self_attn.q_proj.weight", {q, h}, ParamKind::kLinear, i);
    l.k = add(p + "self_attn.k_proj.weight", {kv, h}, ParamKind::kLinear, i);
    l.v = add(p + "self_attn.v_proj.weight", {kv, h}, ParamKind::kLinear, i);
    l.q_bias = l.k_bias = l.v_bias = -1;
    if (c.attention_bias) {
      l.q_bias = add(p + "self_attn.q_proj.bias", {q}, ParamKind::kBias, i);
      l.k_bias = add(p + "self_attn.k_proj.bias", {kv}, ParamKind::kBias, i);
      l.v_bias = add(p + "self_attn.v_proj.bias", {kv}, ParamKind::kBias, i);
    }
    l.o = add(p + "self_attn.o_proj.weight", {h, q}, ParamKind::kLinear, i);
    l.q_norm = l.k_norm = -1;
    if (c.qk_norm()) {
      l.q_norm = add(p + "self_attn.q_norm.weight", {c.head_dim}, ParamKind::kNorm, i);
      l.k_norm = add(p + "self_attn.k_norm.weight", {c.head_dim}, ParamKind::kNorm, i);
    }
    l.post_norm = add(p + "post_attention_layernorm.weight", {h}, ParamKind::kNorm, i);
    if (!c.sparse_layer(i)) {
      l.gate = add(p + "mlp.gate_proj.weight", {f, h}, ParamKind::kLinear, i);
      l.up = add(p + "mlp.up_proj.weight", {f, h}, ParamKind::kLinear, i);
      l.down = add(p + "mlp.down_proj.weight", {h, f}, ParamKind::kLinear, i);
    } else {
      // HF Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock naming.
      const int64_t e_count = c.moe.num_experts, fe = c.moe.moe_intermediate_size,
                    fs = c.moe.shared_expert_intermediate_size;
      l.gate = l.up = l.down = -1;
      l.router = add(p + "mlp.gate.weight", {e_count, h}, ParamKind::kRouter, i);
      for (int64_t e = 0; e < e_count; ++e) {
        const std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
        l.expert_gate.push_back(add(x + "gate_proj.weight", {fe, h}, ParamKind::kLinear, i));
        l.expert_up.push_back(add(x + "up_proj.weight", {fe, h}, ParamKind::kLinear, i));
        l.expert_down.push_back(add(x + "down_proj.weight", {h, fe}, ParamKind::kLinear, i));
      }
      if (fs > 0) {
        l.shared_gate =
            add(p + "mlp.shared_expert.gate_proj.weight", {fs, h}, ParamKind::kLinear, i);
        l.shared_up = add(p + "mlp.shared_expert.up_proj.weight", {fs, h}, ParamKind::kLinear, i);
        l.shared_down =
            add(p + "mlp.shared_expert.down_proj.weight", {h, fs}, ParamKind::kLinear, i);
        l.shared_expert_gate =
            add(p + "mlp.shared_expert_gate.weight", {1, h}, ParamKind::kRouter, i);
      }
    }
    layers_.push_back(l);
  }
  final_norm_ = add("model.norm.weight", {h}, ParamKind::kNorm, -1);
  lm_head_ = c.tie_word_embeddings
                 ? embed_
                 : add("lm_head.weight", {c.vocab_size, h}, ParamKind::kLmHead, -1);
}

int64_t ParamLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace fp8rl::model
