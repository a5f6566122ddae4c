// Validation and packing of training sequences, and response logprobs in the padded layout.
#include "train/batch.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cpu/train_ops.h"

namespace fp8rl::train {

PackedBatch PackedBatch::slice(int64_t begin, int64_t end) const {
  PackedBatch out;
  out.length = length;
  out.tokens.assign(tokens.begin() + begin, tokens.begin() + end);
  out.prompt_length.assign(prompt_length.begin() + begin, prompt_length.begin() + end);
  out.mask.assign(mask.begin() + begin * length, mask.begin() + end * length);
  out.gen_logprobs.assign(gen_logprobs.begin() + begin * length,
                          gen_logprobs.begin() + end * length);
  out.advantages.assign(advantages.begin() + begin, advantages.begin() + end);
  out.temperature = temperature;
  if (!routing.empty()) out.routing.assign(routing.begin() + begin, routing.begin() + end);
  out.replay_routing = replay_routing;
  out.router_aux_loss_coef = router_aux_loss_coef;
  for (uint8_t m : out.mask) out.valid_tokens += m;
  return out;
}

absl::StatusOr<PackedBatch> pack_sequences(std::span<const Sequence> seqs,
                                           const model::Model& model, std::string_view name,
                                           bool require_gen) {
  if (seqs.empty())
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), ": must not be empty"));
  PackedBatch b;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = seqs[i];
    const std::string field = absl::StrCat(std::string(name), "[", i, "]");
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".tokens: needs a prompt and a response (>= 2 tokens), got ", n));
    }
    if (s.prompt_length < 1 || s.prompt_length >= n) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".prompt_length: must be in [1, ",
                                                     n - 1, "], got ", s.prompt_length));
    }
    if (auto st = model.check_tokens(s.tokens); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat(field, ".tokens: ", st.message()));
    }
    const int64_t resp = n - s.prompt_length;
    const int64_t n_mask = static_cast<int64_t>(s.loss_mask.size());
    const int64_t n_gen = static_cast<int64_t>(s.gen_logprobs.size());
    if (n_mask != 0 && n_mask != resp) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".loss_mask: has ", n_mask, " values, the response has ", resp, " tokens"));
    }
    for (int64_t j = 0; j < n_mask; ++j) {
      if (s.loss_mask[j] != 0.0f && s.loss_mask[j] != 1.0f) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".loss_mask[", j, "]: must be 0 or 1, got ", s.loss_mask[j]));
      }
    }
    if (n_gen != resp && (require_gen || n_gen != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".gen_logprobs: has ", n_gen,
                                                     " values, the response has ", resp, " tokens",
                                                     require_gen ? "" : " (or leave it empty)"));
    }
    if (!std::isfinite(s.advantage)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".advantage: must be finite"));
    }
    b.length = std::max(b.length, resp);
    b.tokens.push_back(s.tokens);
    b.prompt_length.push_back(s.prompt_length);
    b.advantages.push_back(s.advantage);
    b.routing.push_back(s.routing);
  }
  if (auto st = model.check_routing(b.tokens, b.routing); !st.ok()) {
    // "routing[3]: ..." -> "batch[3].routed_experts: ..."
    std::string message(st.message());
    if (const size_t close = message.find("]: ");
        message.rfind("routing[", 0) == 0 && close != std::string::npos) {
      message = absl::StrCat(std::string(name), "[", message.substr(8, close - 8),
                             "].routed_experts: ", message.substr(close + 3));
    }
    return absl::InvalidArgumentError(message);
  }
  const int64_t B = b.size(), L = b.length;
  b.mask.assign(B * L, 0);
  b.gen_logprobs.assign(B * L, 0.0f);
  for (int64_t i = 0; i < B; ++i) {
    const Sequence& s = seqs[i];
    const int64_t resp = static_cast<int64_t>(b.tokens[i].size()) - b.prompt_length[i];
    for (int64_t j = 0; j < resp; ++j) {
      const bool on = s.loss_mask.empty() || s.loss_mask[j] != 0.0f;
      b.mask[i * L + j] = on ? 1 : 0;
      b.valid_tokens += on ? 1 : 0;
      if (!s.gen_logprobs.empty()) b.gen_logprobs[i * L + j] = s.gen_logprobs[j];
    }
  }
  return b;
}

absl::StatusOr<float> logprob_temperature(double t, std::string_view field) {
  if (!std::isfinite(t) || t < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), ": must be >= 0 and finite, got ", t));
  }
  return t == 0 ? 1.0f : static_cast<float>(t);
}

absl::StatusOr<std::vector<float>> response_logprobs(const model::Model& model,
                                                     const PackedBatch& batch,
                                                     model::KvCalibrator* calibrator,
                                                     model::ForwardRouting* routing) {
  engine::TrainStepOptions options;
  options.temperature = batch.temperature;
  options.calibrator = calibrator;
  if (batch.replay_routing) options.replay = &batch.routing;
  options.router_aux_loss_coef = batch.router_aux_loss_coef;
  options.routing_out = routing;
  absl::StatusOr<model::TokenValues> lp = engine::cpu_logprobs(model, batch.tokens, options);
  if (!lp.ok()) return lp.status();
  return gather_response(batch, *lp);
}

std::vector<float> gather_response(const PackedBatch& batch, const model::TokenValues& values) {
  const int64_t L = batch.length;
  std::vector<float> out(batch.size() * L, 0.0f);
  for (int64_t b = 0; b < batch.size(); ++b) {
    const int64_t p = batch.prompt_length[b];
    const int64_t resp = static_cast<int64_t>(batch.tokens[b].size()) - p;
    for (int64_t j = 0; j < resp; ++j) out[b * L + j] = values[b][p - 1 + j];
  }
  return out;
}

model::TokenValues scatter_response(const PackedBatch& batch, std::span<const float> padded) {
  model::TokenValues out(batch.size());
  const int64_t L = batch.length;
  for (int64_t b = 0; b < batch.size(); ++b) {
    const int64_t n = static_cast<int64_t>(batch.tokens[b].size());
    const int64_t p = batch.prompt_length[b];
    out[b].assign(n - 1, 0.0f);
    for (int64_t j = 0; j < n - p; ++j) out[b][p - 1 + j] = padded[b * L + j];
  }
  return out;
}

}  // namespace fp8rl::train
