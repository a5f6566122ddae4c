// The decoder's forward passes (training over packed sequences, KV-cache prefill/decode) and the
// training backward. Both forwards run the same per-layer code (layer_forward) and the same
// attention row routine, so generation and training compute identical numbers.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "model/model.h"
#include "model/ops.h"

namespace fp8rl::model {
namespace {

constexpr int64_t kHeadChunk = 64;  // lm_head rows per chunk (bounds the logits buffer)

std::atomic<int64_t> g_forward_calls{0};  // Model::forward_calls_total()

// Runs fn(begin, end) over rows in parallel (chunks of at least `grain` rows).
template <typename Fn>
void rows_parallel(int64_t rows, int64_t grain, const Fn& fn) {
  parallel_for(
      rows, [&](int64_t b, int64_t e) { fn(b, e); }, grain);
}

float amax_of(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// Causal attention of the training forward over packed sequences: a.o from a.q, a.k, a.v, each
// sequence attending to its own rows only (the forward and the recomputing backward share it).
void packed_attention(const ModelConfig& config, const ForwardContext& c, LayerActivations& a) {
  const int64_t hd = config.head_dim, qd = config.q_dim(), kvd = config.kv_dim(),
                n_heads = config.num_attention_heads,
                group = config.num_attention_heads / config.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t n_seq = static_cast<int64_t>(c.tokens.size());
  parallel_for(n_seq * n_heads, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    for (int64_t t = b; t < e; ++t) {
      const int64_t s = t / n_heads, hh = t % n_heads, g = hh / group;
      const int64_t r0 = c.row0[s], len = static_cast<int64_t>(c.tokens[s].size());
      scores.resize(len);
      const float* kb = a.k.data() + r0 * kvd + g * hd;
      const float* vb = a.v.data() + r0 * kvd + g * hd;
      for (int64_t i = 0; i < len; ++i) {
        ops::attend_row(a.q.data() + (r0 + i) * qd + hh * hd, kb, kvd, vb, kvd, i + 1, hd, scale,
                        scores.data(), a.o.data() + (r0 + i) * qd + hh * hd);
      }
    }
  });
}

}  // namespace

int64_t activation_bytes(const LayerActivations& a) {
  int64_t n = 0;
  for (const std::vector<float>* v :
       {&a.x, &a.inv1, &a.h1, &a.q, &a.k, &a.v, &a.o, &a.x2, &a.inv2, &a.h2, &a.g, &a.u, &a.act,
        &a.q_raw, &a.k_raw, &a.inv_q, &a.inv_k}) {
    n += static_cast<int64_t>(v->size());
  }
  return n * static_cast<int64_t>(sizeof(float));
}

int64_t activation_bytes(const ForwardContext& ctx) {
  int64_t n = 0;
  for (const LayerActivations& a : ctx.layers) n += activation_bytes(a);
  for (const std::vector<float>* v : {&ctx.x_final, &ctx.inv_final, &ctx.h_final, &ctx.lse}) {
    n += static_cast<int64_t>(v->size() * sizeof(float));
  }
  return n;
}

void Model::embed(const int32_t* tokens, int64_t m, float* x) const {
  const int64_t h = config_.hidden_size;
  if (embed_w_.precision != Precision::kF32 && embed_w_.bf16.empty()) {
    // An inference-only model with tied embeddings holds the table once, as the lm_head's double
    // operand (bf16 values: exact in float).
    const double* table = embed_w_.exact.data();
    for (int64_t r = 0; r < m; ++r) {
      const double* row = table + static_cast<int64_t>(tokens[r]) * h;
      for (int64_t i = 0; i < h; ++i) x[r * h + i] = static_cast<float>(row[i]);
    }
    return;
  }
  const float* table = embed_w_.dense();
  for (int64_t r = 0; r < m; ++r) {
    std::memcpy(x + r * h, table + static_cast<int64_t>(tokens[r]) * h, h * sizeof(float));
  }
}

template <typename AttentionFn>
absl::Status Model::layer_forward(int64_t l, int64_t m, const int32_t* pos, float* x,
                                  LayerActivations& a, bool save, KvCalibrator* calibrator,
                                  std::span<const int64_t> seq_row0, bool train_kv,
                                  const AttentionFn& attention, const int32_t* forced,
                                  int32_t* record) const {
  const int64_t h = config_.hidden_size, qd = config_.q_dim(), kvd = config_.kv_dim(),
                f = config_.intermediate_size, hd = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool rb = policy_.bf16_activations();
  const LayerOffsets& lo = layout_.layer(l);
  const auto& W = linears_[l];
  const int64_t grain = std::max<int64_t>(1, 4096 / h);

  if (save) a.x.assign(x, x + m * h);
  a.inv1.resize(m);
  a.h1.resize(m * h);
  rows_parallel(m, grain, [&](int64_t b, int64_t e) {
    ops::rmsnorm_forward(x + b * h, small_param(lo.input_norm), e - b, h, eps, a.h1.data() + b * h,
                         a.inv1.data() + b);
    if (rb) ops::round_bf16_inplace(a.h1.data() + b * h, (e - b) * h);
  });
  a.q.resize(m * qd);
  a.k.resize(m * kvd);
  a.v.resize(m * kvd);
  auto bias = [&](int64_t off) { return off >= 0 ? small_param(off) : nullptr; };
  if (auto s = linear_forward(W[0], a.h1.data(), m, bias(lo.q_bias), a.q.data()); !s.ok()) return s;
  if (auto s = linear_forward(W[1], a.h1.data(), m, bias(lo.k_bias), a.k.data()); !s.ok()) return s;
  if (auto s = linear_forward(W[2], a.h1.data(), m, bias(lo.v_bias), a.v.data()); !s.ok()) return s;
  if (config_.qk_norm()) {
    // Qwen3: q [m, heads, hd], k [m, kv_heads, hd] <- RMSNorm of each head's hd values (q_norm,
    // k_norm weights [hd]), before RoPE.
    const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
    if (save) {
      a.q_raw.assign(a.q.begin(), a.q.end());
      a.k_raw.assign(a.k.begin(), a.k.end());
    }
    a.inv_q.resize(m * nh);
    a.inv_k.resize(m * nkv);
    rows_parallel(m, grain, [&](int64_t b, int64_t e) {
      float* q = a.q.data() + b * qd;
      float* k = a.k.data() + b * kvd;
      ops::rmsnorm_forward(q, small_param(lo.q_norm), (e - b) * nh, hd, eps, q,
                           a.inv_q.data() + b * nh);
      ops::rmsnorm_forward(k, small_param(lo.k_norm), (e - b) * nkv, hd, eps, k,
                           a.inv_k.data() + b * nkv);
      if (rb) {
        ops::round_bf16_inplace(q, (e - b) * qd);
        ops::round_bf16_inplace(k, (e - b) * kvd);
      }
    });
  }
  const ops::RopeTable rope{hd / 2, config_.max_position_embeddings,
                            const_cast<float*>(rope_cos_.data()),
                            const_cast<float*>(rope_sin_.data())};
  rows_parallel(m, grain, [&](int64_t b, int64_t e) {
    ops::rope_apply(rope, pos + b, e - b, config_.num_attention_heads, hd, a.q.data() + b * qd,
                    false);
    ops::rope_apply(rope, pos + b, e - b, config_.num_key_value_heads, hd, a.k.data() + b * kvd,
                    false);
    if (rb) {
      ops::round_bf16_inplace(a.q.data() + b * qd, (e - b) * qd);
      ops::round_bf16_inplace(a.k.data() + b * kvd, (e - b) * kvd);
    }
  });
  for (size_t s = 0; calibrator != nullptr && s < seq_row0.size(); ++s) {
    const int64_t r0 = seq_row0[s], r1 = s + 1 < seq_row0.size() ? seq_row0[s + 1] : m;
    calibrator->record(l, amax_of(a.k.data() + r0 * kvd, (r1 - r0) * kvd),
                       amax_of(a.v.data() + r0 * kvd, (r1 - r0) * kvd));
  }
  if (train_kv && policy_.train_kv_fake_quant) {
    kv_round_trip(policy_.kv_cache, a.k.data(), m * kvd, kv_scales_.k[l]);
    kv_round_trip(policy_.kv_cache, a.v.data(), m * kvd, kv_scales_.v[l]);
  }
  a.o.resize(m * qd);
  attention(l, a);
  if (rb) ops::round_bf16_inplace(a.o.data(), m * qd);
  a.x2.resize(m * h);
  if (auto s = linear_forward(W[3], a.o.data(), m, nullptr, a.x2.data()); !s.ok()) return s;
  a.inv2.resize(m);
  a.h2.resize(m * h);
  rows_parallel(m, grain, [&](int64_t b, int64_t e) {
    add_inplace(a.x2.data() + b * h, x + b * h, (e - b) * h);
    if (rb) ops::round_bf16_inplace(a.x2.data() + b * h, (e - b) * h);
    ops::rmsnorm_forward(a.x2.data() + b * h, small_param(lo.post_norm), e - b, h, eps,
                         a.h2.data() + b * h, a.inv2.data() + b);
    if (rb) ops::round_bf16_inplace(a.h2.data() + b * h, (e - b) * h);
  });
  if (config_.sparse_layer(l)) {
    // x <- x2 + moe(h2): the experts' grouped SwiGLUs (model/moe.h); routing in/out is
    // [sparse layers, m, top_k].
    const int64_t k = config_.moe.num_experts_per_tok, at = config_.sparse_index(l) * m * k;
    if (auto s = moe_forward(moe_[l], moe_options(), a.h2.data(), m,
                             forced != nullptr ? forced + at : nullptr, &a.moe, x);
        !s.ok()) {
      return s;
    }
    if (record != nullptr) std::copy(a.moe.sel.begin(), a.moe.sel.end(), record + at);
  } else {
    a.g.resize(m * f);
    a.u.resize(m * f);
    a.act.resize(m * f);
    if (auto s = linear_forward(W[4], a.h2.data(), m, nullptr, a.g.data()); !s.ok()) return s;
    if (auto s = linear_forward(W[5], a.h2.data(), m, nullptr, a.u.data()); !s.ok()) return s;
    rows_parallel(m, grain, [&](int64_t b, int64_t e) {
      ops::swiglu_forward(a.g.data() + b * f, a.u.data() + b * f, (e - b) * f,
                          a.act.data() + b * f);
      if (rb) ops::round_bf16_inplace(a.act.data() + b * f, (e - b) * f);
    });
    // x <- x2 + down(act)
    if (auto s = linear_forward(W[6], a.act.data(), m, nullptr, x); !s.ok()) return s;
  }
  rows_parallel(m, grain, [&](int64_t b, int64_t e) {
    add_inplace(x + b * h, a.x2.data() + b * h, (e - b) * h);
    if (rb) ops::round_bf16_inplace(x + b * h, (e - b) * h);
  });
  return absl::OkStatus();
}

int64_t Model::forward_calls_total() { return g_forward_calls.load(std::memory_order_relaxed); }

absl::StatusOr<TokenValues> Model::forward(const TokenBatch& batch, const TrainForwardOptions& opts,
                                           ForwardContext* ctx) const {
  if (auto s = check_has_weights("forward"); !s.ok()) return s;
  g_forward_calls.fetch_add(1, std::memory_order_relaxed);
  if (!(opts.temperature > 0) || !std::isfinite(opts.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be > 0, got ", opts.temperature));
  }
  if (batch.empty()) return absl::InvalidArgumentError("batch: no sequences");
  ForwardContext local;
  ForwardContext& c = ctx ? *ctx : local;
  c.tokens = batch;
  c.temperature = opts.temperature;
  c.row0.clear();
  c.pos.clear();
  std::vector<int32_t> flat;
  for (size_t s = 0; s < batch.size(); ++s) {
    if (batch[s].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("batch: sequence ", s, " is empty"));
    }
    if (auto st = check_tokens(batch[s]); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("batch: sequence ", s, ": ", st.message()));
    }
    c.row0.push_back(static_cast<int64_t>(flat.size()));
    for (size_t i = 0; i < batch[s].size(); ++i) {
      flat.push_back(batch[s][i]);
      c.pos.push_back(static_cast<int32_t>(i));
    }
  }
  const int64_t m = static_cast<int64_t>(flat.size()), h = config_.hidden_size;
  const int64_t n_seq = static_cast<int64_t>(batch.size());
  std::vector<float> x(m * h);
  embed(flat.data(), m, x.data());
  c.layers.assign(ctx ? config_.num_hidden_layers : 1, {});

  auto attention = [&](int64_t, LayerActivations& a) { packed_attention(config_, c, a); };
  // Mixture of experts: replayed routing in, the routing used and the load-balancing sums out.
  const int64_t n_sparse = config_.num_sparse_layers(), top_k = config_.moe.num_experts_per_tok,
                n_exp = config_.moe.num_experts, width = routing_width();
  std::vector<int32_t> forced, record(n_sparse * m * top_k), chosen(n_sparse * m * top_k);
  if (opts.replay != nullptr) {
    if (auto st = check_routing(batch, *opts.replay); !st.ok()) return st;
    forced.assign(n_sparse * m * top_k, -1);
    for (int64_t s = 0; s < n_seq; ++s) {
      const std::vector<int32_t>& r = (*opts.replay)[s];
      const int64_t rows = width > 0 ? static_cast<int64_t>(r.size()) / width : 0;
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t li = 0; li < n_sparse; ++li) {
          std::copy(r.begin() + (t * n_sparse + li) * top_k,
                    r.begin() + (t * n_sparse + li + 1) * top_k,
                    forced.begin() + (li * m + c.row0[s] + t) * top_k);
        }
      }
    }
  }
  std::vector<double> expert_rows(n_exp, 0.0), expert_prob(n_exp, 0.0);
  ForwardRouting& routed = c.moe;
  routed = {};
  routed.expert_tokens.assign(n_sparse * n_exp, 0);
  std::vector<uint8_t> overrode(forced.empty() ? 0 : m, 0);  // any layer, per row
  c.recompute_layers = ctx != nullptr && opts.recompute_layers;
  LayerActivations scratch;  // recompute_layers: the dense layers' intermediates, not kept
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const bool recompute = c.recompute_layers && !config_.sparse_layer(l);
    if (recompute) c.layers[l].x.assign(x.begin(), x.end());  // all the backward gets
    LayerActivations& a = recompute ? scratch : c.layers[ctx ? l : 0];
    if (auto s = layer_forward(l, m, c.pos.data(), x.data(), a, ctx != nullptr && !recompute,
                               opts.calibrator, c.row0, true, attention,
                               forced.empty() ? nullptr : forced.data(), record.data());
        !s.ok()) {
      return s;
    }
    if (config_.sparse_layer(l)) {
      const int64_t li = config_.sparse_index(l);
      std::copy(a.moe.router_sel.begin(), a.moe.router_sel.end(), chosen.begin() + li * m * top_k);
      for (int32_t e : a.moe.sel) {
        expert_rows[e] += 1;
        ++routed.expert_tokens[li * n_exp + e];
      }
      for (size_t r = 0; r < overrode.size(); ++r) overrode[r] |= a.moe.overrode[r];
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t e = 0; e < n_exp; ++e) expert_prob[e] += a.moe.probs[r * n_exp + e];
      }
    }
  }
  c.aux_dprob.clear();
  if (width > 0) {
    routed.used.assign(n_seq, {});
    routed.chosen.assign(n_seq, {});
    for (int64_t s = 0; s < n_seq; ++s) {
      const int64_t len = static_cast<int64_t>(batch[s].size());
      if (!forced.empty()) {
        const int64_t rows = static_cast<int64_t>((*opts.replay)[s].size()) / width;
        routed.replayed_tokens += rows;
        for (int64_t t = 0; t < rows; ++t) routed.replay_overrode += overrode[c.row0[s] + t];
      }
      // [sparse layers, m, k] -> this sequence's [tokens, sparse layers, k].
      auto per_token = [&](const std::vector<int32_t>& in, std::vector<int32_t>* out) {
        out->resize(len * width);
        for (int64_t t = 0; t < len; ++t) {
          for (int64_t li = 0; li < n_sparse; ++li) {
            std::copy(in.begin() + (li * m + c.row0[s] + t) * top_k,
                      in.begin() + (li * m + c.row0[s] + t + 1) * top_k,
                      out->begin() + (t * n_sparse + li) * top_k);
          }
        }
      };
      per_token(record, &routed.used[s]);
      per_token(chosen, &routed.chosen[s]);
    }
    // HF load_balancing_loss_func over the N = sparse layers x rows router outputs:
    // E * sum_e (rows routed to e / N) * (mean router probability of e). Only the probabilities
    // carry a gradient: d/dprobs[row, e] = coef * E * (rows routed to e / N) / N.
    const double rows_total = static_cast<double>(n_sparse * m);
    for (int64_t e = 0; e < n_exp; ++e) {
      routed.aux_loss += n_exp * (expert_rows[e] / rows_total) * (expert_prob[e] / rows_total);
    }
    if (opts.router_aux_loss_coef > 0) {
      c.aux_dprob.resize(n_exp);
      for (int64_t e = 0; e < n_exp; ++e) {
        c.aux_dprob[e] = static_cast<float>(opts.router_aux_loss_coef * n_exp *
                                            (expert_rows[e] / rows_total) / rows_total);
      }
    }
    if (opts.routing_out != nullptr) *opts.routing_out = routed;
  }
  c.inv_final.resize(m);
  c.h_final.resize(m * h);
  const bool rb = policy_.bf16_activations();
  rows_parallel(m, 16, [&](int64_t b, int64_t e) {
    ops::rmsnorm_forward(x.data() + b * h, small_param(layout_.final_norm()), e - b, h,
                         static_cast<float>(config_.rms_norm_eps), c.h_final.data() + b * h,
                         c.inv_final.data() + b);
    if (rb) ops::round_bf16_inplace(c.h_final.data() + b * h, (e - b) * h);
  });
  if (ctx) c.x_final = std::move(x);

  // Logprobs of each next token, lm_head in chunks of rows.
  const int64_t vocab = config_.vocab_size;
  const float inv_t = 1.0f / opts.temperature;
  TokenValues out(n_seq);
  c.lse.assign(m, 0.0f);
  std::vector<float> logits(kHeadChunk * vocab);
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t len = static_cast<int64_t>(batch[s].size()), r0 = c.row0[s];
    out[s].resize(len - 1);
    for (int64_t i0 = 0; i0 < len - 1; i0 += kHeadChunk) {
      const int64_t rows = std::min(kHeadChunk, len - 1 - i0);
      if (auto st = linear_forward(head(), c.h_final.data() + (r0 + i0) * h, rows, nullptr,
                                   logits.data());
          !st.ok()) {
        return st;
      }
      rows_parallel(rows, 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* z = logits.data() + r * vocab;
          const float lse = ops::logsumexp_scaled(z, vocab, inv_t);
          c.lse[r0 + i0 + r] = lse;
          out[s][i0 + r] = z[batch[s][i0 + r + 1]] * inv_t - lse;
        }
      });
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> Model::logits(const std::vector<int32_t>& tokens) const {
  ForwardContext c;
  auto lp = forward({tokens}, {}, &c);
  if (!lp.ok()) return lp.status();
  const int64_t t = static_cast<int64_t>(tokens.size());
  std::vector<float> out(t * config_.vocab_size);
  if (auto s = linear_forward(head(), c.h_final.data(), t, nullptr, out.data()); !s.ok()) return s;
  return out;
}

absl::Status Model::backward(const ForwardContext& c, const TokenValues& dlogp, float* grads,
                             const GradientsFinal& on_final) const {
  FlatGradientSink sink(grads, on_final);
  return backward(c, dlogp, sink);
}

absl::Status Model::backward(const ForwardContext& c, const TokenValues& dlogp,
                             GradientSink& grads) const {
  if (auto s = check_has_weights("backward"); !s.ok()) return s;
  if (storage_ != Storage::kTraining) {
    return absl::FailedPreconditionError("backward: inference-only model");
  }
  const int64_t n_seq = static_cast<int64_t>(c.tokens.size());
  if (static_cast<int64_t>(c.layers.size()) != config_.num_hidden_layers || c.x_final.empty()) {
    return absl::FailedPreconditionError("backward: the forward did not save activations");
  }
  if (static_cast<int64_t>(dlogp.size()) != n_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("backward: dlogp has ", dlogp.size(), " sequences, the forward had ", n_seq));
  }
  for (int64_t s = 0; s < n_seq; ++s) {
    if (dlogp[s].size() + 1 != c.tokens[s].size()) {
      return absl::InvalidArgumentError(absl::StrCat("backward: dlogp[", s, "] has ",
                                                     dlogp[s].size(), " values, expected ",
                                                     c.tokens[s].size() - 1));
    }
    for (float v : dlogp[s]) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat("backward: dlogp[", s, "] not finite"));
      }
    }
  }
  const int64_t m = static_cast<int64_t>(c.pos.size()), h = config_.hidden_size,
                hd = config_.head_dim, qd = config_.q_dim(), kvd = config_.kv_dim(),
                f = config_.intermediate_size, vocab = config_.vocab_size,
                n_kv = config_.num_key_value_heads,
                group = config_.num_attention_heads / config_.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float inv_t = 1.0f / c.temperature;

  // lm_head: dlogits = dlogp * (onehot - softmax(z/T)) / T, recomputed per chunk.
  std::vector<float> dx(m * h, 0.0f), tmp(m * std::max(h, std::max(qd, f)));
  std::vector<float> logits(kHeadChunk * vocab), dchunk(kHeadChunk * h);
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t len = static_cast<int64_t>(c.tokens[s].size()), r0 = c.row0[s];
    for (int64_t i0 = 0; i0 < len - 1; i0 += kHeadChunk) {
      const int64_t rows = std::min(kHeadChunk, len - 1 - i0);
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) any |= dlogp[s][i0 + r] != 0.0f;
      if (!any) continue;
      const float* hs = c.h_final.data() + (r0 + i0) * h;
      if (auto st = linear_forward(head(), hs, rows, nullptr, logits.data()); !st.ok()) return st;
      rows_parallel(rows, 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          float* z = logits.data() + r * vocab;
          const float lse = c.lse[r0 + i0 + r], g = dlogp[s][i0 + r];
          for (int64_t j = 0; j < vocab; ++j) z[j] = -g * std::exp(z[j] * inv_t - lse) * inv_t;
          z[c.tokens[s][i0 + r + 1]] += g * inv_t;
        }
      });
      if (auto st = linear_backward(head(), hs, logits.data(), rows, dchunk.data(),
                                    grads.grad(layout_.lm_head()), nullptr);
          !st.ok()) {
        return st;
      }
      add_inplace(dx.data() + (r0 + i0) * h, dchunk.data(), rows * h);
    }
  }
  // Final norm (in place: dx becomes the gradient at the last layer's output).
  ops::rmsnorm_backward(c.x_final.data(), small_param(layout_.final_norm()), c.inv_final.data(),
                        dx.data(), m, h, tmp.data(), grads.grad(layout_.final_norm()));
  std::copy(tmp.begin(), tmp.begin() + m * h, dx.begin());
  // Parameters are laid out embedding, layers 0..n-1, final norm, lm_head (model/params.h), and
  // the backward runs from the end: a tied lm_head adds into the embedding, which is last.
  grads.final_from(layout_.final_norm());

  std::vector<float> dact(m * f), dg(m * f), du(m * f), dq(m * qd), dk(m * kvd), dv(m * kvd),
      dh(m * h), dO(m * qd);
  LayerActivations recomputed;  // recompute_layers: the layer's forward run again
  std::vector<float> x_in;
  for (int64_t l = config_.num_hidden_layers - 1; l >= 0; --l) {
    const bool recompute = c.recompute_layers && !config_.sparse_layer(l);
    if (recompute) {
      // The forward's layer l again from its saved input (same kernels, same KV rounding): the
      // intermediates below are bit-identical to the ones a full forward would have kept.
      x_in.assign(c.layers[l].x.begin(), c.layers[l].x.end());
      if (auto s = layer_forward(
              l, m, c.pos.data(), x_in.data(), recomputed, true, nullptr, {}, true,
              [&](int64_t, LayerActivations& la) { packed_attention(config_, c, la); });
          !s.ok()) {
        return s;
      }
    }
    const LayerActivations& a = recompute ? recomputed : c.layers[l];
    const LayerOffsets& lo = layout_.layer(l);
    const auto& W = linears_[l];
    if (config_.sparse_layer(l)) {
      // MLP: x_out = x2 + moe(h2) (forward: "x <- x2 + moe(h2)").
      const MoeGradOffsets offsets{.router = lo.router,
                                   .expert_gate = &lo.expert_gate,
                                   .expert_up = &lo.expert_up,
                                   .expert_down = &lo.expert_down,
                                   .shared_gate = lo.shared_gate,
                                   .shared_up = lo.shared_up,
                                   .shared_down = lo.shared_down,
                                   .shared_expert_gate = lo.shared_expert_gate};
      if (auto s =
              moe_backward(moe_[l], moe_options(), offsets, a.moe, a.h2.data(), dx.data(), m,
                           c.aux_dprob.empty() ? nullptr : c.aux_dprob.data(), dh.data(), grads);
          !s.ok()) {
        return s;
      }
    } else {
      // MLP: x_out = x2 + down(silu(gate(h2)) * up(h2)).
      if (auto s = linear_backward(W[6], a.act.data(), dx.data(), m, dact.data(),
                                   grads.grad(lo.down), nullptr);
          !s.ok()) {
        return s;
      }
      ops::swiglu_backward(a.g.data(), a.u.data(), dact.data(), m * f, dg.data(), du.data());
      if (auto s = linear_backward(W[4], a.h2.data(), dg.data(), m, dh.data(), grads.grad(lo.gate),
                                   nullptr);
          !s.ok()) {
        return s;
      }
      if (auto s = linear_backward(W[5], a.h2.data(), du.data(), m, tmp.data(), grads.grad(lo.up),
                                   nullptr);
          !s.ok()) {
        return s;
      }
      add_inplace(dh.data(), tmp.data(), m * h);
    }
    ops::rmsnorm_backward(a.x2.data(), small_param(lo.post_norm), a.inv2.data(), dh.data(), m, h,
                          tmp.data(), grads.grad(lo.post_norm));
    add_inplace(dx.data(), tmp.data(), m * h);  // dx is now d x2
    // Attention: x2 = x + o_proj(attn(q, k, v)).
    if (auto s =
            linear_backward(W[3], a.o.data(), dx.data(), m, dO.data(), grads.grad(lo.o), nullptr);
        !s.ok()) {
      return s;
    }
    std::fill(dq.begin(), dq.end(), 0.0f);
    std::fill(dk.begin(), dk.end(), 0.0f);
    std::fill(dv.begin(), dv.end(), 0.0f);
    parallel_for(n_seq * n_kv, [&](int64_t b, int64_t e) {
      std::vector<float> scores, dscores;
      for (int64_t t = b; t < e; ++t) {
        const int64_t s = t / n_kv, g = t % n_kv;
        const int64_t r0 = c.row0[s], len = static_cast<int64_t>(c.tokens[s].size());
        scores.resize(len);
        dscores.resize(len);
        const int64_t kv_off = r0 * kvd + g * hd;
        for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
          for (int64_t i = 0; i < len; ++i) {
            const int64_t q_off = (r0 + i) * qd + hh * hd;
            ops::attend_row_backward(a.q.data() + q_off, a.k.data() + kv_off, kvd,
                                     a.v.data() + kv_off, kvd, i + 1, hd, scale, dO.data() + q_off,
                                     scores.data(), dscores.data(), dq.data() + q_off,
                                     dk.data() + kv_off, dv.data() + kv_off);
          }
        }
      }
    });
    // K/V rounding is straight-through; undo the rotation.
    const ops::RopeTable rope{hd / 2, config_.max_position_embeddings,
                              const_cast<float*>(rope_cos_.data()),
                              const_cast<float*>(rope_sin_.data())};
    ops::rope_apply(rope, c.pos.data(), m, config_.num_attention_heads, hd, dq.data(), true);
    ops::rope_apply(rope, c.pos.data(), m, n_kv, hd, dk.data(), true);
    if (config_.qk_norm()) {
      // q = q_norm(q_raw), k = k_norm(k_raw) per head (forward: "Qwen3: q [m, heads, hd] <- ...").
      ops::rmsnorm_backward(a.q_raw.data(), small_param(lo.q_norm), a.inv_q.data(), dq.data(),
                            m * config_.num_attention_heads, hd, tmp.data(), grads.grad(lo.q_norm));
      std::copy(tmp.begin(), tmp.begin() + m * qd, dq.begin());
      ops::rmsnorm_backward(a.k_raw.data(), small_param(lo.k_norm), a.inv_k.data(), dk.data(),
                            m * n_kv, hd, tmp.data(), grads.grad(lo.k_norm));
      std::copy(tmp.begin(), tmp.begin() + m * kvd, dk.begin());
    }
    auto bias = [&](int64_t off) { return off >= 0 ? grads.grad(off) : nullptr; };
    if (auto s = linear_backward(W[0], a.h1.data(), dq.data(), m, dh.data(), grads.grad(lo.q),
                                 bias(lo.q_bias));
        !s.ok()) {
      return s;
    }
    if (auto s = linear_backward(W[1], a.h1.data(), dk.data(), m, tmp.data(), grads.grad(lo.k),
                                 bias(lo.k_bias));
        !s.ok()) {
      return s;
    }
    add_inplace(dh.data(), tmp.data(), m * h);
    if (auto s = linear_backward(W[2], a.h1.data(), dv.data(), m, tmp.data(), grads.grad(lo.v),
                                 bias(lo.v_bias));
        !s.ok()) {
      return s;
    }
    add_inplace(dh.data(), tmp.data(), m * h);
    ops::rmsnorm_backward(a.x.data(), small_param(lo.input_norm), a.inv1.data(), dh.data(), m, h,
                          tmp.data(), grads.grad(lo.input_norm));
    add_inplace(dx.data(), tmp.data(), m * h);  // dx is now d x (layer input)
    grads.final_from(lo.input_norm);            // layer l's first parameter
  }
  // Embedding rows (serial: repeated tokens add into the same row).
  float* de = grads.grad(layout_.embed());
  int64_t r = 0;
  for (int64_t s = 0; s < n_seq; ++s) {
    for (int32_t tok : c.tokens[s]) {
      add_inplace(de + static_cast<int64_t>(tok) * h, dx.data() + r * h, h);
      ++r;
    }
  }
  grads.final_from(0);
  return absl::OkStatus();
}

}  // namespace fp8rl::model
