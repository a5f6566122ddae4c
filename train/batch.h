// Training sequences as the trainer receives them and as the update consumes them: the padded
// B x L layout of rl/importance.h (L = longest response). Validation names the offending field.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "rl/importance.h"

namespace fp8rl::train {

// One sequence: prompt then response tokens. loss_mask and gen_logprobs are empty or have one
// value per response token; loss_mask values are 0 or 1 (empty = every response token counts).
struct Sequence {
  std::vector<int32_t> tokens;
  int64_t prompt_length = 0;
  std::vector<float> loss_mask;
  std::vector<float> gen_logprobs;
  float advantage = 0.0f;
  // Mixture of experts: the generation's routing, [tokens, sparse layers, top_k] for the first
  // tokens (model::TokenRouting); may be empty.
  std::vector<int32_t> routing;
};

// A sequence batch after validation. Response token j of sequence b is
// tokens[b][prompt_length[b] + j]; padded arrays are [B*L], row b, column j.
struct PackedBatch {
  model::TokenBatch tokens;
  std::vector<int64_t> prompt_length;  // [B]
  int64_t length = 0;                  // L
  std::vector<uint8_t> mask;           // [B*L] 1 = response token in the loss
  std::vector<float> gen_logprobs;     // [B*L] (0 where absent)
  std::vector<float> advantages;       // [B]
  int64_t valid_tokens = 0;
  float temperature = 1.0f;  // logprobs are of logits / temperature (the sampling temperature)
  // Mixture of experts: per sequence the generation's routing (checked against the model), whether
  // the forwards replay it, and the load-balancing loss weight the backward adds.
  model::TokenRouting routing;
  bool replay_routing = false;
  double router_aux_loss_coef = 0.0;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  rl::TokenLayout layout() const { return {size(), length}; }
  // Sequences [begin, end) as a batch of their own (same L).
  PackedBatch slice(int64_t begin, int64_t end) const;
};

// Validates `seqs` against `model` (token ids, lengths, masks) and packs them. `name` is the
// field name for errors ("batch[2].loss_mask: ..."); require_gen demands gen_logprobs.
absl::StatusOr<PackedBatch> pack_sequences(std::span<const Sequence> seqs,
                                           const model::Model& model, std::string_view name,
                                           bool require_gen);

// The temperature whose logits / T distribution the logprobs are taken of: the sampling
// temperature of the rollouts; 0 (unset, or greedy rollouts) means 1. `field` names it in errors.
absl::StatusOr<float> logprob_temperature(double t, std::string_view field);

// Response-token logprobs of `batch` under `model`, [B*L] (0 at padding): a forward only, on the
// CPU engine (engine::cpu_logprobs; the reference policy, tests). With `calibrator`, records each
// sequence's K/V amax per layer; with `routing` (mixture of experts), receives the routing the
// forward used.
absl::StatusOr<std::vector<float>> response_logprobs(const model::Model& model,
                                                     const PackedBatch& batch,
                                                     model::KvCalibrator* calibrator = nullptr,
                                                     model::ForwardRouting* routing = nullptr);

// Per-token values in the model's layout (value [i-1] belongs to token i, a forward's logprobs)
// -> the padded [B*L] response layout (0 at padding).
std::vector<float> gather_response(const PackedBatch& batch, const model::TokenValues& values);

// dLoss/dlogprob in the model's layout (value [i-1] belongs to token i) from the padded [B*L]
// gradient over response tokens.
model::TokenValues scatter_response(const PackedBatch& batch, std::span<const float> padded);

}  // namespace fp8rl::train
