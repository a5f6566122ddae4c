// Shared helpers of the model tests: small configs, random non-zero parameters, temp folders,
// running the PyTorch oracle, and the named tolerances the tests compare with.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "model/rng.h"

namespace fp8rl::model::testing {

// fp32 engine vs the float64 PyTorch oracle (relative to the tensor's max |value|). Where they
// come from: every fp32 op rounds with unit roundoff u = 2^-24 = 6e-8; a length-K dot product
// (K <= 112 here, 8-lane or BLAS blocked sums) adds about sqrt(K) u = 6e-7 relative to the sum of
// |terms|, and a logit passes ~15 such roundings per layer (norm, 3+1 projections, RoPE, softmax,
// attention sum, MLP 3 GEMMs, residual adds) over 2 layers plus the final norm and lm_head: a
// random-walk sum of ~35 steps of <= 6e-7 gives ~4e-6, times cancellation in the residual stream
// (max |logit| is the scale, not each entry) of at most ~2: 1e-5. The RoPE tables are fp32
// (sin/cos of a double angle, inv_freq as HF's fp32 value; the llama3 rescaling rounds once more
// to fp32: an angle error <= pos * inv_freq * 2^-24 <= 1e-6 rad at the test lengths). Gradients
// go through the same chain twice (forward recomputation and the transposed backward), hence 2x.
// Measured (model_golden_test, 7 configs): logits <= 6.5e-7, gradients <= 1.7e-6, 12-15x below
// the bars; the bars stay at the estimate so a change of summation order cannot flake them.
inline constexpr double kLogitRelTol = 1e-5;
inline constexpr double kGradRelTol = 2e-5;
// bf16 / fp8 backward vs the fp32 backward on the same master weights, calc_diff per parameter
// tensor (model_arch_test, Qwen3 and Llama 3.1 configs at hidden 160). These bars compare the
// whole chain of roundings, not one op: bf16 rounds every activation (2^-9 relative), measured
// worst 6.2e-4; the FP8 recipe quantizes both operands of every GEMM to E4M3 (2^-4 relative per
// element, ~6e-4 calc_diff per GEMM, kernels/tolerances.h) through 2 layers forward and backward,
// measured 1-2.5e-2 for most tensors and 6.0e-2 worst (layer 1 k_proj, whose gradient is the
// smallest). A missing or wrong term of a backward gives calc_diff ~1 (2 for a sign error).
inline constexpr double kBf16GradMaxCalcDiff = 2e-3;
inline constexpr double kFp8GradMaxCalcDiff = 1e-1;
// Mixture-of-experts bf16 backward (moe_test): an expert's weight gradient sums over only the few
// tokens routed to it (2-8 of 20 rows here, vs all 20 for a dense MLP), so its bf16 roundings
// average out less, and the mixing weights are rounded to bf16 too (as HF casts them); measured
// worst 2.35e-3 (an expert gate_proj), the other tensors within kBf16GradMaxCalcDiff.
inline constexpr double kMoeBf16GradMaxCalcDiff = 5e-3;
// Consistency of generation and training logprobs (issue 3).
inline constexpr double kConsistencyMaxAbsTol = 1e-4;   // fp32 / bf16: max |d|
inline constexpr double kConsistencyMeanAbsTol = 1e-5;  // fp8: mean |d|

inline ModelConfig make_config(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers,
                               int64_t heads, int64_t kv_heads, bool tied, bool qwen2 = false) {
  ModelConfig c;
  c.model_type = qwen2 ? "qwen2" : "llama";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = qwen2 ? 1000000.0 : 10000.0;
  c.tie_word_embeddings = tied;
  c.attention_bias = qwen2;
  return c;
}

// Qwen3: per-head q/k RMSNorm, explicit head_dim (may differ from hidden / heads), no q/k/v bias.
inline ModelConfig make_qwen3_config(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim, bool tied) {
  ModelConfig c = make_config(vocab, hidden, inter, layers, heads, kv_heads, tied, true);
  c.model_type = "qwen3";
  c.head_dim = head_dim;
  c.attention_bias = false;
  return c;
}

// Qwen3-MoE (q/k norm, no bias): E experts of width `moe_inter`, top-k; dense layers (when
// decoder_sparse_step / mlp_only_layers make some) use `inter`.
inline ModelConfig make_qwen3_moe_config(int64_t vocab, int64_t hidden, int64_t inter,
                                         int64_t layers, int64_t heads, int64_t kv_heads,
                                         int64_t head_dim, bool tied, int64_t experts,
                                         int64_t top_k, int64_t moe_inter, bool norm_topk) {
  ModelConfig c = make_qwen3_config(vocab, hidden, inter, layers, heads, kv_heads, head_dim, tied);
  c.model_type = "qwen3_moe";
  c.moe.num_experts = experts;
  c.moe.num_experts_per_tok = top_k;
  c.moe.moe_intermediate_size = moe_inter;
  c.moe.norm_topk_prob = norm_topk;
  return c;
}

// Qwen2-MoE: q/k/v bias, no q/k norm, a shared expert of width `shared_inter` with its gate.
inline ModelConfig make_qwen2_moe_config(int64_t vocab, int64_t hidden, int64_t inter,
                                         int64_t layers, int64_t heads, int64_t kv_heads, bool tied,
                                         int64_t experts, int64_t top_k, int64_t moe_inter,
                                         int64_t shared_inter) {
  ModelConfig c = make_config(vocab, hidden, inter, layers, heads, kv_heads, tied, true);
  c.model_type = "qwen2_moe";
  c.moe.num_experts = experts;
  c.moe.num_experts_per_tok = top_k;
  c.moe.moe_intermediate_size = moe_inter;
  c.moe.shared_expert_intermediate_size = shared_inter;
  return c;
}

// Llama 3.1 rope scaling on `c`. With head_dim 16, theta 1e4, original 256, low 1, high 8 the 8
// frequencies split 2 high (kept) / 2 medium (smoothed) / 4 low (divided by factor).
inline ModelConfig with_llama3_rope(ModelConfig c, double factor = 8.0, double low = 1.0,
                                    double high = 8.0, int64_t original = 256) {
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = factor;
  c.rope_scaling.low_freq_factor = low;
  c.rope_scaling.high_freq_factor = high;
  c.rope_scaling.original_max_position_embeddings = original;
  return c;
}

// Random non-zero parameters with O(1) activations: weights N(0, std), norms 1 + N(0, 0.1),
// biases N(0, 0.05).
inline void randomize(Model& m, uint64_t seed, double std = 0.08) {
  Rng rng(seed);
  auto p = m.params();
  for (const ParamInfo& info : m.layout().params()) {
    for (int64_t i = 0; i < info.numel; ++i) {
      const double n = rng.normal();
      float& w = p[info.offset + i];
      switch (info.kind) {
        case ParamKind::kNorm:
          w = static_cast<float>(1.0 + 0.1 * n);
          break;
        case ParamKind::kBias:
          w = static_cast<float>(0.05 * n);
          break;
        case ParamKind::kRouter:
          // Routers get logits of O(1) so that the top-k choices are well separated.
          w = static_cast<float>(0.3 * n);
          break;
        default:
          w = static_cast<float>(std * n);
      }
    }
  }
  m.refresh();
}

inline std::vector<int32_t> random_tokens(Rng& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
  return t;
}

// A fresh temporary folder removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fp8rl_model_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string source_dir() {
  const char* s = std::getenv("FP8RL_SOURCE_DIR");
  return s ? s : FP8RL_TEST_SOURCE_DIR;
}

inline double max_abs(const float* x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

inline double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace fp8rl::model::testing
