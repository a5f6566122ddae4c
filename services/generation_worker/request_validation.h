// Checks a GenerateRequest against the served model and turns it into scheduler samples. Every
// error is INVALID_ARGUMENT naming the offending field ("samples[2].prompt_tokens[5]: ...",
// "sampling.temperature: ..."), so a caller can fix its request without reading worker logs.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "fp8rl/v1/generation.pb.h"
#include "model/model.h"
#include "model/sampler.h"
#include "services/generation_worker/scheduler.h"

namespace fp8rl::generation {

// Proto SamplingParams -> model::SamplingParams (top_p 0 means off, like 1). Errors name
// "sampling.<field>".
absl::StatusOr<model::SamplingParams> to_sampling_params(const v1::SamplingParams& proto,
                                                         int64_t vocab_size);

// The request's samples, each with the shared sampling params and its own seed. Rules: at least
// one and at most `max_samples` samples; sample ids non-empty and unique; prompts non-empty with
// every id in [0, vocab_size); prompt + max_new_tokens within max_position_embeddings;
// min_weight_version >= 0.
absl::StatusOr<std::vector<SampleSpec>> validate_generate_request(
    const v1::GenerateRequest& request, const model::Model& model, int64_t max_samples);

}  // namespace fp8rl::generation
