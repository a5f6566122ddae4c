// Temperature / top-k / top-p sampling of one logits row with a per-sample random stream, shared
// by the CPU reference and the CUDA kernel. Reports the logprob under the distribution actually
// sampled from (softmax(z/T) restricted to the kept set K and renormalised) and the full one.
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"
#include "kernels/device_math/softmax.h"

namespace fp8rl::kernels::dm {

// xoshiro256** seeded by splitmix64: the same stream as model/rng.h Rng for the same seed.
struct RngState {
  uint64_t s[4];
};

FP8RL_HD uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

FP8RL_HD RngState rng_seed(uint64_t seed) {
  RngState r;
  uint64_t st = seed;
  for (int i = 0; i < 4; ++i) r.s[i] = splitmix64_next(st);
  return r;
}

FP8RL_HD uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

FP8RL_HD uint64_t rng_next(RngState& r) {
  const uint64_t result = rotl64(r.s[1] * 5, 7) * 9;
  const uint64_t t = r.s[1] << 17;
  r.s[2] ^= r.s[0];
  r.s[3] ^= r.s[1];
  r.s[1] ^= r.s[2];
  r.s[0] ^= r.s[3];
  r.s[2] ^= t;
  r.s[3] = rotl64(r.s[3], 45);
  return result;
}

// Uniform in [0, 1) with 53 random bits.
FP8RL_HD double rng_uniform(RngState& r) {
  return static_cast<double>(rng_next(r) >> 11) * 0x1.0p-53;
}

struct SampleParams {
  float temperature = 1.0f;  // 0: greedy (argmax); logprobs then at T = 1, untruncated
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0: off
};

// Token order of the truncation: higher logit first, ties by lower id.
FP8RL_HD bool logit_before(const float* z, int32_t a, int32_t b) {
  return z[a] > z[b] || (z[a] == z[b] && a < b);
}

// Restores the max-heap property (by logit_before) below node i of heap[0, size).
FP8RL_HD void heap_sift_down(const float* z, int32_t* heap, int64_t size, int64_t i) {
  for (;;) {
    int64_t best = i;
    const int64_t l = 2 * i + 1, r = 2 * i + 2;
    if (l < size && logit_before(z, heap[l], heap[best])) best = l;
    if (r < size && logit_before(z, heap[r], heap[best])) best = r;
    if (best == i) return;
    const int32_t t = heap[i];
    heap[i] = heap[best];
    heap[best] = t;
    i = best;
  }
}

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;       // under the sampled (truncated, renormalised) distribution
  float full_logprob = 0.0f;  // under softmax(z / T)
};

// Samples one token from z[vocab]; `scratch` holds vocab int32 (used only with top-k/top-p).
// The arithmetic and the random draws are model/sampler.cc Sampler::sample's: the kept set is the
// smallest prefix of the top_k tokens in logit_before order whose softmax mass (float64, summed
// in that order) reaches top_p; u = uniform * mass; the token is the first whose cumulative mass
// exceeds u. The order is produced lazily by a heap (pop only as many as are kept), which gives
// the same prefix as a sort because logit_before is a strict total order.
//
// sample_row_with_lse is the same with lse = logsumexp_scaled(z, vocab, sample_inv_t(p)) given
// (the block-parallel kernel computes it in its own order, kernels/device_math/sampling_blocked.h).
FP8RL_HD float sample_inv_t(const SampleParams& p) {
  return p.temperature == 0.0f ? 1.0f : 1.0f / p.temperature;
}

FP8RL_HD SampleResult sample_row_with_lse(const float* z, int64_t vocab, const SampleParams& p,
                                          RngState& rng, int32_t* scratch, float lse) {
  const bool greedy = p.temperature == 0.0f;
  const float inv_t = sample_inv_t(p);
  SampleResult res;
  double log_kept_mass = 0.0;
  if (greedy) {
    int64_t best = 0;  // the first maximum, as std::max_element
    for (int64_t j = 1; j < vocab; ++j) {
      if (z[best] < z[j]) best = j;
    }
    res.token = static_cast<int32_t>(best);
  } else if (p.top_k == 0 && p.top_p >= 1.0f) {
    const double u = rng_uniform(rng);
    double cum = 0.0;
    res.token = static_cast<int32_t>(vocab - 1);
    for (int64_t j = 0; j < vocab; ++j) {
      cum += exp_f64(static_cast<double>(z[j] * inv_t - lse));
      if (u < cum) {
        res.token = static_cast<int32_t>(j);
        break;
      }
    }
  } else {
    for (int64_t j = 0; j < vocab; ++j) scratch[j] = static_cast<int32_t>(j);
    for (int64_t i = vocab / 2 - 1; i >= 0; --i) heap_sift_down(z, scratch, vocab, i);
    const int64_t k = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
    // Pop the kept prefix: the i-th popped token goes to scratch[vocab - 1 - i].
    int64_t keep = 0, size = vocab;
    double mass = 0.0;
    while (keep < k) {
      const int32_t top = scratch[0];
      scratch[0] = scratch[size - 1];
      scratch[size - 1] = top;
      --size;
      heap_sift_down(z, scratch, size, 0);
      mass += exp_f64(static_cast<double>(z[top] * inv_t - lse));
      ++keep;
      if (mass >= p.top_p) break;
    }
    const double u = rng_uniform(rng) * mass;
    double cum = 0.0;
    res.token = scratch[vocab - keep];
    for (int64_t i = 0; i < keep; ++i) {
      const int32_t t = scratch[vocab - 1 - i];
      cum += exp_f64(static_cast<double>(z[t] * inv_t - lse));
      if (u < cum) {
        res.token = t;
        break;
      }
    }
    log_kept_mass = log_f64(mass);
  }
  const float full = z[res.token] * inv_t - lse;
  res.full_logprob = full;
  res.logprob = static_cast<float>(static_cast<double>(full) - log_kept_mass);
  return res;
}

FP8RL_HD SampleResult sample_row(const float* z, int64_t vocab, const SampleParams& p,
                                 RngState& rng, int32_t* scratch) {
  return sample_row_with_lse(z, vocab, p, rng, scratch,
                             logsumexp_scaled(z, vocab, sample_inv_t(p)));
}

}  // namespace fp8rl::kernels::dm
