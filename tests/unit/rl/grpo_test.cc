// Tests of rl/grpo.h: group advantages, the IS-corrected PPO-clip policy loss (values by hand and
// gradients against finite differences for every IS rule, clipping active and inactive, with and
// without the KL term) and the SFT NLL gradient.
#include "rl/grpo.h"

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

TEST(GroupAdvantages, MatchesFormulaOnRandomGroups) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 3.0f);
  const int64_t groups = 5, g = 6;
  std::vector<float> rewards(groups * g);
  for (float& r : rewards) r = u(rng);
  absl::StatusOr<std::vector<float>> adv = group_advantages(rewards, g);
  ASSERT_TRUE(adv.ok()) << adv.status();
  for (int64_t p = 0; p < groups; ++p) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < g; ++j) mean += rewards[p * g + j];
    mean /= g;
    for (int64_t j = 0; j < g; ++j) var += std::pow(rewards[p * g + j] - mean, 2);
    const double std_dev = std::sqrt(var / (g - 1));
    double adv_sum = 0.0, adv_sq = 0.0;
    for (int64_t j = 0; j < g; ++j) {
      const double want = (rewards[p * g + j] - mean) / (std_dev + 1e-6);
      EXPECT_NEAR((*adv)[p * g + j], want, 1e-5);
      adv_sum += (*adv)[p * g + j];
      adv_sq += std::pow((*adv)[p * g + j], 2);
    }
    EXPECT_NEAR(adv_sum, 0.0, 1e-4);                      // zero mean per group
    EXPECT_NEAR(std::sqrt(adv_sq / (g - 1)), 1.0, 1e-4);  // unit sample std per group
  }
}

TEST(GroupAdvantages, BinaryRewardsAndConstantGroups) {
  // Group 0: one success of four; group 1: all correct (std 0: exactly zero advantages).
  const std::vector<float> rewards = {1, 0, 0, 0, 1, 1, 1, 1};
  absl::StatusOr<std::vector<float>> adv = group_advantages(rewards, 4);
  ASSERT_TRUE(adv.ok());
  const double std_dev = std::sqrt((0.75 * 0.75 + 3 * 0.25 * 0.25) / 3.0);
  EXPECT_NEAR((*adv)[0], 0.75 / (std_dev + 1e-6), 1e-5);
  EXPECT_NEAR((*adv)[1], -0.25 / (std_dev + 1e-6), 1e-5);
  for (int i = 4; i < 8; ++i) EXPECT_EQ((*adv)[i], 0.0f);
}

TEST(GroupAdvantages, RejectsBadInput) {
  const std::vector<float> five = {1, 2, 3, 4, 5};
  EXPECT_EQ(group_advantages(five, 1).status().message(),
            "advantages: group_size must be >= 2, got 1");
  EXPECT_EQ(group_advantages(five, 2).status().message(),
            "advantages: 5 rewards are not a multiple of group_size 2");
  const std::vector<float> nan = {1, NAN};
  EXPECT_EQ(group_advantages(nan, 2).status().message(), "advantages: reward 1 is not finite");
}

// A random padded batch with per-token logprobs; cur - prev drawn from `ratio_spread`.
struct Batch {
  TokenLayout layout{4, 9};
  std::vector<float> cur, prev, gen, ref, adv;
  std::vector<uint8_t> mask;
  PolicyLossInput input(bool with_ref) const {
    return PolicyLossInput{
        layout, cur, prev, gen, with_ref ? std::span<const float>(ref) : std::span<const float>(),
        mask,   adv};
  }
};

Batch random_batch(uint32_t seed, double ratio_spread, double gen_spread, double clip_eps) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> logp(-3.0, -0.05);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  Batch b;
  const auto n = static_cast<size_t>(b.layout.size());
  b.cur.resize(n);
  b.prev.resize(n);
  b.gen.resize(n);
  b.ref.resize(n);
  b.mask.resize(n);
  for (size_t i = 0; i < n; ++i) {
    b.prev[i] = static_cast<float>(logp(rng));
    // Keep log r away from the clip boundaries so finite differences never straddle a kink.
    double delta = 0.0;
    do {
      delta = ratio_spread * unit(rng);
    } while (std::abs(delta - std::log1p(clip_eps)) < 0.01 ||
             std::abs(delta - std::log1p(-clip_eps)) < 0.01);
    b.cur[i] = static_cast<float>(b.prev[i] + delta);
    b.gen[i] = static_cast<float>(b.prev[i] + gen_spread * unit(rng));
    b.ref[i] = static_cast<float>(b.prev[i] + 0.3 * unit(rng));
    b.mask[i] = (i % b.layout.length) < 2 ? 0 : (rng() % 7 != 0);  // prompt slots + random pads
  }
  for (int64_t s = 0; s < b.layout.batch; ++s) b.adv.push_back(static_cast<float>(1.5 * unit(rng)));
  return b;
}

// Central differences of the loss in each valid cur logprob vs the analytic gradient.
void expect_gradient_matches(const Batch& batch, const PolicyLossConfig& config) {
  const bool with_ref = config.kl_beta > 0.0;
  absl::StatusOr<PolicyLossResult> base = grpo_policy_loss(batch.input(with_ref), config);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(std::isfinite(base->loss));
  int checked = 0;
  for (size_t i = 0; i < batch.cur.size(); ++i) {
    if (!batch.mask[i]) {
      EXPECT_EQ(base->dloss_dcur[i], 0.0f) << i;
      continue;
    }
    Batch plus = batch, minus = batch;
    plus.cur[i] = batch.cur[i] + 1e-3f;
    minus.cur[i] = batch.cur[i] - 1e-3f;
    const double h = static_cast<double>(plus.cur[i]) - minus.cur[i];  // exact float step
    absl::StatusOr<PolicyLossResult> lp = grpo_policy_loss(plus.input(with_ref), config);
    absl::StatusOr<PolicyLossResult> lm = grpo_policy_loss(minus.input(with_ref), config);
    ASSERT_TRUE(lp.ok() && lm.ok());
    const double fd = (lp->loss - lm->loss) / h;
    EXPECT_NEAR(base->dloss_dcur[i], fd, 2e-4 + 2e-3 * std::abs(fd)) << "token " << i;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

struct RuleCase {
  IsRule rule;
  double lo, hi;
  friend void PrintTo(const RuleCase& c, std::ostream* os) {
    *os << is_rule_name(c.rule) << " [" << c.lo << ", " << c.hi << "]";
  }
};

class PolicyLossGradient : public ::testing::TestWithParam<RuleCase> {};

TEST_P(PolicyLossGradient, ClippingInactive) {
  PolicyLossConfig config;
  config.is = IsConfig{GetParam().rule, 2.0, GetParam().lo, GetParam().hi};
  const Batch batch = random_batch(11, 0.05, 0.9, config.clip_eps);
  absl::StatusOr<PolicyLossResult> r = grpo_policy_loss(batch.input(false), config);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stats.clip_fraction, 0.0);
  expect_gradient_matches(batch, config);
}

TEST_P(PolicyLossGradient, ClippingActive) {
  PolicyLossConfig config;
  config.is = IsConfig{GetParam().rule, 2.0, GetParam().lo, GetParam().hi};
  const Batch batch = random_batch(12, 0.8, 0.9, config.clip_eps);
  absl::StatusOr<PolicyLossResult> r = grpo_policy_loss(batch.input(false), config);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->stats.clip_fraction, 0.1);
  EXPECT_LT(r->stats.clip_fraction, 0.9);
  if (GetParam().rule == IsRule::kIcepop || GetParam().rule == IsRule::kSeqMaskTis) {
    // The rule must actually drop tokens here, or the test would not exercise it.
    EXPECT_GT(r->stats.is_zeroed_fraction, 0.0);
    EXPECT_LT(r->stats.is_zeroed_fraction, 1.0);
  }
  expect_gradient_matches(batch, config);
}

TEST_P(PolicyLossGradient, WithKlTerm) {
  PolicyLossConfig config;
  config.kl_beta = 0.3;
  config.is = IsConfig{GetParam().rule, 2.0, GetParam().lo, GetParam().hi};
  const Batch batch = random_batch(13, 0.8, 0.9, config.clip_eps);
  absl::StatusOr<PolicyLossResult> r = grpo_policy_loss(batch.input(true), config);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->stats.kl, 0.0);
  expect_gradient_matches(batch, config);
}

INSTANTIATE_TEST_SUITE_P(AllRules, PolicyLossGradient,
                         ::testing::Values(RuleCase{IsRule::kNone, 0.5, 2.0},
                                           RuleCase{IsRule::kTis, 0.5, 2.0},
                                           RuleCase{IsRule::kIcepop, 0.6, 1.6},
                                           RuleCase{IsRule::kSeqMaskTis, 0.92, 1.08}),
                         [](const auto& info) {
                           return std::string(is_rule_name(info.param.rule));
                         });

// One valid token: loss = w * max(-A r, -A clip(r)).
double one_token_loss(double log_r, double log_w, float advantage, IsConfig is,
                      float* grad = nullptr, double* clip_fraction = nullptr) {
  const std::vector<float> prev = {-1.0f};
  const std::vector<float> cur = {static_cast<float>(-1.0 + log_r)};
  const std::vector<float> gen = {static_cast<float>(-1.0 - log_w)};
  const std::vector<uint8_t> mask = {1};
  const std::vector<float> adv = {advantage};
  PolicyLossConfig config;
  config.is = is;
  absl::StatusOr<PolicyLossResult> r =
      grpo_policy_loss(PolicyLossInput{{1, 1}, cur, prev, gen, {}, mask, adv}, config);
  EXPECT_TRUE(r.ok()) << r.status();
  if (grad != nullptr) *grad = r->dloss_dcur[0];
  if (clip_fraction != nullptr) *clip_fraction = r->stats.clip_fraction;
  return r->loss;
}

TEST(PolicyLoss, HandCheckedValues) {
  const IsConfig none{IsRule::kNone, 2.0, 0.5, 2.0};
  float grad = 0;
  double clipped = 0;
  // A = +1, r = 1.5 > 1 + eps: the clipped branch wins, loss -1.2, no gradient.
  EXPECT_NEAR(one_token_loss(std::log(1.5), 0.0, 1.0f, none, &grad, &clipped), -1.2, 1e-6);
  EXPECT_EQ(grad, 0.0f);
  EXPECT_EQ(clipped, 1.0);
  // A = -1, r = 1.5: the unclipped branch (1.5) wins; gradient -A * r = 1.5.
  EXPECT_NEAR(one_token_loss(std::log(1.5), 0.0, -1.0f, none, &grad, &clipped), 1.5, 1e-6);
  EXPECT_NEAR(grad, 1.5, 1e-6);
  EXPECT_EQ(clipped, 0.0);
  // A = 2, r = 0.5 < 1 - eps: min(-A r, -A clip) -> max(-1, -1.6) = -1, unclipped.
  EXPECT_NEAR(one_token_loss(std::log(0.5), 0.0, 2.0f, none, &grad), -1.0, 1e-6);
  EXPECT_NEAR(grad, -1.0, 1e-6);
  // IS weight w = 3 (prev - gen = log 3), r = 1.1 (unclipped), A = 1.
  const double log3 = std::log(3.0);
  // none: no correction at all, weight 1 (not the raw w = 3).
  EXPECT_NEAR(one_token_loss(std::log(1.1), log3, 1.0f, none), -1.1, 1e-5);
  EXPECT_NEAR(one_token_loss(std::log(1.1), log3, 1.0f, {IsRule::kTis, 2.0, 0.5, 2.0}), -2.0 * 1.1,
              1e-5);
  EXPECT_NEAR(one_token_loss(std::log(1.1), log3, 1.0f, {IsRule::kTis, 4.0, 0.5, 2.0}), -3.0 * 1.1,
              1e-5);
  EXPECT_EQ(one_token_loss(std::log(1.1), log3, 1.0f, {IsRule::kIcepop, 2.0, 0.5, 2.0}), 0.0);
  EXPECT_NEAR(one_token_loss(std::log(1.1), log3, 1.0f, {IsRule::kIcepop, 2.0, 0.5, 4.0}),
              -3.0 * 1.1, 1e-5);
  EXPECT_EQ(one_token_loss(std::log(1.1), log3, 1.0f, {IsRule::kSeqMaskTis, 2.0, 0.5, 2.0}), 0.0);
}

TEST(PolicyLoss, SeqMaskTisUsesGeometricMean) {
  // One sequence, two tokens with w = 4 and w = 0.5: geometric mean sqrt(2) ~ 1.414 inside
  // [0.5, 2] -> kept with per-token weights; with hi = 1.3 the whole sequence is zeroed.
  const std::vector<float> prev = {-1.0f, -1.0f};
  const std::vector<float> gen = {static_cast<float>(-1.0 - std::log(4.0)),
                                  static_cast<float>(-1.0 + std::log(2.0))};
  const std::vector<float> cur = prev;  // r = 1
  const std::vector<uint8_t> mask = {1, 1};
  const std::vector<float> adv = {1.0f};
  PolicyLossConfig config;
  config.is = {IsRule::kSeqMaskTis, 2.0, 0.5, 2.0};
  const PolicyLossInput input{{1, 2}, cur, prev, gen, {}, mask, adv};
  absl::StatusOr<PolicyLossResult> kept = grpo_policy_loss(input, config);
  ASSERT_TRUE(kept.ok());
  EXPECT_NEAR(kept->loss, -(4.0 + 0.5) / 2.0, 1e-5);
  config.is.hi = 1.3;
  absl::StatusOr<PolicyLossResult> masked = grpo_policy_loss(input, config);
  ASSERT_TRUE(masked.ok());
  EXPECT_EQ(masked->loss, 0.0);
  EXPECT_EQ(masked->stats.is_zeroed_fraction, 1.0);
  EXPECT_EQ(masked->dloss_dcur[0], 0.0f);
}

TEST(PolicyLoss, NonFiniteGenLogprobGivesZeroWeight) {
  const std::vector<float> prev = {-1.0f, -2.0f};
  const std::vector<float> gen = {-INFINITY, -2.0f};  // w = exp(+inf) -> 0
  const std::vector<float> cur = {-0.9f, -2.1f};
  const std::vector<uint8_t> mask = {1, 1};
  const std::vector<float> adv = {0.7f};
  PolicyLossConfig config;
  config.is.rule = IsRule::kTis;
  absl::StatusOr<PolicyLossResult> r =
      grpo_policy_loss(PolicyLossInput{{1, 2}, cur, prev, gen, {}, mask, adv}, config);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dloss_dcur[0], 0.0f);
  const double r0 = std::exp(-0.9 + 1.0), r1 = std::exp(-2.1 + 2.0);
  EXPECT_NEAR(r->loss, -0.7 * r1 / 2.0, 1e-6);
  EXPECT_NEAR(r->dloss_dcur[1], -0.7 * r1 / 2.0, 1e-6);
  // Rule none applies weight 1 everywhere, the broken token included.
  config.is.rule = IsRule::kNone;
  r = grpo_policy_loss(PolicyLossInput{{1, 2}, cur, prev, gen, {}, mask, adv}, config);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->loss, -0.7 * (r0 + r1) / 2.0, 1e-6);
  EXPECT_NEAR(r->dloss_dcur[0], -0.7 * r0 / 2.0, 1e-6);
  EXPECT_EQ(r->stats.is_weight_mean, 1.0);
}

TEST(PolicyLoss, ProbsRatioMinMaxAreOfThePpoRatio) {
  // r = exp(cur - prev) = 0.8, 1.3, (masked 5.0), 1.05; the IS weights exp(prev - gen) are far
  // wider (0.2 .. 4) and must not show up here.
  const std::vector<float> prev = {-1.0f, -2.0f, -0.5f, -1.5f};
  const std::vector<float> cur = {
      static_cast<float>(-1.0 + std::log(0.8)), static_cast<float>(-2.0 + std::log(1.3)),
      static_cast<float>(-0.5 + std::log(5.0)), static_cast<float>(-1.5 + std::log(1.05))};
  const std::vector<float> gen = {static_cast<float>(-1.0 + std::log(5.0)),
                                  static_cast<float>(-2.0 - std::log(4.0)), -0.5f, -1.5f};
  const std::vector<uint8_t> mask = {1, 1, 0, 1};
  const std::vector<float> adv = {0.4f, -0.9f};
  PolicyLossConfig config;
  absl::StatusOr<PolicyLossResult> r =
      grpo_policy_loss(PolicyLossInput{{2, 2}, cur, prev, gen, {}, mask, adv}, config);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->stats.probs_ratio_min, 0.8, 1e-6);
  EXPECT_NEAR(r->stats.probs_ratio_max, 1.3, 1e-6);
  EXPECT_NEAR(r->stats.ratio_mean, (0.8 + 1.3 + 1.05) / 3.0, 1e-6);
}

TEST(PolicyLoss, TokenNormalizerScalesLossAndGradient) {
  PolicyLossConfig config;
  const Batch batch = random_batch(21, 0.3, 0.3, config.clip_eps);
  absl::StatusOr<PolicyLossResult> own = grpo_policy_loss(batch.input(false), config);
  ASSERT_TRUE(own.ok());
  config.token_normalizer = 4 * own->stats.valid_tokens;
  absl::StatusOr<PolicyLossResult> big = grpo_policy_loss(batch.input(false), config);
  ASSERT_TRUE(big.ok());
  EXPECT_NEAR(big->loss, own->loss / 4.0, 1e-9);
  for (size_t i = 0; i < own->dloss_dcur.size(); ++i) {
    EXPECT_NEAR(big->dloss_dcur[i], own->dloss_dcur[i] / 4.0f, 1e-8);
  }
}

TEST(PolicyLoss, RejectsBadInput) {
  PolicyLossConfig config;
  Batch batch = random_batch(5, 0.1, 0.1, config.clip_eps);
  batch.gen.pop_back();
  EXPECT_EQ(grpo_policy_loss(batch.input(false), config).status().message(),
            "policy loss: gen_logprobs has 35 entries, expected 36");
  batch = random_batch(5, 0.1, 0.1, config.clip_eps);
  config.kl_beta = 0.1;
  EXPECT_EQ(grpo_policy_loss(batch.input(false), config).status().message(),
            "policy loss: ref_logprobs has 0 entries, expected 36");
  config.kl_beta = 0.0;
  batch.cur[2] = NAN;
  batch.mask[2] = 1;
  EXPECT_EQ(grpo_policy_loss(batch.input(false), config).status().message(),
            "policy loss: cur_logprobs[2] is not finite at a valid token");
  batch = random_batch(5, 0.1, 0.1, config.clip_eps);
  config.is.hi = 0.9;
  EXPECT_EQ(grpo_policy_loss(batch.input(false), config).status().message(),
            "is.hi: must be >= 1 and finite, got 0.9");
}

TEST(PolicyLoss, NoValidTokensGivesZero) {
  PolicyLossConfig config;
  Batch batch = random_batch(6, 0.5, 0.5, config.clip_eps);
  std::fill(batch.mask.begin(), batch.mask.end(), 0);
  absl::StatusOr<PolicyLossResult> r = grpo_policy_loss(batch.input(false), config);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->loss, 0.0);
  EXPECT_EQ(r->stats.valid_tokens, 0);
  for (float g : r->dloss_dcur) EXPECT_EQ(g, 0.0f);
}

TEST(SftLoss, NllAndGradientMatchFiniteDifferences) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> logp(-4.0f, -0.01f);
  std::vector<float> lp(20);
  std::vector<uint8_t> mask(20);
  for (size_t i = 0; i < lp.size(); ++i) {
    lp[i] = logp(rng);
    mask[i] = i % 3 != 0;
  }
  absl::StatusOr<SftLossResult> r = sft_nll_loss(lp, mask);
  ASSERT_TRUE(r.ok());
  double sum = 0.0;
  int n = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    if (mask[i]) {
      sum += lp[i];
      ++n;
    }
  }
  EXPECT_EQ(r->valid_tokens, n);
  EXPECT_NEAR(r->loss, -sum / n, 1e-9);
  for (size_t i = 0; i < lp.size(); ++i) {
    std::vector<float> plus = lp;
    plus[i] += 0.01f;
    const double fd = (sft_nll_loss(plus, mask)->loss - r->loss) / (double(plus[i]) - lp[i]);
    EXPECT_NEAR(r->dloss_dlogp[i], fd, 1e-5) << i;
  }
  EXPECT_EQ(sft_nll_loss(lp, std::vector<uint8_t>(3, 1)).status().message(),
            "sft loss: logprobs has 20 entries but mask has 3");
}

}  // namespace
}  // namespace fp8rl::rl
