// The training step of engine/train_step.h: the tables, the buffer layout, and the forward and
// backward sequences over TrainOps.
#include "engine/train_step.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "model/gradient_sink.h"

namespace fp8rl::engine {

#define FP8RL_STEP(expr)                               \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

absl::StatusOr<TrainTables> build_train_tables(const model::TokenBatch& batch,
                                               const model::ModelConfig& config) {
  if (batch.empty()) return absl::InvalidArgumentError("batch: no sequences");
  TrainTables t;
  t.n_seq = static_cast<int64_t>(batch.size());
  t.seq_start.push_back(0);
  for (int64_t s = 0; s < t.n_seq; ++s) {
    const std::vector<int32_t>& seq = batch[s];
    if (seq.empty())
      return absl::InvalidArgumentError(absl::StrCat("batch: sequence ", s, " is empty"));
    for (size_t i = 0; i < seq.size(); ++i) {
      if (seq[i] < 0 || seq[i] >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("batch: sequence ", s, ": token id ", seq[i],
                                                       " at index ", i, " is out of range [0, ",
                                                       config.vocab_size, ")"));
      }
    }
    if (static_cast<int64_t>(seq.size()) > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch: sequence ", s, ": sequence of ", seq.size(),
          " tokens exceeds max_position_embeddings (", config.max_position_embeddings, ")"));
    }
    for (size_t i = 0; i < seq.size(); ++i) {
      t.tokens.push_back(seq[i]);
      t.pos.push_back(static_cast<int32_t>(i));
      t.row_seq.push_back(static_cast<int32_t>(s));
      t.targets.push_back(i + 1 < seq.size() ? seq[i + 1] : -1);
    }
    t.seq_start.push_back(static_cast<int32_t>(t.tokens.size()));
  }
  t.rows = static_cast<int64_t>(t.tokens.size());
  return t;
}

int64_t train_padded_rows(int64_t rows) { return (rows + 15) / 16 * 16 + 16; }

namespace {

constexpr int64_t kAlignFloats = 64;  // 256 bytes

// Hands out aligned slices of one allocation (base == nullptr: counts only).
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

TrainBuffers carve(const model::ModelConfig& c, int64_t rows, const TrainStepOptions& opts,
                   Carver& cv) {
  TrainBuffers b;
  b.rows = rows;
  b.padded_rows = train_padded_rows(rows);
  b.head_chunk = opts.head_chunk;
  b.recompute_layers = opts.recompute_layers;
  const int64_t r = b.padded_rows, h = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(),
                f = c.intermediate_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  b.layers.resize(c.num_hidden_layers);
  // The dense MLP's g, u, act [rows, intermediate_size] exist for dense layers only (a sparse
  // layer's MLP activations are kept by the ops); with recompute_layers the shared set has them
  // when any layer is dense.
  bool any_dense = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) any_dense |= !c.sparse_layer(l);
  // With recompute_layers every layer keeps only its input x; the rest is one shared set that the
  // forward overwrites layer by layer and the backward refills by recomputing the layer.
  TrainLayerBuffers shared;
  for (size_t l = 0; l < b.layers.size(); ++l) {
    TrainLayerBuffers& a = b.layers[l];
    a.x = cv.take(r * h);
    if (opts.recompute_layers && l > 0) {
      float* x = a.x;
      a = shared;
      a.x = x;
      continue;
    }
    a.inv1 = cv.take(r);
    a.h1 = cv.take(r * h);
    a.q = cv.take(r * qd);
    a.k = cv.take(r * kvd);
    a.v = cv.take(r * kvd);
    a.o = cv.take(r * qd);
    a.x2 = cv.take(r * h);
    a.inv2 = cv.take(r);
    a.h2 = cv.take(r * h);
    if (opts.recompute_layers ? any_dense : !c.sparse_layer(static_cast<int64_t>(l))) {
      a.g = cv.take(r * f);
      a.u = cv.take(r * f);
      a.act = cv.take(r * f);
    }
    if (c.qk_norm()) {
      a.q_raw = cv.take(r * qd);
      a.k_raw = cv.take(r * kvd);
      a.inv_q = cv.take(r * nh);
      a.inv_k = cv.take(r * nkv);
    }
    shared = a;
  }
  b.x = cv.take(r * h);
  b.inv_final = cv.take(r);
  b.h_final = cv.take(r * h);
  b.lse = cv.take(r);
  b.logprob = cv.take(r);
  b.dlogp = cv.take(r);
  b.logits = cv.take((opts.head_chunk + 16) * c.vocab_size);
  const int64_t wide = std::max({h, qd, f});
  b.dx = cv.take(r * h);
  b.dh = cv.take(r * h);
  b.tmp = cv.take(r * wide);
  b.dq = cv.take(r * qd);
  b.dk = cv.take(r * kvd);
  b.dv = cv.take(r * kvd);
  b.dout = cv.take(r * qd);
  if (any_dense) {
    b.dact = cv.take(r * f);
    b.dg = cv.take(r * f);
    b.du = cv.take(r * f);
  }
  return b;
}

absl::Status check_step(const model::ModelConfig& config, const TrainBuffers& b,
                        const TrainTables& t, const TrainStepOptions& opts) {
  if (!(opts.temperature > 0) || !std::isfinite(opts.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be > 0, got ", opts.temperature));
  }
  if (!(opts.router_aux_loss_coef >= 0) || !std::isfinite(opts.router_aux_loss_coef)) {
    return absl::InvalidArgumentError(
        absl::StrCat("router_aux_loss_coef: must be >= 0, got ", opts.router_aux_loss_coef));
  }
  if (opts.head_chunk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_chunk: must be >= 1, got ", opts.head_chunk));
  }
  if (b.rows != t.rows || b.head_chunk != opts.head_chunk ||
      b.recompute_layers != opts.recompute_layers ||
      static_cast<int64_t>(b.layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("training step: buffers carved for ", b.rows,
                                                   " rows, the tables have ", t.rows));
  }
  return absl::OkStatus();
}

// Decoder layer l on the running hidden state x [rows, h] in place, saving its activations in
// `a` (a.x: the layer's input); the same sequence as decoder_step's layer. A sparse layer's
// MLP is ops.moe (forced: this layer's replayed experts [rows, k] or nullptr; route: its routing
// out); `recompute` (the backward refilling a's buffers) stops before a sparse layer's MLP,
// whose activations the ops kept from the forward.
absl::Status layer_forward(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                           const model::ParamLayout& layout, TrainOps& ops, const TrainTables& t,
                           int64_t l, const TrainLayerBuffers& a, float* x,
                           model::KvCalibrator* calibrator, const int32_t* forced,
                           MoeRouteHost* route, bool recompute) {
  const int64_t m = t.rows, h = config.hidden_size, qd = config.q_dim(),
                f = config.intermediate_size, hd = config.head_dim, nh = config.num_attention_heads,
                nkv = config.num_key_value_heads;
  const bool rb = policy.bf16_activations();
  auto bias = [&](int64_t off) { return off >= 0 ? ops.small(off) : nullptr; };
  const model::LayerOffsets& lo = layout.layer(l);
  // h1 = input_norm(x) (x saved: the layer's input).
  if (a.x != x) FP8RL_STEP(ops.copy(a.x, x, m * h));
  FP8RL_STEP(ops.rmsnorm(x, ops.small(lo.input_norm), m, h, rb, a.h1, a.inv1));
  // q, k, v = projections of h1 (Qwen2: with bias).
  float* q_lin = config.qk_norm() ? a.q_raw : a.q;
  float* k_lin = config.qk_norm() ? a.k_raw : a.k;
  FP8RL_STEP(ops.linear(l, 0, a.h1, m, bias(lo.q_bias), q_lin));
  FP8RL_STEP(ops.linear(l, 1, a.h1, m, bias(lo.k_bias), k_lin));
  FP8RL_STEP(ops.linear(l, 2, a.h1, m, bias(lo.v_bias), a.v));
  if (config.qk_norm()) {
    // Qwen3: q [m, nh, hd], k [m, nkv, hd] <- RMSNorm of each head (q_raw, k_raw saved).
    FP8RL_STEP(ops.rmsnorm(a.q_raw, ops.small(lo.q_norm), m * nh, hd, rb, a.q, a.inv_q));
    FP8RL_STEP(ops.rmsnorm(a.k_raw, ops.small(lo.k_norm), m * nkv, hd, rb, a.k, a.inv_k));
  }
  FP8RL_STEP(ops.rope(nh, rb, false, a.q));
  FP8RL_STEP(ops.rope(nkv, rb, false, a.k));
  if (calibrator != nullptr) {
    std::vector<float> k_amax(t.n_seq), v_amax(t.n_seq);
    FP8RL_STEP(ops.seq_amax(a.k, a.v, k_amax.data(), v_amax.data()));
    for (int64_t s = 0; s < t.n_seq; ++s) calibrator->record(l, k_amax[s], v_amax[s]);
  }
  // K/V through the cache format, as generation will read them (straight-through backward).
  if (policy.train_kv_fake_quant) FP8RL_STEP(ops.kv_fake_quant(l, a.k, a.v));
  FP8RL_STEP(ops.attention(a.q, a.k, a.v, a.o));
  if (rb) FP8RL_STEP(ops.round_bf16(a.o, m * qd));
  // x2 = x + o_proj(o); h2 = post_norm(x2).
  FP8RL_STEP(ops.linear(l, 3, a.o, m, nullptr, a.x2));
  FP8RL_STEP(ops.add(a.x2, a.x, m * h, rb));
  FP8RL_STEP(ops.rmsnorm(a.x2, ops.small(lo.post_norm), m, h, rb, a.h2, a.inv2));
  if (config.sparse_layer(l)) {
    // x = x2 + moe(h2).
    if (recompute) return absl::OkStatus();
    FP8RL_STEP(ops.moe(l, a.h2, m, forced, route, x));
  } else {
    // x = x2 + down(silu(gate(h2)) * up(h2)).
    FP8RL_STEP(ops.linear(l, 4, a.h2, m, nullptr, a.g));
    FP8RL_STEP(ops.linear(l, 5, a.h2, m, nullptr, a.u));
    FP8RL_STEP(ops.swiglu(a.g, a.u, m * f, rb, a.act));
    FP8RL_STEP(ops.linear(l, 6, a.act, m, nullptr, x));
  }
  FP8RL_STEP(ops.add(x, a.x2, m * h, rb));
  return absl::OkStatus();
}

}  // namespace

int64_t train_buffer_floats(const model::ModelConfig& config, int64_t rows,
                            const TrainStepOptions& opts) {
  Carver cv(nullptr);
  carve(config, rows, opts, cv);
  return cv.used();
}

namespace {
std::atomic<int64_t> g_train_forward_calls{0};

// Holds at most one unit of a UnitWeights hook (nothing without one); acquiring a unit releases
// the one held, after the ops have finished with it.
class HeldUnit {
 public:
  HeldUnit(TrainOps& ops, UnitWeights* hook) : ops_(ops), hook_(hook) {}
  ~HeldUnit() { (void)release(); }
  HeldUnit(const HeldUnit&) = delete;
  HeldUnit& operator=(const HeldUnit&) = delete;
  absl::Status acquire(int64_t unit) {
    if (hook_ == nullptr) return absl::OkStatus();
    FP8RL_STEP(release());
    FP8RL_STEP(hook_->acquire(unit));
    held_ = unit;
    return absl::OkStatus();
  }
  absl::Status release() {
    if (hook_ == nullptr || held_ < 0) return absl::OkStatus();
    absl::Status s = ops_.synchronize();
    hook_->release(held_);
    held_ = -1;
    return s;
  }

 private:
  TrainOps& ops_;
  UnitWeights* const hook_;
  int64_t held_ = -1;
};

}  // namespace

std::vector<int64_t> forward_unit_order(int64_t layers) {
  std::vector<int64_t> out;
  for (int64_t u = 0; u <= layers + 1; ++u) out.push_back(u);
  return out;
}

std::vector<int64_t> backward_unit_order(int64_t layers) {
  std::vector<int64_t> out;
  for (int64_t u = layers + 1; u >= 1; --u) out.push_back(u);
  return out;
}

std::pair<int64_t, int64_t> unit_range(const model::ParamLayout& layout, int64_t layers,
                                       int64_t unit) {
  const auto layer_begin = [&](int64_t l) {
    return l < layers ? layout.layer(l).input_norm : layout.final_norm();
  };
  if (unit <= 0) return {layout.embed(), layer_begin(0)};
  if (unit <= layers) return {layer_begin(unit - 1), layer_begin(unit)};
  return {layout.final_norm(), layout.total()};
}

int64_t train_forward_calls_total() {
  return g_train_forward_calls.load(std::memory_order_relaxed);
}

TrainBuffers carve_train_buffers(const model::ModelConfig& config, int64_t rows,
                                 const TrainStepOptions& opts, float* base) {
  Carver cv(base);
  return carve(config, rows, opts, cv);
}

absl::StatusOr<model::TokenValues> train_forward(const model::ModelConfig& config,
                                                 const model::PrecisionPolicy& policy,
                                                 const model::ParamLayout& layout, TrainOps& ops,
                                                 TrainBuffers& b, const TrainTables& t,
                                                 const TrainStepOptions& opts) {
  FP8RL_STEP(check_step(config, b, t, opts));
  g_train_forward_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t m = t.rows, h = config.hidden_size;
  const bool rb = policy.bf16_activations();
  // Mixture of experts bookkeeping: the replayed experts in, [sparse layers,
  // rows, k]; the routing used, the router's own choice and the load-balancing sums out.
  const int64_t n_sparse = config.num_sparse_layers(), top_k = config.moe.num_experts_per_tok,
                n_exp = config.moe.num_experts, width = n_sparse * top_k;
  std::vector<int32_t> forced, record(n_sparse * m * top_k), chosen(n_sparse * m * top_k);
  if (opts.replay != nullptr) {
    std::vector<int64_t> lengths(t.n_seq);
    for (int64_t s = 0; s < t.n_seq; ++s) lengths[s] = t.seq_start[s + 1] - t.seq_start[s];
    FP8RL_STEP(model::check_routing(config, lengths, *opts.replay));
    forced.assign(n_sparse * m * top_k, -1);
    for (int64_t s = 0; s < t.n_seq; ++s) {
      const std::vector<int32_t>& r = (*opts.replay)[s];
      const int64_t rows = width > 0 ? static_cast<int64_t>(r.size()) / width : 0;
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t li = 0; li < n_sparse; ++li) {
          std::copy(r.begin() + (i * n_sparse + li) * top_k,
                    r.begin() + (i * n_sparse + li + 1) * top_k,
                    forced.begin() + (li * m + t.seq_start[s] + i) * top_k);
        }
      }
    }
  }
  std::vector<double> expert_rows(n_exp, 0.0), expert_prob(n_exp, 0.0);
  model::ForwardRouting routed;
  routed.expert_tokens.assign(n_sparse * n_exp, 0);
  std::vector<uint8_t> overrode(forced.empty() ? 0 : m, 0);  // any layer, per row
  MoeRouteHost route;
  HeldUnit unit(ops, opts.units);
  FP8RL_STEP(ops.load_tables(t));
  FP8RL_STEP(unit.acquire(0));
  FP8RL_STEP(ops.embed(b.x));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    FP8RL_STEP(unit.acquire(l + 1));
    const int64_t li = config.sparse_layer(l) ? config.sparse_index(l) : -1;
    const int32_t* forced_l = li >= 0 && !forced.empty() ? forced.data() + li * m * top_k : nullptr;
    FP8RL_STEP(layer_forward(config, policy, layout, ops, t, l, b.layers[l], b.x, opts.calibrator,
                             forced_l, &route, false));
    if (li < 0) continue;
    std::copy(route.sel.begin(), route.sel.end(), record.begin() + li * m * top_k);
    std::copy(route.router_sel.begin(), route.router_sel.end(), chosen.begin() + li * m * top_k);
    for (int32_t e : route.sel) {
      expert_rows[e] += 1;
      ++routed.expert_tokens[li * n_exp + e];
    }
    for (size_t r = 0; r < overrode.size(); ++r) overrode[r] |= route.overrode[r];
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t e = 0; e < n_exp; ++e) expert_prob[e] += route.probs[r * n_exp + e];
    }
  }
  b.aux_dprob.clear();
  if (width > 0) {
    routed.used.assign(t.n_seq, {});
    routed.chosen.assign(t.n_seq, {});
    for (int64_t s = 0; s < t.n_seq; ++s) {
      const int64_t r0 = t.seq_start[s], len = t.seq_start[s + 1] - r0;
      if (!forced.empty()) {
        const int64_t rows = static_cast<int64_t>((*opts.replay)[s].size()) / width;
        routed.replayed_tokens += rows;
        for (int64_t i = 0; i < rows; ++i) routed.replay_overrode += overrode[r0 + i];
      }
      // [sparse layers, rows, k] -> this sequence's [tokens, sparse layers, k].
      auto per_token = [&](const std::vector<int32_t>& in, std::vector<int32_t>* out) {
        out->resize(len * width);
        for (int64_t i = 0; i < len; ++i) {
          for (int64_t li = 0; li < n_sparse; ++li) {
            std::copy(in.begin() + (li * m + r0 + i) * top_k,
                      in.begin() + (li * m + r0 + i + 1) * top_k,
                      out->begin() + (i * n_sparse + li) * top_k);
          }
        }
      };
      per_token(record, &routed.used[s]);
      per_token(chosen, &routed.chosen[s]);
    }
    // HF load_balancing_loss_func over the sparse layers x rows router outputs:
    // only the probabilities carry a gradient, d/dprobs[row, e] = coef * E * (rows to e / N) / N.
    const double rows_total = static_cast<double>(n_sparse * m);
    for (int64_t e = 0; e < n_exp; ++e) {
      routed.aux_loss += n_exp * (expert_rows[e] / rows_total) * (expert_prob[e] / rows_total);
    }
    if (opts.router_aux_loss_coef > 0) {
      b.aux_dprob.resize(n_exp);
      for (int64_t e = 0; e < n_exp; ++e) {
        b.aux_dprob[e] = static_cast<float>(opts.router_aux_loss_coef * n_exp *
                                            (expert_rows[e] / rows_total) / rows_total);
      }
    }
    if (opts.routing_out != nullptr) *opts.routing_out = std::move(routed);
  }
  // h_final = final_norm(x); x stays as x_final.
  FP8RL_STEP(unit.acquire(config.num_hidden_layers + 1));
  FP8RL_STEP(ops.rmsnorm(b.x, ops.small(layout.final_norm()), m, h, rb, b.h_final, b.inv_final));
  // Logprobs of each next token, lm_head in chunks of rows within a sequence.
  const float inv_t = 1.0f / opts.temperature;
  for (int64_t s = 0; s < t.n_seq; ++s) {
    const int64_t r0 = t.seq_start[s], len = t.seq_start[s + 1] - r0;
    for (int64_t i0 = 0; i0 < len - 1; i0 += opts.head_chunk) {
      const int64_t rows = std::min(opts.head_chunk, len - 1 - i0), row = r0 + i0;
      FP8RL_STEP(ops.linear(-1, 0, b.h_final + row * h, rows, nullptr, b.logits));
      FP8RL_STEP(ops.log_softmax(b.logits, row, rows, inv_t, b.lse + row, b.logprob + row));
    }
  }
  FP8RL_STEP(unit.release());
  std::vector<float> lp(m);
  FP8RL_STEP(ops.to_host(lp.data(), b.logprob, m));
  model::TokenValues out(t.n_seq);
  for (int64_t s = 0; s < t.n_seq; ++s) {
    out[s].assign(lp.begin() + t.seq_start[s], lp.begin() + t.seq_start[s + 1] - 1);
  }
  return out;
}

namespace {

// train_backward into `grads` (GradientSink::grad(offset): ops memory); `notify`: tell the sink
// what is final (after synchronize()) as the backward goes.
absl::Status backward(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                      const model::ParamLayout& layout, TrainOps& ops, const TrainBuffers& b,
                      const TrainTables& t, const model::TokenValues& dlogp,
                      model::GradientSink& grads, const TrainStepOptions& opts, bool notify) {
  FP8RL_STEP(check_step(config, b, t, opts));
  if (static_cast<int64_t>(dlogp.size()) != t.n_seq) {
    return absl::InvalidArgumentError(absl::StrCat("backward: dlogp has ", dlogp.size(),
                                                   " sequences, the forward had ", t.n_seq));
  }
  const int64_t m = t.rows, h = config.hidden_size, qd = config.q_dim(), kvd = config.kv_dim(),
                f = config.intermediate_size, hd = config.head_dim, nh = config.num_attention_heads,
                nkv = config.num_key_value_heads;
  std::vector<float> flat(m, 0.0f);
  for (int64_t s = 0; s < t.n_seq; ++s) {
    const int64_t len = t.seq_start[s + 1] - t.seq_start[s];
    if (static_cast<int64_t>(dlogp[s].size()) + 1 != len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backward: dlogp[", s, "] has ", dlogp[s].size(), " values, expected ", len - 1));
    }
    for (int64_t i = 0; i + 1 < len; ++i) {
      if (!std::isfinite(dlogp[s][i])) {
        return absl::InvalidArgumentError(absl::StrCat("backward: dlogp[", s, "] not finite"));
      }
      flat[t.seq_start[s] + i] = dlogp[s][i];
    }
  }
  (void)policy;
  HeldUnit unit(ops, opts.units);
  FP8RL_STEP(ops.load_tables(t));
  FP8RL_STEP(ops.from_host(b.dlogp, flat.data(), m));
  FP8RL_STEP(unit.acquire(config.num_hidden_layers + 1));
  const float inv_t = 1.0f / opts.temperature;

  // lm_head: dlogits = dlogp * (onehot - softmax(z/T)) / T, logits recomputed per chunk; chunks
  // whose dlogp are all zero contribute nothing and are skipped.
  FP8RL_STEP(ops.zero(b.dx, m * h));
  for (int64_t s = 0; s < t.n_seq; ++s) {
    const int64_t r0 = t.seq_start[s], len = t.seq_start[s + 1] - r0;
    for (int64_t i0 = 0; i0 < len - 1; i0 += opts.head_chunk) {
      const int64_t rows = std::min(opts.head_chunk, len - 1 - i0), row = r0 + i0;
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) any |= flat[row + r] != 0.0f;
      if (!any) continue;
      const float* hs = b.h_final + row * h;
      FP8RL_STEP(ops.linear(-1, 0, hs, rows, nullptr, b.logits));
      FP8RL_STEP(ops.head_dlogits(b.logits, row, rows, inv_t, b.lse + row, b.dlogp + row));
      FP8RL_STEP(ops.linear_backward(-1, 0, hs, b.logits, rows, b.tmp, grads.grad(layout.lm_head()),
                                     nullptr));
      FP8RL_STEP(ops.add(b.dx + row * h, b.tmp, rows * h, false));
    }
  }
  // Final norm: dx becomes the gradient at the last layer's output (b.x holds x_final).
  FP8RL_STEP(ops.rmsnorm_backward(b.x, ops.small(layout.final_norm()), b.inv_final, b.dx, m, h,
                                  b.tmp, grads.grad(layout.final_norm())));
  FP8RL_STEP(ops.copy(b.dx, b.tmp, m * h));
  auto final_from = [&](int64_t from) -> absl::Status {
    if (!notify) return absl::OkStatus();
    FP8RL_STEP(ops.synchronize());
    grads.final_from(from);
    return absl::OkStatus();
  };
  FP8RL_STEP(final_from(layout.final_norm()));

  for (int64_t l = config.num_hidden_layers - 1; l >= 0; --l) {
    FP8RL_STEP(unit.acquire(l + 1));
    const model::LayerOffsets& lo = layout.layer(l);
    const TrainLayerBuffers& a = b.layers[l];
    if (opts.recompute_layers) {
      // Refill the shared activations by running layer l again from its saved input (the same
      // operations on the same values give the same activations); b.x, x_final's buffer, is free
      // once the final norm's backward has run.
      FP8RL_STEP(ops.copy(b.x, a.x, m * h));
      FP8RL_STEP(layer_forward(config, policy, layout, ops, t, l, a, b.x, nullptr, nullptr, nullptr,
                               true));
    }
    if (config.sparse_layer(l)) {
      // MLP: x_out = x2 + moe(h2) (forward: "x = x2 + moe(h2)"); dh is d h2.
      FP8RL_STEP(ops.moe_backward(l, a.h2, b.dx, m,
                                  b.aux_dprob.empty() ? nullptr : b.aux_dprob.data(), b.dh, grads));
    } else {
      // MLP: x_out = x2 + down(silu(gate(h2)) * up(h2)).
      FP8RL_STEP(ops.linear_backward(l, 6, a.act, b.dx, m, b.dact, grads.grad(lo.down), nullptr));
      FP8RL_STEP(ops.swiglu_backward(a.g, a.u, b.dact, m * f, b.dg, b.du));
      FP8RL_STEP(ops.linear_backward(l, 4, a.h2, b.dg, m, b.dh, grads.grad(lo.gate), nullptr));
      FP8RL_STEP(ops.linear_backward(l, 5, a.h2, b.du, m, b.tmp, grads.grad(lo.up), nullptr));
      FP8RL_STEP(ops.add(b.dh, b.tmp, m * h, false));
    }
    // h2 = post_norm(x2); dx += d x2 through the norm (dx is now d x2).
    FP8RL_STEP(ops.rmsnorm_backward(a.x2, ops.small(lo.post_norm), a.inv2, b.dh, m, h, b.tmp,
                                    grads.grad(lo.post_norm)));
    FP8RL_STEP(ops.add(b.dx, b.tmp, m * h, false));
    // Attention: x2 = x + o_proj(attn(q, k, v)).
    FP8RL_STEP(ops.linear_backward(l, 3, a.o, b.dx, m, b.dout, grads.grad(lo.o), nullptr));
    FP8RL_STEP(ops.attention_backward(a.q, a.k, a.v, b.dout, b.dq, b.dk, b.dv));
    // K/V rounding is straight-through; undo the rotation.
    FP8RL_STEP(ops.rope(nh, false, true, b.dq));
    FP8RL_STEP(ops.rope(nkv, false, true, b.dk));
    if (config.qk_norm()) {
      // q = q_norm(q_raw), k = k_norm(k_raw) per head.
      FP8RL_STEP(ops.rmsnorm_backward(a.q_raw, ops.small(lo.q_norm), a.inv_q, b.dq, m * nh, hd,
                                      b.tmp, grads.grad(lo.q_norm)));
      FP8RL_STEP(ops.copy(b.dq, b.tmp, m * qd));
      FP8RL_STEP(ops.rmsnorm_backward(a.k_raw, ops.small(lo.k_norm), a.inv_k, b.dk, m * nkv, hd,
                                      b.tmp, grads.grad(lo.k_norm)));
      FP8RL_STEP(ops.copy(b.dk, b.tmp, m * kvd));
    }
    auto gbias = [&](int64_t off) { return off >= 0 ? grads.grad(off) : nullptr; };
    FP8RL_STEP(ops.linear_backward(l, 0, a.h1, b.dq, m, b.dh, grads.grad(lo.q), gbias(lo.q_bias)));
    FP8RL_STEP(ops.linear_backward(l, 1, a.h1, b.dk, m, b.tmp, grads.grad(lo.k), gbias(lo.k_bias)));
    FP8RL_STEP(ops.add(b.dh, b.tmp, m * h, false));
    FP8RL_STEP(ops.linear_backward(l, 2, a.h1, b.dv, m, b.tmp, grads.grad(lo.v), gbias(lo.v_bias)));
    FP8RL_STEP(ops.add(b.dh, b.tmp, m * h, false));
    // h1 = input_norm(x): dx is now d x (the layer's input).
    FP8RL_STEP(ops.rmsnorm_backward(a.x, ops.small(lo.input_norm), a.inv1, b.dh, m, h, b.tmp,
                                    grads.grad(lo.input_norm)));
    FP8RL_STEP(ops.add(b.dx, b.tmp, m * h, false));
    FP8RL_STEP(final_from(lo.input_norm));  // layer l's first parameter
  }
  FP8RL_STEP(unit.release());
  // Embedding rows in row order (repeated tokens add into the same row); reads no weight.
  FP8RL_STEP(ops.embed_backward(b.dx, grads.grad(layout.embed())));
  FP8RL_STEP(final_from(0));
  return absl::OkStatus();
}

}  // namespace

absl::Status train_backward(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                            const model::ParamLayout& layout, TrainOps& ops, const TrainBuffers& b,
                            const TrainTables& t, const model::TokenValues& dlogp, float* grads,
                            const TrainStepOptions& opts, const model::GradientsFinal& on_final) {
  model::FlatGradientSink sink(grads, on_final);
  return backward(config, policy, layout, ops, b, t, dlogp, sink, opts,
                  static_cast<bool>(on_final));
}

absl::Status train_backward(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                            const model::ParamLayout& layout, TrainOps& ops, const TrainBuffers& b,
                            const TrainTables& t, const model::TokenValues& dlogp,
                            model::GradientSink& grads, const TrainStepOptions& opts) {
  return backward(config, policy, layout, ops, b, t, dlogp, grads, opts, true);
}

#undef FP8RL_STEP

}  // namespace fp8rl::engine
