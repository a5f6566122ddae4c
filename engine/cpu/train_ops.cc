// CpuTrainOps: kernels/cpu and model/linear.h behind the training step's ops.
#include "engine/cpu/train_ops.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/decoder_ops.h"
#include "kernels/cpu/train_ops.h"
#include "kernels/formats.h"
#include "model/gradient_sink.h"
#include "model/linear.h"
#include "model/moe.h"

namespace fp8rl::engine {
namespace {

kernels::dm::KvDtype kv_dtype(model::KvCacheDtype d) {
  return d == model::KvCacheDtype::kF32    ? kernels::dm::KvDtype::kF32
         : d == model::KvCacheDtype::kBF16 ? kernels::dm::KvDtype::kBF16
                                           : kernels::dm::KvDtype::kFP8;
}

}  // namespace

const model::LinearWeight& CpuTrainOps::weight(int64_t layer, int64_t j) const {
  return layer < 0 ? model_.lm_head_weight() : model_.layer_linear(layer, j);
}

absl::Status CpuTrainOps::load_tables(const TrainTables& t) {
  t_ = &t;
  return absl::OkStatus();
}

absl::Status CpuTrainOps::embed(float* x) {
  const model::ModelConfig& c = model_.config();
  const model::LinearWeight& e = model_.embedding_weight();
  if (e.precision != model::Precision::kF32 && e.bf16.empty()) {
    // An inference-only model's tied table, held once in double (bf16 values: exact in float).
    kernels::cpu::embed_gather(e.exact.data(), c.vocab_size, c.hidden_size, t_->tokens.data(),
                               t_->rows, x);
    return absl::OkStatus();
  }
  kernels::cpu::embed_gather(e.dense(), c.vocab_size, c.hidden_size, t_->tokens.data(), t_->rows,
                             x);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, bool rb,
                                  float* y, float* inv) {
  kernels::cpu::rmsnorm(x, g, rows, h, static_cast<float>(model_.config().rms_norm_eps), rb, y,
                        inv);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::rope(int64_t heads, bool rb, bool inverse, float* x) {
  const model::ModelConfig& c = model_.config();
  if (inverse) {
    kernels::cpu::rope_inverse(model_.rope_cos().data(), model_.rope_sin().data(), t_->pos.data(),
                               t_->rows, heads, c.head_dim, x);
  } else {
    kernels::cpu::rope(model_.rope_cos().data(), model_.rope_sin().data(), t_->pos.data(), t_->rows,
                       heads, c.head_dim, rb, x);
  }
  return absl::OkStatus();
}

absl::Status CpuTrainOps::linear(int64_t layer, int64_t j, const float* x, int64_t rows,
                                 const float* bias, float* y) {
  return model::linear_forward(weight(layer, j), x, rows, bias, y);
}

absl::Status CpuTrainOps::seq_amax(const float* k, const float* v, float* k_amax_host,
                                   float* v_amax_host) {
  const int64_t kvd = model_.config().kv_dim();
  kernels::cpu::seq_amax(k, kvd, t_->seq_start.data(), t_->n_seq, k_amax_host);
  kernels::cpu::seq_amax(v, kvd, t_->seq_start.data(), t_->n_seq, v_amax_host);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::kv_fake_quant(int64_t layer, float* k, float* v) {
  const int64_t n = t_->rows * model_.config().kv_dim();
  const kernels::dm::KvDtype d = kv_dtype(model_.policy().kv_cache);
  kernels::cpu::kv_fake_quant(k, n, d, model_.kv_scales().k[layer]);
  kernels::cpu::kv_fake_quant(v, n, d, model_.kv_scales().v[layer]);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::attention(const float* q, const float* k, const float* v, float* o) {
  const model::ModelConfig& c = model_.config();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  kernels::cpu::attention_prefill(q, k, v, t_->seq_start.data(), t_->n_seq, c.num_attention_heads,
                                  c.num_key_value_heads, c.head_dim, scale, o);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) {
  kernels::cpu::swiglu(g, u, n, rb, act);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::add(float* y, const float* x, int64_t n, bool rb) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] += x[i];
    if (rb) y[i] = kernels::round_bf16(y[i]);
  }
  return absl::OkStatus();
}

absl::Status CpuTrainOps::round_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = kernels::round_bf16(x[i]);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::moe(int64_t layer, const float* x, int64_t rows,
                              const int32_t* forced_host, MoeRouteHost* route_host, float* out) {
  if (!model_.config().sparse_layer(layer)) {
    return absl::InvalidArgumentError(absl::StrCat("moe: layer ", layer, " is not sparse"));
  }
  moe_.resize(model_.config().num_hidden_layers);
  model::MoeActivations& a = moe_[layer];
  if (auto s = model::moe_forward(model_.moe_layer(layer), model_.moe_options(), x, rows,
                                  forced_host, &a, out);
      !s.ok()) {
    return s;
  }
  if (route_host != nullptr) {
    route_host->sel = a.sel;
    route_host->router_sel = a.router_sel;
    route_host->overrode = a.overrode;
    route_host->probs = a.probs;
  }
  return absl::OkStatus();
}

absl::Status CpuTrainOps::log_softmax(const float* z, int64_t row0, int64_t rows, float inv_t,
                                      float* lse, float* logprob) {
  kernels::cpu::log_softmax(z, rows, model_.config().vocab_size, inv_t, t_->targets.data() + row0,
                            lse, logprob);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::head_dlogits(float* z, int64_t row0, int64_t rows, float inv_t,
                                       const float* lse, const float* dlogp) {
  kernels::cpu::head_dlogits(z, rows, model_.config().vocab_size, inv_t, t_->targets.data() + row0,
                             lse, dlogp);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::linear_backward(int64_t layer, int64_t j, const float* x, const float* dy,
                                          int64_t rows, float* dx, float* dw, float* db) {
  return model::linear_backward(weight(layer, j), x, dy, rows, dx, dw, db);
}

absl::Status CpuTrainOps::rmsnorm_backward(const float* x, const float* g, const float* inv,
                                           const float* dy, int64_t rows, int64_t h, float* dx,
                                           float* dg) {
  kernels::cpu::rmsnorm_backward(x, g, inv, dy, rows, h, dx, dg);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::attention_backward(const float* q, const float* k, const float* v,
                                             const float* dout, float* dq, float* dk, float* dv) {
  const model::ModelConfig& c = model_.config();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  stats_.resize(t_->rows * c.num_attention_heads * 3);
  kernels::cpu::attention_prefill_backward(q, k, v, dout, t_->seq_start.data(), t_->n_seq,
                                           c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                           scale, stats_.data(), dq, dk, dv);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::swiglu_backward(const float* g, const float* u, const float* dact,
                                          int64_t n, float* dg, float* du) {
  kernels::cpu::swiglu_backward(g, u, dact, n, dg, du);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::moe_backward(int64_t layer, const float* x, const float* dout,
                                       int64_t rows, const float* dprob_extra_host, float* dx,
                                       model::GradientSink& grads) {
  if (layer < 0 || layer >= static_cast<int64_t>(moe_.size()) || moe_[layer].sel.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("moe_backward: no forward of layer ", layer, " ran"));
  }
  const model::LayerOffsets& lo = model_.layout().layer(layer);
  const model::MoeGradOffsets offsets{.router = lo.router,
                                      .expert_gate = &lo.expert_gate,
                                      .expert_up = &lo.expert_up,
                                      .expert_down = &lo.expert_down,
                                      .shared_gate = lo.shared_gate,
                                      .shared_up = lo.shared_up,
                                      .shared_down = lo.shared_down,
                                      .shared_expert_gate = lo.shared_expert_gate};
  return model::moe_backward(model_.moe_layer(layer), model_.moe_options(), offsets, moe_[layer], x,
                             dout, rows, dprob_extra_host, dx, grads);
}

absl::Status CpuTrainOps::embed_backward(const float* dx, float* dembed) {
  kernels::cpu::embed_backward(dx, t_->tokens.data(), t_->rows, model_.config().hidden_size,
                               dembed);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::copy(float* dst, const float* src, int64_t n) {
  std::copy(src, src + n, dst);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::zero(float* x, int64_t n) {
  std::fill(x, x + n, 0.0f);
  return absl::OkStatus();
}

absl::Status CpuTrainOps::to_host(float* dst_host, const float* src, int64_t n) {
  return copy(dst_host, src, n);
}

absl::Status CpuTrainOps::from_host(float* dst, const float* src_host, int64_t n) {
  return copy(dst, src_host, n);
}

absl::StatusOr<model::TokenValues> CpuTrainStep::forward(const model::Model& model,
                                                         const model::TokenBatch& batch,
                                                         const TrainStepOptions& o) {
  if (auto s = model.check_has_weights("forward"); !s.ok()) return s;
  opts = o;
  auto t = build_train_tables(batch, model.config());
  if (!t.ok()) return t.status();
  tables = *std::move(t);
  storage.assign(train_buffer_floats(model.config(), tables.rows, opts), 0.0f);
  buffers = carve_train_buffers(model.config(), tables.rows, opts, storage.data());
  ops = std::make_unique<CpuTrainOps>(model);
  routing = {};
  if (opts.routing_out == nullptr) opts.routing_out = &routing;
  absl::StatusOr<model::TokenValues> lp =
      train_forward(model.config(), model.policy(), model.layout(), *ops, buffers, tables, opts);
  // The backward reads none of these; the caller's objects need not outlive the forward.
  opts.calibrator = nullptr;
  opts.replay = nullptr;
  opts.routing_out = nullptr;
  return lp;
}

absl::Status CpuTrainStep::backward(const model::Model& model, const model::TokenValues& dlogp,
                                    float* grads, const model::GradientsFinal& on_final) {
  if (ops == nullptr) return absl::FailedPreconditionError("backward: no forward ran");
  if (model.inference_only()) {
    return absl::FailedPreconditionError("backward: inference-only model (no training weights)");
  }
  return train_backward(model.config(), model.policy(), model.layout(), *ops, buffers, tables,
                        dlogp, grads, opts, on_final);
}

absl::Status CpuTrainStep::backward(const model::Model& model, const model::TokenValues& dlogp,
                                    model::GradientSink& grads) {
  if (ops == nullptr) return absl::FailedPreconditionError("backward: no forward ran");
  if (model.inference_only()) {
    return absl::FailedPreconditionError("backward: inference-only model (no training weights)");
  }
  return train_backward(model.config(), model.policy(), model.layout(), *ops, buffers, tables,
                        dlogp, grads, opts);
}

absl::StatusOr<std::vector<float>> CpuTrainStep::logits(int64_t s) const {
  if (ops == nullptr) return absl::FailedPreconditionError("logits: no forward ran");
  if (s < 0 || s >= tables.n_seq) {
    return absl::InvalidArgumentError(absl::StrCat("logits: sequence ", s, " of ", tables.n_seq));
  }
  const int64_t r0 = tables.seq_start[s], len = tables.seq_start[s + 1] - r0,
                h = ops->model().config().hidden_size, vocab = ops->model().config().vocab_size;
  std::vector<float> out(len * vocab);
  if (auto st = ops->linear(-1, 0, buffers.h_final + r0 * h, len, nullptr, out.data()); !st.ok()) {
    return st;
  }
  return out;
}

int64_t CpuTrainStep::saved_bytes() const {
  return static_cast<int64_t>(storage.size() * sizeof(float)) +
         (ops != nullptr ? ops->moe_bytes() : 0);
}

int64_t CpuTrainOps::moe_bytes() const {
  int64_t n = 0;
  auto add = [&n](const auto& v) { n += static_cast<int64_t>(v.size() * sizeof(v[0])); };
  for (const model::MoeActivations& a : moe_) {
    for (const auto* v : {&a.probs, &a.weight, &a.prob_sum, &a.xs, &a.g, &a.u, &a.act, &a.ys, &a.z,
                          &a.sg, &a.su, &a.sact, &a.s_out}) {
      add(*v);
    }
    add(a.sel);
    add(a.router_sel);
    add(a.overrode);
    add(a.groups.offset);
    add(a.groups.slot_row);
    add(a.groups.slot_of);
  }
  return n;
}

absl::StatusOr<model::TokenValues> cpu_logprobs(const model::Model& model,
                                                const model::TokenBatch& batch,
                                                const TrainStepOptions& opts) {
  TrainStepOptions o = opts;
  o.recompute_layers = true;
  CpuTrainStep step;
  return step.forward(model, batch, o);
}

absl::StatusOr<std::vector<float>> cpu_logits(const model::Model& model,
                                              const std::vector<int32_t>& tokens) {
  TrainStepOptions o;
  o.recompute_layers = true;
  CpuTrainStep step;
  if (auto lp = step.forward(model, {tokens}, o); !lp.ok()) return lp.status();
  return step.logits(0);
}

}  // namespace fp8rl::engine
