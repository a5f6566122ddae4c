// Tests of rl/mismatch.h and rl/importance.h: hand-checkable values, brute force on random data,
// the truncation bounds per rule, and gen_kl_error as an estimator of the true KL(gen || train).
#include "rl/mismatch.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "rl/importance.h"

namespace fp8rl::rl {
namespace {

TEST(MismatchMetrics, HandChecked) {
  // Tokens: d = prev - gen = 0.5, -1.0, and a masked token that must not count.
  const std::vector<float> prev = {-1.0f, -2.0f, -0.1f};
  const std::vector<float> gen = {-1.5f, -1.0f, -5.0f};
  const std::vector<uint8_t> mask = {1, 1, 0};
  absl::StatusOr<MismatchMetrics> m =
      mismatch_metrics(prev, gen, mask, {1, 3}, IsConfig{IsRule::kIcepop, 2.0, 0.5, 2.0});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->valid_tokens, 2);
  EXPECT_NEAR(m->token_mult_prob_error, (std::exp(0.5) + std::exp(1.0)) / 2, 1e-6);
  EXPECT_NEAR(m->gen_kl_error, ((std::exp(0.5) - 1.5) + (std::exp(-1.0) + 1.0 - 1.0)) / 2, 1e-6);
  EXPECT_NEAR(m->sampling_importance_ratio, (std::exp(0.5) + std::exp(-1.0)) / 2, 1e-6);
  EXPECT_NEAR(m->probs_ratio_min, std::exp(-1.0), 1e-6);
  EXPECT_NEAR(m->probs_ratio_max, std::exp(0.5), 1e-6);
  EXPECT_DOUBLE_EQ(m->is_oob_ratio, 0.5);  // w = e^-1 < 0.5 is outside [0.5, 2]
  // tis with cap 2: e^0.5 = 1.65 is inside -> nothing out of bounds; cap 1.5: one token.
  EXPECT_EQ(mismatch_metrics(prev, gen, mask, {1, 3}, {IsRule::kTis, 2.0, 0.5, 2.0})->is_oob_ratio,
            0.0);
  EXPECT_EQ(mismatch_metrics(prev, gen, mask, {1, 3}, {IsRule::kTis, 1.5, 0.5, 2.0})->is_oob_ratio,
            0.5);
  // seq_mask_tis: geometric mean exp(-0.25) = 0.78 is inside [0.5, 2]; outside [0.9, 2].
  EXPECT_EQ(
      mismatch_metrics(prev, gen, mask, {1, 3}, {IsRule::kSeqMaskTis, 2, 0.5, 2})->is_oob_ratio,
      0.0);
  EXPECT_EQ(
      mismatch_metrics(prev, gen, mask, {1, 3}, {IsRule::kSeqMaskTis, 2, 0.9, 2})->is_oob_ratio,
      1.0);
  EXPECT_EQ(mismatch_metrics(prev, gen, mask, {1, 3}, {IsRule::kNone, 2, 0.5, 2})->is_oob_ratio,
            0.0);
}

TEST(MismatchMetrics, IdenticalPoliciesHaveNoMismatch) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> logp(-5.0f, -0.01f);
  std::vector<float> prev(64);
  for (float& v : prev) v = logp(rng);
  const std::vector<uint8_t> mask(64, 1);
  absl::StatusOr<MismatchMetrics> m = mismatch_metrics(prev, prev, mask, {8, 8}, IsConfig{});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->token_mult_prob_error, 1.0);
  EXPECT_EQ(m->gen_kl_error, 0.0);
  EXPECT_EQ(m->sampling_importance_ratio, 1.0);
  EXPECT_EQ(m->is_oob_ratio, 0.0);
  EXPECT_EQ(m->probs_ratio_min, 1.0);
  EXPECT_EQ(m->probs_ratio_max, 1.0);
}

TEST(MismatchMetrics, RandomDataMatchesBruteForce) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> logp(-4.0f, -0.01f);
  std::normal_distribution<float> noise(0.0f, 0.4f);
  const TokenLayout layout{6, 10};
  std::vector<float> prev(60), gen(60);
  std::vector<uint8_t> mask(60);
  for (size_t i = 0; i < 60; ++i) {
    prev[i] = logp(rng);
    gen[i] = prev[i] + noise(rng);
    mask[i] = rng() % 5 != 0;
  }
  gen[7] = NAN;  // a broken sample: w -> 0, counted as out of bounds
  mask[7] = 1;
  const IsConfig is{IsRule::kIcepop, 2.0, 0.7, 1.4};
  absl::StatusOr<MismatchMetrics> m = mismatch_metrics(prev, gen, mask, layout, is);
  ASSERT_TRUE(m.ok());
  double mult = 0, kl = 0, w_sum = 0, lo = 1e9, hi = -1e9;
  int n = 0, finite = 0, oob = 0;
  for (size_t i = 0; i < 60; ++i) {
    if (!mask[i]) continue;
    ++n;
    const double d = double(prev[i]) - gen[i];
    if (std::isnan(d)) {
      ++oob;
      continue;
    }
    ++finite;
    mult += std::exp(std::abs(d));
    kl += std::exp(d) - d - 1;
    w_sum += std::exp(d);
    lo = std::min(lo, std::exp(d));
    hi = std::max(hi, std::exp(d));
    oob += (std::exp(d) < 0.7 || std::exp(d) > 1.4);
  }
  EXPECT_EQ(m->valid_tokens, n);
  EXPECT_EQ(m->nonfinite_tokens, 1);
  EXPECT_NEAR(m->token_mult_prob_error, mult / finite, 1e-9);
  EXPECT_NEAR(m->gen_kl_error, kl / finite, 1e-9);
  EXPECT_NEAR(m->sampling_importance_ratio, w_sum / n, 1e-9);
  EXPECT_NEAR(m->is_oob_ratio, double(oob) / n, 1e-12);
  EXPECT_DOUBLE_EQ(m->probs_ratio_min, lo);
  EXPECT_DOUBLE_EQ(m->probs_ratio_max, hi);
  EXPECT_GT(m->gen_kl_error, 0.0);
  EXPECT_GT(m->is_oob_ratio, 0.0);
}

TEST(MismatchMetrics, GenKlErrorEstimatesTrueKl) {
  // Two categorical distributions; tokens sampled from gen; the metric must approach the exact
  // KL(gen || train) = sum_x gen(x) log(gen(x) / train(x)).
  const std::vector<double> p_gen = {0.5, 0.2, 0.15, 0.1, 0.05};
  const std::vector<double> p_train = {0.35, 0.3, 0.1, 0.15, 0.1};
  double exact = 0.0;
  for (size_t x = 0; x < p_gen.size(); ++x) exact += p_gen[x] * std::log(p_gen[x] / p_train[x]);
  std::mt19937 rng(4);
  std::discrete_distribution<int> sample(p_gen.begin(), p_gen.end());
  const int n = 200000;
  std::vector<float> prev(n), gen(n);
  for (int i = 0; i < n; ++i) {
    const int x = sample(rng);
    gen[i] = static_cast<float>(std::log(p_gen[x]));
    prev[i] = static_cast<float>(std::log(p_train[x]));
  }
  absl::StatusOr<MismatchMetrics> m =
      mismatch_metrics(prev, gen, std::vector<uint8_t>(n, 1), {1, n}, IsConfig{});
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->gen_kl_error, exact, 0.05 * exact);
  EXPECT_NEAR(m->sampling_importance_ratio, 1.0, 0.01);  // E_gen[train/gen] = 1
}

TEST(ImportanceWeights, TruncationPerRule) {
  // w = 0.25, 1.0, 3.0 in one sequence (geometric mean 0.909).
  const std::vector<float> prev = {-2.0f, -1.0f, -0.5f};
  const std::vector<float> gen = {static_cast<float>(-2.0 + std::log(4.0)), -1.0f,
                                  static_cast<float>(-0.5 - std::log(3.0))};
  const std::vector<uint8_t> mask = {1, 1, 1};
  auto weights = [&](IsConfig c) { return *compute_is_weights(prev, gen, mask, {1, 3}, c); };
  const IsWeights tis = weights({IsRule::kTis, 2.0, 0.5, 2.0});
  EXPECT_NEAR(tis.raw[2], 3.0, 1e-5);
  EXPECT_NEAR(tis.truncated[0], 0.25, 1e-6);
  EXPECT_NEAR(tis.truncated[2], 2.0, 1e-12);
  EXPECT_EQ(tis.oob, (std::vector<uint8_t>{0, 0, 1}));
  const IsWeights icepop = weights({IsRule::kIcepop, 2.0, 0.5, 2.0});
  EXPECT_EQ(icepop.truncated[0], 0.0);
  EXPECT_NEAR(icepop.truncated[1], 1.0, 1e-7);
  EXPECT_EQ(icepop.truncated[2], 0.0);
  EXPECT_EQ(icepop.oob, (std::vector<uint8_t>{1, 0, 1}));
  const IsWeights kept = weights({IsRule::kSeqMaskTis, 2.0, 0.5, 2.0});
  EXPECT_NEAR(kept.truncated[2], 3.0, 1e-5);  // kept sequences keep per-token w
  const IsWeights dropped = weights({IsRule::kSeqMaskTis, 2.0, 0.95, 2.0});
  EXPECT_EQ(dropped.truncated, (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(dropped.oob, (std::vector<uint8_t>{1, 1, 1}));
}

TEST(ImportanceWeights, RejectsBadInput) {
  const std::vector<float> a = {-1.0f, -2.0f};
  const std::vector<uint8_t> mask = {1, 1};
  EXPECT_EQ(compute_is_weights(a, a, mask, {1, 3}, IsConfig{}).status().message(),
            "IS weights: prev_logprobs (2), gen_logprobs (2) and mask (2) must all have batch * "
            "length = 3 entries");
  EXPECT_EQ(
      compute_is_weights(a, a, mask, {1, 2}, {IsRule::kTis, 0.0, 0.5, 2.0}).status().message(),
      "is.cap: must be > 0");
  EXPECT_EQ(validate_is_config({IsRule::kIcepop, 2.0, 1.5, 2.0}, "algorithm.is").message(),
            "algorithm.is.lo: must be in [0, 1]");
  EXPECT_EQ(validate_is_config({IsRule::kIcepop, 2.0, 1.0, 1.0}, "algorithm.is").message(),
            "algorithm.is.hi: must be > lo");
  EXPECT_EQ(parse_is_rule("tis2").status().message(),
            "must be one of none, tis, icepop, seq_mask_tis");
  EXPECT_EQ(*parse_is_rule("seq_mask_tis"), IsRule::kSeqMaskTis);
}

}  // namespace
}  // namespace fp8rl::rl
