// CpuDecoderOps: kernels/cpu and model/linear.h behind decoder_step's ops.
#include "engine/cpu/decoder_ops.h"

#include <cmath>

#include "kernels/cpu/decoder_ops.h"
#include "kernels/formats.h"
#include "model/linear.h"

namespace fp8rl::engine {
namespace dm = kernels::dm;

CpuDecoderOps::CpuDecoderOps(const model::Model& model, int64_t num_blocks, int64_t block_tokens)
    : model_(model), num_blocks_(num_blocks), block_tokens_(block_tokens) {
  const model::KvCacheDtype d = model.policy().kv_cache;
  elem_ = d == model::KvCacheDtype::kF32 ? 4 : d == model::KvCacheDtype::kBF16 ? 2 : 1;
  const int64_t bytes = num_blocks * block_tokens * model.config().kv_dim() * elem_;
  k_pool_.assign(model.config().num_hidden_layers, std::vector<uint8_t>(bytes));
  v_pool_.assign(model.config().num_hidden_layers, std::vector<uint8_t>(bytes));
}

dm::PagedKvView CpuDecoderOps::view(int64_t layer) {
  const model::ModelConfig& c = model_.config();
  const model::KvCacheDtype d = model_.policy().kv_cache;
  dm::PagedKvView kv;
  kv.k_pool = k_pool_[layer].data();
  kv.v_pool = v_pool_[layer].data();
  kv.dtype = d == model::KvCacheDtype::kF32    ? dm::KvDtype::kF32
             : d == model::KvCacheDtype::kBF16 ? dm::KvDtype::kBF16
                                               : dm::KvDtype::kFP8;
  kv.num_blocks = num_blocks_;
  kv.block_size = block_tokens_;
  kv.n_kv = c.num_key_value_heads;
  kv.head_dim = c.head_dim;
  kv.block_table = t_->block_table.data();
  kv.max_blocks = t_->width;
  kv.k_scale = model_.kv_scales().k[layer];
  kv.v_scale = model_.kv_scales().v[layer];
  return kv;
}

absl::Status CpuDecoderOps::load_tables(const StepTables& t) {
  for (int32_t b : t.block_table) {
    if (b < 0 || b >= num_blocks_) return absl::InvalidArgumentError("block id out of the pool");
  }
  t_ = &t;
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::embed(int64_t rows, float* x) {
  const model::ModelConfig& c = model_.config();
  const model::LinearWeight& e = model_.embedding_weight();
  if (e.precision != model::Precision::kF32 && e.bf16.empty()) {
    // An inference-only model's tied table, held once in double (Model::embed).
    kernels::cpu::embed_gather(e.exact.data(), c.vocab_size, c.hidden_size, t_->tokens.data(), rows,
                               x);
    return absl::OkStatus();
  }
  kernels::cpu::embed_gather(model_.embedding_weight().dense(), c.vocab_size, c.hidden_size,
                             t_->tokens.data(), rows, x);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::rmsnorm(const float* x, const float* g, int64_t rows, int64_t h,
                                    bool rb, float* y) {
  kernels::cpu::rmsnorm(x, g, rows, h, static_cast<float>(model_.config().rms_norm_eps), rb, y,
                        nullptr);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::rope(int64_t rows, int64_t heads, bool rb, float* x) {
  kernels::cpu::rope(model_.rope_cos().data(), model_.rope_sin().data(), t_->pos.data(), rows,
                     heads, model_.config().head_dim, rb, x);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::linear(int64_t layer, int64_t j, const float* x, int64_t rows,
                                   const float* bias, float* y) {
  const model::LinearWeight& w =
      layer < 0 ? model_.lm_head_weight() : model_.layer_linear(layer, j);
  return model::linear_forward(w, x, rows, bias, y);
}

absl::Status CpuDecoderOps::attention(int64_t layer, const float* q, const float* k, const float* v,
                                      int64_t rows, float* o) {
  const dm::PagedKvView kv = view(layer);
  kernels::cpu::kv_write_paged(k, v, rows, t_->row_seq.data(), t_->pos.data(), kv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(model_.config().head_dim));
  kernels::cpu::attention_paged(q, rows, t_->row_seq.data(), t_->pos.data(), kv,
                                model_.config().num_attention_heads, scale, o);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) {
  kernels::cpu::swiglu(g, u, n, rb, act);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::add(float* y, const float* x, int64_t n, bool rb) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] += x[i];
    if (rb) y[i] = kernels::round_bf16(y[i]);
  }
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::round_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = kernels::round_bf16(x[i]);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::gather_out_rows(const float* x, int64_t h, int64_t n_out, float* out) {
  for (int64_t i = 0; i < n_out; ++i) {
    const float* src = x + static_cast<int64_t>(t_->out_rows[i]) * h;
    std::copy(src, src + h, out + i * h);
  }
  return absl::OkStatus();
}

std::vector<float> linear_values(const model::LinearWeight& w) {
  if (w.precision == model::Precision::kFP8) return {};
  const int64_t n = w.out * w.in;
  const bool has_dense = w.precision == model::Precision::kF32
                             ? w.master != nullptr
                             : static_cast<int64_t>(w.bf16.size()) == n;
  if (has_dense) return std::vector<float>(w.dense(), w.dense() + n);
  std::vector<float> v(n);
  if (static_cast<int64_t>(w.exact.size()) == n) {
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(w.exact[i]);  // exact: fp32 values
  }
  return v;
}

CpuStepBuffers::CpuStepBuffers(const model::ModelConfig& c, int64_t rows) {
  const int64_t r = padded_rows(rows);
  for (auto* p : {&x, &h1, &x2, &h2, &sel}) p->assign(r * c.hidden_size, 0.0f);
  for (auto* p : {&q, &qn, &o}) p->assign(r * c.q_dim(), 0.0f);
  for (auto* p : {&k, &kn, &v}) p->assign(r * c.kv_dim(), 0.0f);
  for (auto* p : {&g, &u, &act}) p->assign(r * c.intermediate_size, 0.0f);
}

StepBuffers CpuStepBuffers::view() {
  return {x.data(), h1.data(), q.data(),  qn.data(), k.data(), kn.data(),  v.data(),
          o.data(), x2.data(), h2.data(), g.data(),  u.data(), act.data(), sel.data()};
}

}  // namespace fp8rl::engine
