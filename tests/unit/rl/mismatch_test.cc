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
  // After truncation: icepop zeroes w = e^-1 < 0.5, so the mean is (e^0.5 + 0) / 2.
  EXPECT_NEAR(m->sampling_importance_ratio, std::exp(0.5) / 2, 1e-6);
  EXPECT_NEAR(m->is_weight_min, std::exp(-1.0), 1e-6);
  EXPECT_NEAR(m->is_weight_max, std::exp(0.5), 1e-6);
  // The PPO ratio exp(cur - prev) is not known here: 1 (cur == prev before any update).
  EXPECT_EQ(m->probs_ratio_min, 1.0);
  EXPECT_EQ(m->probs_ratio_max, 1.0);
  EXPECT_DOUBLE_EQ(m->is_oob_ratio, 0.5);  // w = e^-1 < 0.5 is outside [0.5, 2]
  // Rule none: no truncation; the ratio is the mean raw w.
  EXPECT_NEAR(mismatch_metrics(prev, gen, mask, {1, 3}, {IsRule::kNone, 2, 0.5, 2})
                  ->sampling_importance_ratio,
              (std::exp(0.5) + std::exp(-1.0)) / 2, 1e-6);
  // tis with cap 1.5 averages the clamped weights.
  EXPECT_NEAR(mismatch_metrics(prev, gen, mask, {1, 3}, {IsRule::kTis, 1.5, 0.5, 2})
                  ->sampling_importance_ratio,
              (1.5 + std::exp(-1.0)) / 2, 1e-6);
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
  EXPECT_EQ(m->is_weight_min, 1.0);
  EXPECT_EQ(m->is_weight_max, 1.0);
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
    const bool outside = std::exp(d) < 0.7 || std::exp(d) > 1.4;
    w_sum += outside ? 0.0 : std::exp(d);  // icepop zeroes the out-of-bounds ones
    lo = std::min(lo, std::exp(d));
    hi = std::max(hi, std::exp(d));
    oob += outside;
  }
  EXPECT_EQ(m->valid_tokens, n);
  EXPECT_EQ(m->nonfinite_tokens, 1);
  EXPECT_NEAR(m->token_mult_prob_error, mult / finite, 1e-9);
  EXPECT_NEAR(m->gen_kl_error, kl / finite, 1e-9);
  EXPECT_NEAR(m->sampling_importance_ratio, w_sum / n, 1e-9);
  EXPECT_NEAR(m->is_oob_ratio, double(oob) / n, 1e-12);
  EXPECT_DOUBLE_EQ(m->is_weight_min, lo);
  EXPECT_DOUBLE_EQ(m->is_weight_max, hi);
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

TEST(ImportanceWeights, RuleNoneAppliesWeightOne) {
  const std::vector<float> prev = {-2.0f, -1.0f, -0.5f, -0.3f};
  const std::vector<float> gen = {-0.5f, -1.2f, -3.0f, -0.3f};  // w = e^-1.5, e^0.2, e^2.5, pad
  const std::vector<uint8_t> mask = {1, 1, 1, 0};
  absl::StatusOr<IsWeights> w =
      compute_is_weights(prev, gen, mask, {1, 4}, {IsRule::kNone, 2.0, 0.5, 2.0});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->truncated, (std::vector<double>{1, 1, 1, 0}));
  EXPECT_NEAR(w->raw[2], std::exp(2.5), 1e-4);
  EXPECT_EQ(w->oob, (std::vector<uint8_t>{0, 0, 0, 0}));
}

TEST(ImportanceWeights, IcepopLowerBoundZeroIsKept) {
  // lo = 0 is a real bound (nothing below 0 exists), not "use the default 0.5".
  const std::vector<float> prev = {-3.0f, -1.0f};
  const std::vector<float> gen = {-1.0f, -1.1f};  // w = e^-2 = 0.135, e^0.1
  const std::vector<uint8_t> mask = {1, 1};
  absl::StatusOr<IsWeights> w =
      compute_is_weights(prev, gen, mask, {1, 2}, {IsRule::kIcepop, 2.0, 0.0, 2.0});
  ASSERT_TRUE(w.ok());
  EXPECT_NEAR(w->truncated[0], std::exp(-2.0), 1e-6);
  EXPECT_EQ(w->oob, (std::vector<uint8_t>{0, 0}));
}

TEST(ImportanceWeights, SeqMaskTisTreatsNonFiniteLogRatioAsZero) {
  // Sequence 0: d = 0.002 and a NaN gen; NeMo RL's nan_to_num makes the NaN's log-ratio 0, so the
  // geometric mean is exp(0.001), inside [0.999, 1.002]: kept, the broken token with weight 0.
  // Sequence 1: d = 0.004, 0.004: exp(0.004) > 1.002, masked.
  const std::vector<float> prev = {-1.0f, -2.0f, -1.0f, -1.0f};
  const std::vector<float> gen = {-1.002f, NAN, -1.004f, -1.004f};
  const std::vector<uint8_t> mask = {1, 1, 1, 1};
  absl::StatusOr<IsWeights> w =
      compute_is_weights(prev, gen, mask, {2, 2}, default_is_config(IsRule::kSeqMaskTis));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NEAR(w->truncated[0], std::exp(0.002), 1e-6);
  EXPECT_EQ(w->truncated[1], 0.0);
  EXPECT_EQ(w->truncated[2], 0.0);
  EXPECT_EQ(w->seq_masked, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(w->oob, (std::vector<uint8_t>{0, 0, 1, 1}));
}

TEST(ImportanceWeights, DefaultsPerRule) {
  EXPECT_EQ(default_is_config(IsRule::kTis), (IsConfig{IsRule::kTis, 2.0, 0.5, 2.0}));
  EXPECT_EQ(default_is_config(IsRule::kIcepop), (IsConfig{IsRule::kIcepop, 2.0, 0.5, 2.0}));
  EXPECT_EQ(default_is_config(IsRule::kSeqMaskTis),
            (IsConfig{IsRule::kSeqMaskTis, 2.0, 0.999, 1.002}));
  EXPECT_TRUE(validate_is_config(default_is_config(IsRule::kSeqMaskTis)).ok());
}

TEST(MismatchMetrics, SeqMaskTisOobRatioCountsSequences) {
  // Four sequences of 1, 4, 2 and 3 valid tokens (and one all-padding row, which does not
  // count); only the 4-token one is masked: 1 of 4 sequences (4 of 10 tokens before the fix).
  const TokenLayout layout{5, 4};
  std::vector<float> prev(20), gen(20);
  std::vector<uint8_t> mask(20, 0);
  const int valid[5] = {1, 4, 2, 3, 0};
  for (int b = 0; b < 5; ++b) {
    for (int t = 0; t < 4; ++t) {
      const int i = b * 4 + t;
      prev[i] = -0.5f - 0.25f * t - 0.1f * b;
      const double d = b == 1 ? 0.3 : 0.0005 * (t % 2 == 0 ? 1 : -1);
      gen[i] = static_cast<float>(prev[i] - d);
      mask[i] = t < valid[b];
    }
  }
  absl::StatusOr<MismatchMetrics> m =
      mismatch_metrics(prev, gen, mask, layout, default_is_config(IsRule::kSeqMaskTis));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->valid_tokens, 10);
  EXPECT_DOUBLE_EQ(m->is_oob_ratio, 0.25);
  // After truncation: the masked sequence's 4 tokens count as 0.
  double kept = 0;
  for (int i = 0; i < 20; ++i) {
    if (mask[i] && i / 4 != 1) kept += std::exp(static_cast<double>(prev[i]) - gen[i]);
  }
  EXPECT_NEAR(m->sampling_importance_ratio, kept / 10, 1e-9);
}

TEST(MismatchMetrics, TruncationMassIsSeparatedFromPrecisionMismatch) {
  // The sampler kept a set of mass M = 0.8 and 0.5 for the two tokens: gen = gen_full - log M.
  // The trainer agrees with gen_full to 0.01 (precision mismatch only).
  const std::vector<float> gen_full = {-1.0f, -2.0f};
  const std::vector<float> gen = {static_cast<float>(-1.0 - std::log(0.8)),
                                  static_cast<float>(-2.0 - std::log(0.5))};
  const std::vector<float> prev = {-1.01f, -1.99f};
  const std::vector<uint8_t> mask = {1, 1};
  absl::StatusOr<MismatchMetrics> m =
      mismatch_metrics(prev, gen, mask, {1, 2}, IsConfig{}, gen_full);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NEAR(m->sampling_kept_mass, (0.8 + 0.5) / 2, 1e-6);
  EXPECT_NEAR(m->full_token_mult_prob_error, std::exp(0.01), 1e-5);
  // The headline metric shows the truncation: prev - gen = -0.01 + log 0.8 and 0.01 + log 0.5.
  EXPECT_NEAR(
      m->token_mult_prob_error,
      (std::exp(std::abs(-0.01 + std::log(0.8))) + std::exp(std::abs(0.01 + std::log(0.5)))) / 2,
      1e-5);
  // Without gen_full: 1; a wrong size is an error.
  EXPECT_EQ(mismatch_metrics(prev, gen, mask, {1, 2}, IsConfig{})->sampling_kept_mass, 1.0);
  EXPECT_EQ(mismatch_metrics(prev, gen, mask, {1, 2}, IsConfig{}, std::span(gen_full).first(1))
                .status()
                .message(),
            "mismatch metrics: gen_full_logprobs has 1 entries, expected 0 or 2");
}

TEST(MismatchMetrics, FoldProbsRatioTakesMinAndMaxOverUpdates) {
  MismatchMetrics m;
  PolicyLossStats first, second, empty;
  first.valid_tokens = 5;  // the first update: cur == prev
  second.valid_tokens = 5;
  second.probs_ratio_min = 0.7;
  second.probs_ratio_max = 1.4;
  empty.probs_ratio_min = 0.1;  // no valid tokens: ignored
  fold_probs_ratio(first, &m);
  fold_probs_ratio(second, &m);
  fold_probs_ratio(empty, &m);
  EXPECT_EQ(m.probs_ratio_min, 0.7);
  EXPECT_EQ(m.probs_ratio_max, 1.4);
}

TEST(ImportanceWeights, RejectsBadInput) {
  const std::vector<float> a = {-1.0f, -2.0f};
  const std::vector<uint8_t> mask = {1, 1};
  EXPECT_EQ(compute_is_weights(a, a, mask, {1, 3}, IsConfig{}).status().message(),
            "IS weights: prev_logprobs (2), gen_logprobs (2) and mask (2) must all have batch * "
            "length = 3 entries");
  EXPECT_EQ(
      compute_is_weights(a, a, mask, {1, 2}, {IsRule::kTis, 0.0, 0.5, 2.0}).status().message(),
      "is.cap: must be >= 1 and finite (a cap below 1 truncates on-policy tokens), got 0");
  EXPECT_EQ(validate_is_config({IsRule::kTis, 0.8, 0.5, 2.0}, "algorithm.is").message(),
            "algorithm.is.cap: must be >= 1 and finite (a cap below 1 truncates on-policy "
            "tokens), got 0.8");
  EXPECT_EQ(validate_is_config({IsRule::kIcepop, 2.0, 1.5, 2.0}, "algorithm.is").message(),
            "algorithm.is.lo: must be in [0, 1], got 1.5");
  EXPECT_EQ(validate_is_config({IsRule::kIcepop, 2.0, 1.0, 1.0}, "algorithm.is").message(),
            "algorithm.is.hi: must be > lo (1), got 1");
  EXPECT_EQ(validate_is_config({IsRule::kIcepop, 2.0, 0.5, INFINITY}, "algorithm.is").message(),
            "algorithm.is.hi: must be >= 1 and finite, got inf");
  // 0 is a bound like any other, not "unset".
  EXPECT_TRUE(validate_is_config({IsRule::kIcepop, 1.0, 0.0, 1.0}, "algorithm.is").ok());
  EXPECT_EQ(parse_is_rule("tis2").status().message(),
            "must be one of none, tis, icepop, seq_mask_tis");
  EXPECT_EQ(*parse_is_rule("seq_mask_tis"), IsRule::kSeqMaskTis);
}

}  // namespace
}  // namespace fp8rl::rl
