// Tests of model/sampler.h and model/kv_calibration.h against independent references: the
// logprob the sampler reports under top-p / top-k is that of the truncated, renormalized
// distribution (closed forms by hand, and a float64 reference written from the definition on
// random logits, checked against the empirical frequencies too); percentile_of and
// KvCalibrator::scales against hand computations of numpy's "linear" percentile over calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "kernels/formats.h"
#include "model/kv_calibration.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace fp8rl::model {
namespace {

// The sampled distribution written from its definition in float64: softmax(z / T), the tokens
// sorted by probability (ties by lower id), the first top_k, then the shortest prefix whose mass
// reaches top_p, renormalized. Returns p(x) for every token (0 outside the kept set).
std::vector<double> truncated_distribution(const std::vector<float>& z, double t, int64_t top_k,
                                           double top_p) {
  const size_t n = z.size();
  double zmax = -INFINITY;
  for (float v : z) zmax = std::max(zmax, static_cast<double>(v) / t);
  std::vector<double> p(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i] = std::exp(z[i] / t - zmax);
  for (double& v : p) v /= sum;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  const size_t k = top_k > 0 ? std::min<size_t>(top_k, n) : n;
  std::vector<double> out(n, 0.0);
  double mass = 0;
  size_t kept = 0;
  if (top_p >= 1.0) {  // nothing to cut: do not let rounding of the running sum end it early
    for (; kept < k; ++kept) mass += p[order[kept]];
  }
  while (kept < k) {
    mass += p[order[kept++]];
    if (mass >= top_p) break;
  }
  for (size_t i = 0; i < kept; ++i) out[order[i]] = p[order[i]] / mass;
  return out;
}

TEST(Sampler, TopPLogprobIsUnderTheRenormalizedKeptSet) {
  // softmax(2, 1, 0, -1) = 0.644, 0.237, 0.087, 0.032: top_p 0.8 keeps {0, 1} (mass 0.881), so
  // p(0) = e^2 / (e^2 + e) = 1 / (1 + e^-1) and p(1) = 1 / (1 + e).
  const std::vector<float> z = {2.0f, 1.0f, 0.0f, -1.0f};
  const SamplingParams params{.temperature = 1.0f, .top_p = 0.8f};
  Sampler sampler;
  Rng rng(11);
  int seen[4] = {0, 0, 0, 0};
  for (int i = 0; i < 400; ++i) {
    float lp = 0;
    const int32_t tok = sampler.sample(z.data(), 4, params, rng, &lp);
    ASSERT_TRUE(tok == 0 || tok == 1) << tok;
    ++seen[tok];
    const double want = tok == 0 ? -std::log1p(std::exp(-1.0)) : -std::log1p(std::exp(1.0));
    EXPECT_NEAR(lp, want, 1e-6) << "token " << tok;
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
}

TEST(Sampler, TopKOneHasLogprobZero) {
  const std::vector<float> z = {0.3f, 1.7f, -0.4f, 1.2f, 0.9f};
  Sampler sampler;
  Rng rng(3);
  float lp = 1;
  EXPECT_EQ(sampler.sample(z.data(), 5, {.temperature = 0.7f, .top_k = 1}, rng, &lp), 1);
  EXPECT_NEAR(lp, 0.0f, 1e-6);  // log 1, up to the rounding of log(exp(full))
}

TEST(Sampler, TruncatedLogprobsMatchFloat64ReferenceOnRandomLogits) {
  struct Case {
    float temperature;
    int64_t top_k;
    float top_p;
  };
  const Case cases[] = {
      {1.0f, 0, 0.9f}, {0.7f, 0, 0.5f}, {1.3f, 8, 1.0f}, {0.8f, 12, 0.85f}, {1.0f, 0, 1.0f}};
  const int64_t vocab = 64;
  Rng data_rng(21);
  for (const Case& c : cases) {
    std::vector<float> z(vocab);
    for (float& v : z) v = static_cast<float>(3.0 * data_rng.normal());
    const std::vector<double> ref = truncated_distribution(z, c.temperature, c.top_k, c.top_p);
    const SamplingParams params{.temperature = c.temperature, .top_p = c.top_p, .top_k = c.top_k};
    Sampler sampler;
    Rng rng(7);
    const int n = 20000;
    std::vector<int> count(vocab, 0);
    for (int i = 0; i < n; ++i) {
      float lp = 0;
      const int32_t tok = sampler.sample(z.data(), vocab, params, rng, &lp);
      ASSERT_GT(ref[tok], 0.0) << "sampled a token outside the kept set: " << tok;
      ASSERT_NEAR(lp, std::log(ref[tok]), 2e-5)
          << "T=" << c.temperature << " top_k=" << c.top_k << " top_p=" << c.top_p;
      ++count[tok];
    }
    // The reported distribution is the one sampled from: frequencies within 5 sigma.
    for (int64_t x = 0; x < vocab; ++x) {
      const double sigma = std::sqrt(ref[x] * (1 - ref[x]) / n);
      EXPECT_NEAR(static_cast<double>(count[x]) / n, ref[x], 5 * sigma + 1e-12) << "token " << x;
    }
  }
}

TEST(Sampler, FullLogprobIsTheUntruncatedSoftmax) {
  const std::vector<float> z = {2.0f, 1.0f, 0.0f, -1.0f};
  Sampler sampler;
  Rng rng(5);
  const double lse = std::log(std::exp(2.0 / 0.9) + std::exp(1.0 / 0.9) + 1.0 + std::exp(-1 / 0.9));
  for (int i = 0; i < 50; ++i) {
    float lp = 0, full = 0;
    const int32_t tok =
        sampler.sample(z.data(), 4, {.temperature = 0.9f, .top_p = 0.8f}, rng, &lp, &full);
    EXPECT_NEAR(full, z[tok] / 0.9 - lse, 1e-6);
    EXPECT_LT(full, lp);  // the kept set's mass is < 1
  }
}

TEST(Percentile, LinearInterpolationBetweenOrderStatistics) {
  // Sorted: 0.5 1 2 3 7 (n = 5). p50: rank 2 -> 2. p90: rank 3.6 -> 3 + 0.6 * 4 = 5.4.
  // p99.9: rank 3.996 -> 3 + 0.996 * 4 = 6.984. p0 / p100: min / max.
  const std::vector<float> v = {3.0f, 0.5f, 7.0f, 2.0f, 1.0f};
  EXPECT_FLOAT_EQ(percentile_of(v, 50), 2.0f);
  EXPECT_FLOAT_EQ(percentile_of(v, 90), 5.4f);
  EXPECT_FLOAT_EQ(percentile_of(v, 99.9), 6.984f);
  EXPECT_FLOAT_EQ(percentile_of(v, 0), 0.5f);
  EXPECT_FLOAT_EQ(percentile_of(v, 100), 7.0f);
  EXPECT_FLOAT_EQ(percentile_of({4.0f}, 99.9), 4.0f);
  EXPECT_EQ(percentile_of({}, 99.9), 0.0f);
}

TEST(Percentile, NonFiniteValuesAreLeftOut) {
  // A call whose activations overflowed must not drag the percentile to inf.
  EXPECT_FLOAT_EQ(percentile_of({1.0f, INFINITY, 2.0f, 3.0f}, 50), 2.0f);
  EXPECT_FLOAT_EQ(percentile_of({1.0f, NAN, 3.0f}, 100), 3.0f);
  EXPECT_EQ(percentile_of({INFINITY}, 50), 0.0f);
}

TEST(KvCalibrator, ScalesArePercentileOverCallsTimesMarginOver448) {
  // Two layers, 11 calls with amaxes that are not all equal; the 11th call of layer 0 is an
  // outlier. p99.9 over 11 calls: rank 0.999 * 10 = 9.99 -> v[9] + 0.99 * (v[10] - v[9]).
  KvCalibrator cal(2);
  std::vector<float> k0, v0, k1, v1;
  for (int c = 0; c < 11; ++c) {
    k0.push_back(c == 10 ? 40.0f : 1.0f + 0.5f * c);  // sorted: 1 .. 5.5, 40
    v0.push_back(2.0f + 0.25f * ((c * 7) % 11));      // a permutation of 2 .. 4.5
    k1.push_back(0.1f * (11 - c));                    // 1.1 .. 0.1
    v1.push_back(c == 3 ? INFINITY : 0.75f);          // constant, one overflowed call
    cal.record(0, k0.back(), v0.back());
    cal.record(1, k1.back(), v1.back());
  }
  EXPECT_EQ(cal.num_records(), 11);
  const KvScales s = cal.scales(99.9, 1.05);
  ASSERT_EQ(s.k.size(), 2u);
  ASSERT_EQ(s.v.size(), 2u);
  const double e4m3 = 448.0;
  EXPECT_FLOAT_EQ(s.k[0], static_cast<float>((5.5 + 0.99 * (40.0 - 5.5)) * 1.05 / e4m3));
  EXPECT_FLOAT_EQ(s.v[0], static_cast<float>((4.25 + 0.99 * 0.25) * 1.05 / e4m3));
  EXPECT_FLOAT_EQ(s.k[1], static_cast<float>((1.0 + 0.99 * 0.1) * 1.05 / e4m3));
  EXPECT_FLOAT_EQ(s.v[1], static_cast<float>(0.75 * 1.05 / e4m3));  // the inf call left out
  EXPECT_EQ(kernels::kE4M3Max, 448.0f);
  // p50 and margin 1: the median call.
  EXPECT_FLOAT_EQ(cal.scales(50, 1.0).k[0], static_cast<float>(3.5 / e4m3));
  // One call only (a whole batch in one forward): the percentile is that call's amax.
  KvCalibrator one(1);
  one.record(0, 40.0f, 2.0f);
  EXPECT_FLOAT_EQ(one.scales().k[0], static_cast<float>(40.0 * 1.05 / e4m3));
  // No records, or amax 0: scale 1.
  KvCalibrator none(1);
  EXPECT_EQ(none.scales().k[0], 1.0f);
  none.record(0, 0.0f, 0.0f);
  EXPECT_EQ(none.scales().v[0], 1.0f);
  cal.clear();
  EXPECT_EQ(cal.num_records(), 0);
}

}  // namespace
}  // namespace fp8rl::model
