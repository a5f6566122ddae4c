// Training: a tiny model learns a small supervised task in fp32, bf16 and fp8 (fprop, dgrad and
// wgrad through the FP8 module), gradient accumulation equals one big batch, the LR schedule,
// and a training checkpoint (weights + AdamW state) resumes exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/model.h"
#include "model/nll.h"
#include "model/optimizer.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

constexpr int64_t kVocab = 16;

// The task: token[i+1] = (token[i] + 1) mod 16 from a random start; every target is determined,
// so the best loss is 0 and a uniform model scores ln 16 = 2.77 nats.
TokenBatch counting_batch(Rng& rng, int n, int len) {
  TokenBatch b;
  for (int s = 0; s < n; ++s) {
    std::vector<int32_t> t(len);
    t[0] = static_cast<int32_t>(rng.next() % kVocab);
    for (int i = 1; i < len; ++i) t[i] = (t[i - 1] + 1) % kVocab;
    b.push_back(t);
  }
  return b;
}

class LearnTest : public ::testing::TestWithParam<Precision> {};

TEST_P(LearnTest, TinyModelLearnsCounting) {
  const PrecisionPolicy policy{
      .linear = GetParam(),
      .kv_cache = GetParam() == Precision::kFP8 ? KvCacheDtype::kFP8 : KvCacheDtype::kF32};
  auto made = Model::Init(testing::make_config(kVocab, 64, 128, 1, 2, 1, false), policy, 4, 0.1f);
  ASSERT_TRUE(made.ok());
  Model& m = **made;
  AdamWConfig cfg{.lr = 1e-2,
                  .weight_decay = 0.01,
                  .max_grad_norm = 1.0,
                  .warmup_steps = 5,
                  .schedule = LrSchedule::kCosine,
                  .total_steps = 80,
                  .min_lr_ratio = 0.1};
  AdamW opt(m, cfg);
  Rng rng(8);
  std::vector<float> grads(m.num_params());
  double first = 0, last = 0;
  KvCalibrator cal(1);
  for (int step = 0; step < 80; ++step) {
    const TokenBatch batch = counting_batch(rng, 8, 12);
    ForwardContext ctx;
    auto lp = m.forward(batch, {.calibrator = &cal}, &ctx);
    ASSERT_TRUE(lp.ok());
    TokenValues dlogp;
    const double loss = token_nll(*lp, nullptr, &dlogp);
    if (step == 0) first = loss;
    last = loss;
    std::fill(grads.begin(), grads.end(), 0.0f);
    ASSERT_TRUE(m.backward(ctx, dlogp, grads.data()).ok());
    ASSERT_TRUE(opt.step(m, grads.data()).ok());
    if (policy.kv_cache == KvCacheDtype::kFP8 && step % 10 == 9) {
      ASSERT_TRUE(m.set_kv_scales(cal.scales()).ok());  // recalibrate like the trainer does
      cal.clear();
    }
  }
  std::printf("[train] %s: loss %.3f -> %.4f\n", std::string(precision_name(GetParam())).c_str(),
              first, last);
  EXPECT_GT(first, 2.0);
  // 0.1 nats: on average p(correct next token) > 0.9, far from the uniform 2.77.
  EXPECT_LT(last, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Precisions, LearnTest,
                         ::testing::Values(Precision::kF32, Precision::kBF16, Precision::kFP8),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(Training, GradientAccumulationEqualsOneBatch) {
  auto made = Model::Init(testing::make_config(29, 32, 48, 2, 4, 2, true, true), {}, 2);
  ASSERT_TRUE(made.ok());
  Model& m = **made;
  testing::randomize(m, 3);
  Rng rng(1);
  TokenBatch all = {testing::random_tokens(rng, 7, 29), testing::random_tokens(rng, 5, 29),
                    testing::random_tokens(rng, 9, 29)};
  auto grads_of = [&](const TokenBatch& b) {
    ForwardContext ctx;
    auto lp = m.forward(b, {}, &ctx);
    TokenValues dlogp;
    for (auto& s : *lp) dlogp.emplace_back(s.size(), 0.5f);
    std::vector<float> g(m.num_params(), 0.0f);
    EXPECT_TRUE(m.backward(ctx, dlogp, g.data()).ok());
    return g;
  };
  const std::vector<float> one = grads_of(all);
  std::vector<float> acc = grads_of({all[0]});
  const std::vector<float> second = grads_of({all[1], all[2]});
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += second[i];
  const double scale = testing::max_abs(one.data(), one.size());
  ASSERT_GT(scale, 0);
  EXPECT_LE(testing::max_abs_diff(one.data(), acc.data(), one.size()) / scale, 1e-5);
}

TEST(Training, LearningRateSchedule) {
  auto made = Model::Init(testing::make_config(8, 8, 8, 1, 1, 1, true), {}, 1);
  ASSERT_TRUE(made.ok());
  AdamW opt(**made, {.lr = 1.0,
                     .warmup_steps = 4,
                     .schedule = LrSchedule::kCosine,
                     .total_steps = 14,
                     .min_lr_ratio = 0.1});
  EXPECT_DOUBLE_EQ(opt.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(opt.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(opt.lr_at(4), 1.0);
  EXPECT_NEAR(opt.lr_at(9), 0.55, 1e-12);  // half way: 0.1 + 0.9 * 0.5
  EXPECT_NEAR(opt.lr_at(14), 0.1, 1e-12);
  EXPECT_FALSE(validate_adamw_config({.lr = -1}).ok());
  EXPECT_FALSE(validate_adamw_config({.schedule = LrSchedule::kCosine}).ok());
}

TEST(Training, CheckpointResumesExactly) {
  const ModelConfig c = testing::make_config(23, 32, 40, 1, 2, 2, false);
  auto made = Model::Init(c, {}, 6);
  ASSERT_TRUE(made.ok());
  Model& m = **made;
  AdamW opt(m, {.lr = 1e-2});
  Rng rng(2);
  const TokenBatch b = {testing::random_tokens(rng, 10, 23)};
  auto train_step = [&](Model& model, AdamW& o) {
    ForwardContext ctx;
    auto lp = model.forward(b, {}, &ctx);
    TokenValues dlogp;
    token_nll(*lp, nullptr, &dlogp);
    std::vector<float> g(model.num_params(), 0.0f);
    EXPECT_TRUE(model.backward(ctx, dlogp, g.data()).ok());
    EXPECT_TRUE(o.step(model, g.data()).ok());
  };
  train_step(m, opt);
  testing::TempDir dir;
  ASSERT_TRUE(save_training_checkpoint(dir / "ckpt", m, opt).ok());
  AdamW opt2(m, {.lr = 1e-2});
  auto resumed = load_training_checkpoint(dir / "ckpt", {}, &opt2);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(opt2.steps(), 1);
  train_step(m, opt);
  train_step(**resumed, opt2);
  auto a = m.params();
  auto r = (*resumed)->params();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], r[i]) << i;
  // A missing optimizer file is a clear error.
  AdamW opt3(m, {});
  EXPECT_FALSE(opt3.load_state(dir / "nope.safetensors").ok());
}

}  // namespace
}  // namespace fp8rl::model
