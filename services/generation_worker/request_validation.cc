// Field-by-field validation of Generate requests (see request_validation.h).
#include "services/generation_worker/request_validation.h"

#include <cmath>
#include <string>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace fp8rl::generation {

absl::StatusOr<model::SamplingParams> to_sampling_params(const v1::SamplingParams& proto,
                                                         int64_t vocab_size) {
  auto bad = [](const std::string& field, const std::string& message) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", field, ": ", message));
  };
  if (!std::isfinite(proto.temperature()) || proto.temperature() < 0) {
    return bad("temperature", absl::StrCat("must be >= 0 and finite, got ", proto.temperature()));
  }
  if (!std::isfinite(proto.top_p()) || proto.top_p() < 0 || proto.top_p() > 1) {
    return bad("top_p", absl::StrCat("must be in [0, 1] (0 or 1: off), got ", proto.top_p()));
  }
  if (proto.top_k() < 0) return bad("top_k", absl::StrCat("must be >= 0, got ", proto.top_k()));
  if (proto.max_new_tokens() < 1) {
    return bad("max_new_tokens", absl::StrCat("must be >= 1, got ", proto.max_new_tokens()));
  }
  for (int i = 0; i < proto.stop_token_ids_size(); ++i) {
    const int32_t id = proto.stop_token_ids(i);
    if (id < 0 || id >= vocab_size) {
      return bad(absl::StrCat("stop_token_ids[", i, "]"),
                 absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  model::SamplingParams p;
  p.temperature = proto.temperature();
  p.top_p = proto.top_p() == 0 ? 1.0f : proto.top_p();
  p.top_k = proto.top_k();
  p.max_new_tokens = proto.max_new_tokens();
  p.stop_tokens.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  // Whatever else the sampler requires, with its message under the same field prefix.
  if (absl::Status s = model::validate_sampling_params(p, vocab_size); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", s.message()));
  }
  return p;
}

absl::StatusOr<std::vector<SampleSpec>> validate_generate_request(
    const v1::GenerateRequest& request, const model::Model& model, int64_t max_samples) {
  const model::ModelConfig& config = model.config();
  if (request.min_weight_version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_weight_version: must be >= 0, got ", request.min_weight_version()));
  }
  if (request.samples_size() == 0) {
    return absl::InvalidArgumentError("samples: at least one sample is required");
  }
  if (request.samples_size() > max_samples) {
    return absl::InvalidArgumentError(absl::StrCat("samples: ", request.samples_size(),
                                                   " samples exceed the limit of ", max_samples,
                                                   " per request"));
  }
  absl::StatusOr<model::SamplingParams> params =
      to_sampling_params(request.sampling(), config.vocab_size);
  if (!params.ok()) return params.status();

  std::vector<SampleSpec> out;
  out.reserve(request.samples_size());
  std::unordered_set<std::string> ids;
  for (int i = 0; i < request.samples_size(); ++i) {
    const v1::SampleRequest& s = request.samples(i);
    const std::string field = absl::StrCat("samples[", i, "]");
    if (s.sample_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".sample_id: must not be empty"));
    }
    if (!ids.insert(s.sample_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".sample_id: duplicate '", s.sample_id(), "'"));
    }
    if (s.prompt_tokens_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".prompt_tokens: must hold at least one token"));
    }
    for (int t = 0; t < s.prompt_tokens_size(); ++t) {
      const int32_t id = s.prompt_tokens(t);
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".prompt_tokens[", t, "]: token id ",
                                                       id, " is outside the vocabulary [0, ",
                                                       config.vocab_size, ")"));
      }
    }
    const int64_t total = s.prompt_tokens_size() + params->max_new_tokens;
    if (total > config.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".prompt_tokens: ", s.prompt_tokens_size(), " prompt tokens + ",
                       params->max_new_tokens, " new tokens exceed the model's context of ",
                       config.max_position_embeddings));
    }
    SampleSpec spec;
    spec.sample_id = s.sample_id();
    spec.prompt.assign(s.prompt_tokens().begin(), s.prompt_tokens().end());
    spec.params = *params;
    spec.params.seed = s.seed();
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace fp8rl::generation
