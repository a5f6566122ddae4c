// Log-sum-exp and sampling of one vocabulary row in the order of the block-parallel CUDA kernels
// (kernels/cuda/decoder_kernels.cu: log_softmax_block_kernel, sample_block_kernel; one block of
// kRowThreads threads per row), written as plain loops: the CPU reference those kernels are
// tested against. They compute the same function as logsumexp_scaled / sample_row (softmax.h,
// sampling.h) with float64 sums in another order, so the results agree with the serial ones
// except where a float64 rounding (~1e-16 relative) decides: the fp32 lse when log(sum) lies that
// close to an fp32 rounding boundary, the token when the draw lies that close to a cumulative-mass
// boundary (device_math_test checks both on random rows).
//
// The recipe:
//   lse: mx = max_i z[i] * inv_t (exact in any order); thread t sums exp(z[i] * inv_t - mx) over
//        i = t, t + kRowThreads, ... in float64 in index order; each warp adds its lanes with the
//        xor butterfly (warp_order.h); the warps' sums add in warp order; lse = mx + log(sum).
//   greedy: the first maximum of z (block argmax, ties to the lower index), as sample_row.
//   untruncated (top_k == 0, top_p >= 1): u = uniform; the vocabulary is cut into kRowThreads
//        contiguous chunks of C = ceil(vocab / kRowThreads); chunk_sum[c] = float64 sum of
//        e_j = exp(z[j] * inv_t - lse) over the chunk in order; prefix[0] = 0, prefix[c + 1] =
//        prefix[c] + chunk_sum[c]; c* = the first chunk with u < prefix[c* + 1] (none: the token
//        is vocab - 1, as sample_row's fallback); in c*, cum = prefix[c*] + e_j added in order and
//        the token is the first j with u < cum, else the chunk's last token.
//   truncated (top-k / top-p): sample_row_with_lse with this lse (the heap part runs on one
//        thread in the kernel: still the slow path).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/device_math/hd.h"
#include "kernels/device_math/sampling.h"
#include "kernels/device_math/warp_order.h"

namespace fp8rl::kernels::dm {

inline constexpr int kRowThreads = 256;  // threads per block of the per-row kernels
inline constexpr int kRowWarps = kRowThreads / kWarpLanes;

inline float logsumexp_scaled_blocked(const float* z, int64_t n, float inv_t) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float v = z[i] * inv_t;
    mx = mx < v ? v : mx;
  }
  double part[kRowThreads];
  for (int t = 0; t < kRowThreads; ++t) {
    double acc = 0.0;
    for (int64_t i = t; i < n; i += kRowThreads)
      acc += exp_f64(static_cast<double>(z[i] * inv_t - mx));
    part[t] = acc;
  }
  double sum = 0.0;
  for (int w = 0; w < kRowWarps; ++w) sum = sum + tree_sum32<double>(part + w * kWarpLanes);
  return mx + static_cast<float>(log_f64(sum));
}

// Chunk c of the untruncated draw is [c * C, min((c + 1) * C, vocab)).
FP8RL_HD int64_t sample_chunk(int64_t vocab) { return (vocab + kRowThreads - 1) / kRowThreads; }

inline SampleResult sample_row_blocked(const float* z, int64_t vocab, const SampleParams& p,
                                       RngState& rng, int32_t* scratch) {
  const float inv_t = sample_inv_t(p);
  const float lse = logsumexp_scaled_blocked(z, vocab, inv_t);
  if (p.temperature == 0.0f || p.top_k != 0 || p.top_p < 1.0f) {
    return sample_row_with_lse(z, vocab, p, rng, scratch, lse);  // greedy: the first maximum
  }
  const double u = rng_uniform(rng);
  const int64_t chunk = sample_chunk(vocab);
  const auto e = [&](int64_t j) { return exp_f64(static_cast<double>(z[j] * inv_t - lse)); };
  std::vector<double> prefix(kRowThreads + 1, 0.0);
  for (int c = 0; c < kRowThreads; ++c) {
    double acc = 0.0;
    for (int64_t j = c * chunk; j < (c + 1) * chunk && j < vocab; ++j) acc += e(j);
    prefix[c + 1] = prefix[c] + acc;
  }
  SampleResult res;
  res.token = static_cast<int32_t>(vocab - 1);
  for (int c = 0; c < kRowThreads; ++c) {
    if (!(u < prefix[c + 1])) continue;
    const int64_t end = (c + 1) * chunk < vocab ? (c + 1) * chunk : vocab;
    res.token = static_cast<int32_t>(end - 1);
    double cum = prefix[c];
    for (int64_t j = c * chunk; j < end; ++j) {
      cum += e(j);
      if (u < cum) {
        res.token = static_cast<int32_t>(j);
        break;
      }
    }
    break;
  }
  res.full_logprob = z[res.token] * inv_t - lse;
  res.logprob = res.full_logprob;  // nothing truncated: log_kept_mass = 0
  return res;
}

}  // namespace fp8rl::kernels::dm
