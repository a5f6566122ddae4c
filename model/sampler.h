// Token sampling with temperature, top-k and top-p from one sequence's logits, and the logprob of
// the sampled token under logits / temperature (the distribution the trainer recomputes).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "model/rng.h"

namespace fp8rl::model {

struct SamplingParams {
  // 0 means greedy (argmax); its logprobs are then taken at temperature 1.
  float temperature = 1.0f;
  float top_p = 1.0f;  // nucleus mass in (0, 1]
  int64_t top_k = 0;   // 0: off
  int64_t max_new_tokens = 16;
  std::vector<int32_t> stop_tokens = {};  // generation ends after emitting one (it is kept)
  uint64_t seed = 0;
};

// Errors name the field: "temperature: must be >= 0 and finite, got -1".
absl::Status validate_sampling_params(const SamplingParams& params, int64_t vocab_size);

class Sampler {
 public:
  // Samples from logits[vocab]; *logprob = log softmax(logits / T)[token] (T = 1 when greedy).
  int32_t sample(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng,
                 float* logprob);

 private:
  std::vector<int32_t> order_;  // scratch, reused across calls
};

}  // namespace fp8rl::model
