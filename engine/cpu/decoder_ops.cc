// CpuDecoderOps: kernels/cpu and model/linear.h behind decoder_step's ops.
#include "engine/cpu/decoder_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/parallel.h"
#include "kernels/cpu/decoder_ops.h"
#include "kernels/formats.h"
#include "model/linear.h"
#include "model/ops.h"

namespace fp8rl::engine {
namespace dm = kernels::dm;

CpuDecoderOps::CpuDecoderOps(const model::Model& model, int64_t num_blocks, int64_t block_tokens)
    : model_(&model), num_blocks_(num_blocks), block_tokens_(block_tokens) {
  const model::KvCacheDtype d = model.policy().kv_cache;
  elem_ = d == model::KvCacheDtype::kF32 ? 4 : d == model::KvCacheDtype::kBF16 ? 2 : 1;
  const int64_t bytes = num_blocks * block_tokens * model.config().kv_dim() * elem_;
  k_pool_.assign(model.config().num_hidden_layers, std::vector<uint8_t>(bytes));
  v_pool_.assign(model.config().num_hidden_layers, std::vector<uint8_t>(bytes));
}

void CpuDecoderOps::grow_pool(int64_t num_blocks) {
  if (num_blocks <= num_blocks_) return;
  const int64_t bytes = num_blocks * block_tokens_ * model_->config().kv_dim() * elem_;
  for (auto* pools : {&k_pool_, &v_pool_}) {
    for (std::vector<uint8_t>& p : *pools) p.resize(bytes);
  }
  num_blocks_ = num_blocks;
}

dm::PagedKvView CpuDecoderOps::view(int64_t layer) {
  const model::ModelConfig& c = model_->config();
  const model::KvCacheDtype d = model_->policy().kv_cache;
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
  kv.k_scale = model_->kv_scales().k[layer];
  kv.v_scale = model_->kv_scales().v[layer];
  return kv;
}

absl::Status CpuDecoderOps::load_tables(const StepTables& t) {
  for (int32_t b : t.block_table) {
    if (b < 0 || b >= num_blocks_) return absl::InvalidArgumentError("block id out of the pool");
  }
  for (const std::vector<int32_t>* v : {&t.tokens, &t.pos, &t.row_seq}) {
    if (static_cast<int64_t>(v->size()) != t.rows) {
      return absl::InvalidArgumentError("tables: tokens, pos and row_seq need one entry per row");
    }
  }
  // Rows of each segment in row order (CSR), and each segment's longest context (max pos + 1).
  seg_start_.assign(t.n_seg + 1, 0);
  seg_len_.assign(t.n_seg, 0);
  for (int64_t r = 0; r < t.rows; ++r) {
    const int32_t s = t.row_seq[r];
    if (s < 0 || s >= t.n_seg) return absl::InvalidArgumentError("row_seq out of the segments");
    ++seg_start_[s + 1];
    seg_len_[s] = std::max<int64_t>(seg_len_[s], int64_t{t.pos[r]} + 1);
  }
  for (int64_t s = 0; s < t.n_seg; ++s) seg_start_[s + 1] += seg_start_[s];
  seg_rows_.resize(t.rows);
  std::vector<int64_t> next(seg_start_.begin(), seg_start_.end() - 1);
  for (int64_t r = 0; r < t.rows; ++r) seg_rows_[next[t.row_seq[r]]++] = static_cast<int32_t>(r);
  t_ = &t;
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::embed(int64_t rows, float* x) {
  const model::ModelConfig& c = model_->config();
  const model::LinearWeight& e = model_->embedding_weight();
  if (e.precision != model::Precision::kF32 && e.bf16.empty()) {
    // An inference-only model's tied table, held once in double (Model::embed).
    kernels::cpu::embed_gather(e.exact.data(), c.vocab_size, c.hidden_size, t_->tokens.data(), rows,
                               x);
    return absl::OkStatus();
  }
  kernels::cpu::embed_gather(model_->embedding_weight().dense(), c.vocab_size, c.hidden_size,
                             t_->tokens.data(), rows, x);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::rmsnorm(const float* x, const float* g, int64_t rows, int64_t h,
                                    bool rb, float* y) {
  kernels::cpu::rmsnorm(x, g, rows, h, static_cast<float>(model_->config().rms_norm_eps), rb, y,
                        nullptr);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::rope(int64_t rows, int64_t heads, bool rb, float* x) {
  kernels::cpu::rope(model_->rope_cos().data(), model_->rope_sin().data(), t_->pos.data(), rows,
                     heads, model_->config().head_dim, rb, x);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::linear(int64_t layer, int64_t j, const float* x, int64_t rows,
                                   const float* bias, float* y) {
  const model::LinearWeight& w =
      layer < 0 ? model_->lm_head_weight() : model_->layer_linear(layer, j);
  return model::linear_forward(w, x, rows, bias, y);
}

namespace {

// out[len, hd] = the cached keys (or values) of sequence s, kv head g, positions [0, len) of one
// pool, dequantized (dm::kv_load: the value every attention path reads for that element).
void gather_kv_head(const dm::PagedKvView& kv, const void* pool, float scale, int64_t s, int64_t g,
                    int64_t len, float* out) {
  const int64_t hd = kv.head_dim;
  for (int64_t j = 0; j < len; ++j) {
    const void* row = dm::kv_elem_ptr(pool, kv.dtype, dm::paged_kv_offset(kv, s, j, g));
    float* dst = out + j * hd;
    if (kv.dtype == dm::KvDtype::kF32) {
      std::memcpy(dst, row, hd * sizeof(float));
    } else {
      for (int64_t d = 0; d < hd; ++d) dst[d] = dm::kv_load(row, d, kv.dtype, scale);
    }
  }
}

}  // namespace

// Same values as kernels::cpu::attention_paged (attend_row over the dequantized cache, row by
// row, head by head), organised for speed: each cached element is
// dequantized once per (sequence, KV head) into a buffer the KV head's query heads share, and the
// (sequence, KV head) pairs are split over the thread pool. Each pair writes only its own heads'
// columns of its own rows, so the bytes do not depend on the thread count.
absl::Status CpuDecoderOps::attention(int64_t layer, const float* q, const float* k, const float* v,
                                      int64_t rows, float* o) {
  const dm::PagedKvView kv = view(layer);
  kernels::cpu::kv_write_paged(k, v, rows, t_->row_seq.data(), t_->pos.data(), kv);
  const model::ModelConfig& c = model_->config();
  const int64_t hd = c.head_dim, qd = c.q_dim(), n_kv = c.num_key_value_heads,
                group = c.num_attention_heads / n_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  parallel_for(t_->n_seg * n_kv, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> kbuf, vbuf, scores;
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = i / n_kv, g = i % n_kv, len = seg_len_[s];
      if (len == 0) continue;  // a segment without rows in this step
      if (static_cast<int64_t>(kbuf.size()) < len * hd) {
        kbuf.resize(len * hd);
        vbuf.resize(len * hd);
      }
      if (static_cast<int64_t>(scores.size()) < len) scores.resize(len);
      gather_kv_head(kv, kv.k_pool, kv.k_scale, s, g, len, kbuf.data());
      gather_kv_head(kv, kv.v_pool, kv.v_scale, s, g, len, vbuf.data());
      for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
        for (int64_t j = seg_start_[s]; j < seg_start_[s + 1]; ++j) {
          const int64_t r = seg_rows_[j], off = r * qd + hh * hd;
          model::ops::attend_row(q + off, kbuf.data(), hd, vbuf.data(), hd, int64_t{t_->pos[r]} + 1,
                                 hd, scale, scores.data(), o + off);
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) {
  kernels::cpu::swiglu(g, u, n, rb, act);
  return absl::OkStatus();
}

absl::Status CpuDecoderOps::moe(int64_t layer, const float* x, int64_t rows, float* y,
                                int32_t* sel) {
  if (!model_->config().sparse_layer(layer)) {
    return absl::InvalidArgumentError(absl::StrCat("moe: layer ", layer, " is dense"));
  }
  if (auto s = model::moe_forward(model_->moe_layer(layer), model_->moe_options(), x, rows, nullptr,
                                  &moe_act_, y);
      !s.ok()) {
    return s;
  }
  if (sel != nullptr) std::copy(moe_act_.sel.begin(), moe_act_.sel.end(), sel);
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
  routing.assign(c.num_sparse_layers() * r * c.moe.num_experts_per_tok, 0);
}

StepBuffers CpuStepBuffers::view() {
  StepBuffers b{x.data(), h1.data(), q.data(),  qn.data(), k.data(), kn.data(),  v.data(),
                o.data(), x2.data(), h2.data(), g.data(),  u.data(), act.data(), sel.data()};
  b.routing = routing.empty() ? nullptr : routing.data();
  return b;
}

}  // namespace fp8rl::engine
