// The mixture-of-experts MLP of qwen3_moe / qwen2_moe layers on the CPU reference path: a router
// picks the top-k of E experts per token, tokens are grouped by expert, and each expert's SwiGLU
// runs as three linears over its contiguous token group (a grouped GEMM: the layout a GPU grouped
// FP8 GEMM would take, one problem per expert). Forward, backward, routing replay and the
// load-balancing statistics (docs/design/model.md "Mixture of experts").
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "model/gradient_sink.h"
#include "model/linear.h"
#include "model/params.h"

namespace fp8rl::model {

// A router matrix W [out, in] (mlp.gate [E, H], shared_expert_gate [1, H]). Never FP8: its
// output decides discrete expert choices, and a rounding of the weights that flips a choice
// changes a token's whole MLP. The values are the master rounded to bf16 when activations are
// bf16 (what the checkpoint and the weight-sync payload carry, so generation and training use
// the same numbers), the fp32 master otherwise; the logits are accumulated in double and rounded
// to fp32 once, so a token's routing does not depend on the batch it runs in.
struct RouterWeight {
  int64_t out = 0, in = 0;
  std::vector<double> w;  // [out, in]
};

// Working copies of one sparse layer's MLP.
struct MoeLayerWeights {
  RouterWeight router;                               // [E, H]
  std::vector<std::array<LinearWeight, 3>> experts;  // per expert: gate, up [F, H]; down [H, F]
  bool has_shared = false;
  std::array<LinearWeight, 3> shared;  // qwen2_moe shared expert: gate, up, down
  RouterWeight shared_gate;            // [1, H]
};

// Tokens grouped by expert: slots are (row, k) pairs, sorted by expert then row. Expert e owns
// grouped rows [offset[e], offset[e + 1]).
struct ExpertGroups {
  std::vector<int64_t> offset;    // [E + 1]
  std::vector<int32_t> slot_row;  // [m * k]: the token row of each grouped slot
  std::vector<int32_t> slot_of;   // [m * k]: grouped position of (row, k) at row * k + k
};

// What a sparse layer's forward keeps (for its backward and for the routing record).
struct MoeActivations {
  std::vector<float> probs;     // [m, E] softmax of the router logits (fp32)
  std::vector<int32_t> sel;     // [m, k] chosen experts, in descending probability
  std::vector<float> weight;    // [m, k] their mixing weights
  std::vector<float> prob_sum;  // [m] sum of the kept probabilities (norm_topk_prob)
  // [m, k] the router's own top-k, in descending probability: `sel` unless `forced` replaced it.
  std::vector<int32_t> router_sel;
  // Rows given `forced` experts: 1 where the router's own top-k set differs from them.
  std::vector<uint8_t> overrode;  // [m]
  ExpertGroups groups;
  std::vector<float> xs;             // [m * k, H] the grouped inputs (scratch)
  std::vector<float> g, u, act, ys;  // grouped: [m * k, F] x3 and the experts' outputs [m * k, H]
  std::vector<float> z, sg, su, sact, s_out;  // shared expert: gate logit [m], [m, Fs] x3, [m, H]
};

struct MoeOptions {
  int64_t top_k = 1;
  bool norm_topk_prob = false;
  bool bf16 = false;  // bf16 activations: round the expert outputs and mixing weights
};

// out[m, H] = sum_k weight[r, k] * expert_{sel[r, k]}(x[r]) (+ sigmoid(shared_gate . x[r]) *
// shared(x[r])). x is [m, H]. `forced` ([m, k] expert ids, or nullptr) replays a recorded
// routing: rows whose first id is >= 0 use those experts (weights from the current router
// probabilities at them), rows holding -1 route freely. Ids are checked by the caller.
absl::Status moe_forward(const MoeLayerWeights& w, const MoeOptions& opt, const float* x, int64_t m,
                         const int32_t* forced, MoeActivations* a, float* out);

// Gradient offsets of one sparse layer (GradientSink::grad(offset)), from ParamLayout.
struct MoeGradOffsets {
  int64_t router = -1;
  const std::vector<int64_t>* expert_gate = nullptr;
  const std::vector<int64_t>* expert_up = nullptr;
  const std::vector<int64_t>* expert_down = nullptr;
  int64_t shared_gate = -1, shared_up = -1, shared_down = -1, shared_expert_gate = -1;
};

// Backward of moe_forward (the forward's activations `a` and input x): dx[m, H] is overwritten
// with dL/dx, parameter gradients are added into grads (every tensor's storage asked for before
// the experts' threads start). `dprob_extra` ([E] or nullptr) is added to dL/dprobs[r, e] of
// every row (the load-balancing loss's gradient).
absl::Status moe_backward(const MoeLayerWeights& w, const MoeOptions& opt,
                          const MoeGradOffsets& offsets, const MoeActivations& a, const float* x,
                          const float* dout, int64_t m, const float* dprob_extra, float* dx,
                          GradientSink& grads);

// Tokens per expert of one layer's routing: counts[e] = rows with e among their k choices.
std::vector<int64_t> expert_counts(const std::vector<int32_t>& sel, int64_t num_experts);

// Tokens routed differently by two routing records of the same sequences ([tokens, sparse
// layers, k] each, `width` = sparse layers x k values per token): a token differs when, in some
// layer, its set of k experts differs (order does not matter). Compares the tokens both cover.
struct RoutingDifference {
  int64_t tokens = 0, differ = 0;
};
RoutingDifference routing_difference(const std::vector<std::vector<int32_t>>& a,
                                     const std::vector<std::vector<int32_t>>& b, int64_t width,
                                     int64_t k);

}  // namespace fp8rl::model
