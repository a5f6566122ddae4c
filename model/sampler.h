// Token sampling with temperature, top-k and top-p from one sequence's logits, and the logprob of
// the sampled token under the distribution it was actually drawn from (the behaviour policy that
// IS correction needs), plus its logprob under the untruncated logits / temperature.
//
// The sampled distribution: p(x) = softmax(logits / T)(x) / M for x in the kept set K, 0 outside,
// where K is the smallest prefix of the tokens sorted by logit (descending, ties by lower id),
// limited to the top_k first, whose softmax mass reaches top_p, and M = sum_{x in K} softmax(x).
// With top_k = 0 and top_p = 1, K is the whole vocabulary and M = 1.
//
// The trainer recomputes logprobs of the full softmax(logits / T) (the policy being learned), so
// with top_p < 1 or top_k > 0 every sampled token carries a real mismatch log M <= 0 on top of any
// precision mismatch: the IS weight exp(prev - gen) corrects it and the mismatch metrics show it
// (rl/mismatch.h splits the two with the full logprob). Tokens outside K are never sampled and
// cannot be corrected for; see docs/design/fp8-recipe.md.
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
  // Samples from logits[vocab]. *logprob = log p(token) under the sampled distribution above,
  // i.e. log softmax(logits / T)[token] - log M; *full_logprob (if not null) =
  // log softmax(logits / T)[token]. Greedy (T = 0) reports both at T = 1 without truncation.
  int32_t sample(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng,
                 float* logprob, float* full_logprob = nullptr);

 private:
  std::vector<int32_t> order_;  // scratch, reused across calls
};

}  // namespace fp8rl::model
