// Temperature / top-k / top-p sampling with deterministic per-sequence random streams.
#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "model/ops.h"

namespace fp8rl::model {

absl::Status validate_sampling_params(const SamplingParams& p, int64_t vocab_size) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be >= 0 and finite, got ", p.temperature));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p: must be in (0, 1], got ", p.top_p));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k: must be >= 0, got ", p.top_k));
  }
  if (p.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens: must be >= 0, got ", p.max_new_tokens));
  }
  for (int32_t t : p.stop_tokens) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_tokens: id ", t, " is out of range [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

int32_t Sampler::sample(const float* z, int64_t vocab, const SamplingParams& p, Rng& rng,
                        float* logprob, float* full_logprob) {
  const bool greedy = p.temperature == 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / p.temperature;
  const float lse = ops::logsumexp_scaled(z, vocab, inv_t);
  int32_t token = 0;
  double log_kept_mass = 0.0;  // log M of the kept set (0: nothing truncated)
  if (greedy) {
    token = static_cast<int32_t>(std::max_element(z, z + vocab) - z);
  } else if (p.top_k == 0 && p.top_p >= 1.0f) {
    // Inverse CDF over the full distribution, in token order.
    const double u = rng.uniform();
    double cum = 0;
    token = static_cast<int32_t>(vocab - 1);
    for (int64_t j = 0; j < vocab; ++j) {
      cum += std::exp(static_cast<double>(z[j] * inv_t - lse));
      if (u < cum) {
        token = static_cast<int32_t>(j);
        break;
      }
    }
  } else {
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
    auto by_logit = [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_logit);
    // Keep the smallest prefix of the top k whose mass reaches top_p.
    int64_t keep = 0;
    double mass = 0;
    while (keep < k) {
      mass += std::exp(static_cast<double>(z[order_[keep]] * inv_t - lse));
      ++keep;
      if (mass >= p.top_p) break;
    }
    const double u = rng.uniform() * mass;
    double cum = 0;
    token = order_[keep - 1];
    for (int64_t i = 0; i < keep; ++i) {
      cum += std::exp(static_cast<double>(z[order_[i]] * inv_t - lse));
      if (u < cum) {
        token = order_[i];
        break;
      }
    }
    log_kept_mass = std::log(mass);
  }
  const float full = z[token] * inv_t - lse;
  *logprob = static_cast<float>(static_cast<double>(full) - log_kept_mass);
  if (full_logprob != nullptr) *full_logprob = full;
  return token;
}

}  // namespace fp8rl::model
