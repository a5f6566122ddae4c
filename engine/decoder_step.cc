// The step tables and the layer sequence of engine/decoder_step.h.
#include "engine/decoder_step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fp8rl::engine {

absl::StatusOr<StepTables> build_step_tables(const std::vector<SegmentBlocks>& segments,
                                             int64_t block_tokens, int64_t vocab, int64_t max_pos,
                                             OutputRows out) {
  StepTables t;
  t.n_seg = static_cast<int64_t>(segments.size());
  for (int64_t s = 0; s < t.n_seg; ++s) {
    const SegmentBlocks& seg = segments[s];
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("forward: segment ", s, ": ", why));
    };
    if (seg.blocks == nullptr || seg.blocks->empty()) return bad("no KV blocks");
    if (seg.tokens == nullptr || seg.n < 1) return bad("no tokens");
    if (seg.capacity > static_cast<int64_t>(seg.blocks->size()) * block_tokens) {
      return bad("capacity exceeds its blocks");
    }
    if (seg.pos0 < 0 || seg.pos0 + seg.n > seg.capacity || seg.pos0 + seg.n > max_pos) {
      return bad(absl::StrCat("positions [", seg.pos0, ", ", seg.pos0 + seg.n,
                              ") do not fit its cache of ", seg.capacity));
    }
    for (int64_t i = 0; i < seg.n; ++i) {
      if (seg.tokens[i] < 0 || seg.tokens[i] >= vocab) {
        return bad(absl::StrCat("token id ", seg.tokens[i], " is out of range [0, ", vocab, ")"));
      }
    }
    t.width = std::max<int64_t>(t.width, static_cast<int64_t>(seg.blocks->size()));
  }
  for (int64_t s = 0; s < t.n_seg; ++s) {
    const SegmentBlocks& seg = segments[s];
    for (int64_t i = 0; i < seg.n; ++i) {
      const int32_t row = static_cast<int32_t>(t.tokens.size());
      t.tokens.push_back(seg.tokens[i]);
      t.pos.push_back(static_cast<int32_t>(seg.pos0 + i));
      t.row_seq.push_back(static_cast<int32_t>(s));
      const bool last = i == seg.n - 1;
      if (out == OutputRows::kLastOfSegment ? last : !last) {
        t.out_rows.push_back(row);
        if (out == OutputRows::kAllButLast) t.targets.push_back(seg.tokens[i + 1]);
      }
    }
  }
  t.rows = static_cast<int64_t>(t.tokens.size());
  t.block_table.resize(t.n_seg * t.width);
  for (int64_t s = 0; s < t.n_seg; ++s) {
    const std::vector<int32_t>& b = *segments[s].blocks;
    for (int64_t j = 0; j < t.width; ++j) {
      t.block_table[s * t.width + j] = b[std::min<int64_t>(j, static_cast<int64_t>(b.size()) - 1)];
    }
  }
  return t;
}

absl::Status decoder_step(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                          const model::ParamLayout& layout, DecoderOps& ops, const StepBuffers& b,
                          const StepTables& t,
                          const std::function<absl::Status(int64_t, const float*)>& layer_hook) {
  const int64_t m = t.rows, h = config.hidden_size, qd = config.q_dim(), kvd = config.kv_dim(),
                f = config.intermediate_size, hd = config.head_dim, nh = config.num_attention_heads,
                nkv = config.num_key_value_heads;
  const bool rb = policy.bf16_activations();
#define FP8RL_STEP(expr)                               \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)
  FP8RL_STEP(ops.load_tables(t));
  FP8RL_STEP(ops.embed(m, b.x));
  auto bias = [&](int64_t off) { return off >= 0 ? ops.small(off) : nullptr; };
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const model::LayerOffsets& lo = layout.layer(l);
    // h1 = input_norm(x); q, k, v = projections of h1 (Qwen2: with bias).
    FP8RL_STEP(ops.rmsnorm(b.x, ops.small(lo.input_norm), m, h, rb, b.h1));
    FP8RL_STEP(ops.linear(l, 0, b.h1, m, bias(lo.q_bias), b.q));
    FP8RL_STEP(ops.linear(l, 1, b.h1, m, bias(lo.k_bias), b.k));
    FP8RL_STEP(ops.linear(l, 2, b.h1, m, bias(lo.v_bias), b.v));
    float* q = b.q;
    float* k = b.k;
    if (config.qk_norm()) {
      // Qwen3: per-head RMSNorm of q [m, nh, hd] and k [m, nkv, hd] before RoPE.
      FP8RL_STEP(ops.rmsnorm(b.q, ops.small(lo.q_norm), m * nh, hd, rb, b.qn));
      FP8RL_STEP(ops.rmsnorm(b.k, ops.small(lo.k_norm), m * nkv, hd, rb, b.kn));
      q = b.qn;
      k = b.kn;
    }
    FP8RL_STEP(ops.rope(m, nh, rb, q));
    FP8RL_STEP(ops.rope(m, nkv, rb, k));
    // o = attention over the paged cache (after writing this step's k, v into it).
    FP8RL_STEP(ops.attention(l, q, k, b.v, m, b.o));
    if (rb) FP8RL_STEP(ops.round_bf16(b.o, m * qd));
    // x2 = x + o_proj(o); h2 = post_norm(x2).
    FP8RL_STEP(ops.linear(l, 3, b.o, m, nullptr, b.x2));
    FP8RL_STEP(ops.add(b.x2, b.x, m * h, rb));
    FP8RL_STEP(ops.rmsnorm(b.x2, ops.small(lo.post_norm), m, h, rb, b.h2));
    if (config.sparse_layer(l)) {
      // x = x2 + moe(h2); the routing of the rows into b.routing[sparse index].
      int32_t* sel = b.routing != nullptr
                         ? b.routing + config.sparse_index(l) * m * config.moe.num_experts_per_tok
                         : nullptr;
      FP8RL_STEP(ops.moe(l, b.h2, m, b.x, sel));
    } else {
      // x = x2 + down(silu(gate(h2)) * up(h2)).
      FP8RL_STEP(ops.linear(l, 4, b.h2, m, nullptr, b.g));
      FP8RL_STEP(ops.linear(l, 5, b.h2, m, nullptr, b.u));
      FP8RL_STEP(ops.swiglu(b.g, b.u, m * f, rb, b.act));
      FP8RL_STEP(ops.linear(l, 6, b.act, m, nullptr, b.x));
    }
    FP8RL_STEP(ops.add(b.x, b.x2, m * h, rb));
    if (layer_hook) FP8RL_STEP(layer_hook(l, b.x));
  }
  (void)kvd;
  // sel = final_norm(x[out_rows]) (h1 holds the gathered rows).
  const int64_t n_out = static_cast<int64_t>(t.out_rows.size());
  FP8RL_STEP(ops.gather_out_rows(b.x, h, n_out, b.h1));
  FP8RL_STEP(ops.rmsnorm(b.h1, ops.small(layout.final_norm()), n_out, h, rb, b.sel));
#undef FP8RL_STEP
  return absl::OkStatus();
}

}  // namespace fp8rl::engine
