// Training: a tiny model learns a small supervised task in fp32, bf16 and fp8 (fprop, dgrad and
// wgrad through the FP8 module), gradient accumulation equals one big batch, the LR schedule,
// a training checkpoint (weights + AdamW state) resumes exactly, and AdamW::set_lr equals
// rebuilding the optimizer with the new lr and its saved state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "engine/cpu/train_ops.h"
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
    engine::CpuTrainStep ctx;
    auto lp = ctx.forward(m, batch, {.calibrator = &cal});
    ASSERT_TRUE(lp.ok());
    TokenValues dlogp;
    const double loss = token_nll(*lp, nullptr, &dlogp);
    if (step == 0) first = loss;
    last = loss;
    std::fill(grads.begin(), grads.end(), 0.0f);
    ASSERT_TRUE(ctx.backward(m, dlogp, grads.data()).ok());
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
    engine::CpuTrainStep ctx;
    auto lp = ctx.forward(m, b, {});
    TokenValues dlogp;
    for (auto& s : *lp) dlogp.emplace_back(s.size(), 0.5f);
    std::vector<float> g(m.num_params(), 0.0f);
    EXPECT_TRUE(ctx.backward(m, dlogp, g.data()).ok());
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
    engine::CpuTrainStep ctx;
    auto lp = ctx.forward(model, b, {});
    TokenValues dlogp;
    token_nll(*lp, nullptr, &dlogp);
    std::vector<float> g(model.num_params(), 0.0f);
    EXPECT_TRUE(ctx.backward(model, dlogp, g.data()).ok());
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

// Random non-zero gradients, a fresh copy per step (step() scales and clips them in place).
std::vector<float> random_grads(Rng& rng, int64_t n) {
  std::vector<float> g(n);
  for (float& x : g) x = static_cast<float>(0.05 * rng.normal());
  return g;
}

struct AdamWState {
  std::vector<float> m, v;
};

AdamWState read_state(const AdamW& opt, const std::string& path) {
  EXPECT_TRUE(opt.save_state(path).ok());
  auto f = SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  auto m = f->read_f32("adamw.exp_avg");
  auto v = f->read_f32("adamw.exp_avg_sq");
  EXPECT_TRUE(m.ok() && v.ok());
  return {std::move(*m), std::move(*v)};
}

// The tensors of two weight sets whose bytes differ (names in `a`'s order).
std::vector<std::string> differing_tensors(const WeightSet& a, const WeightSet& b) {
  std::vector<std::string> out;
  for (const NamedTensor& t : a.tensors) {
    const NamedTensor* u = b.find(t.name);
    if (u == nullptr || u->bytes != t.bytes) out.push_back(t.name);
  }
  return out;
}

// A model loaded from an FP8 checkpoint uses the checkpoint's codes and scales as they are until
// its first update; the update's re-quantization then derives every FP8 layer from the updated
// master, as for any model (the first refresh after the load used to keep the loaded codes, so
// the first update reached the FP8 working weights, and the published version, one step late).
TEST(Training, FirstUpdateAfterAnFp8CheckpointRequantizesItsLayers) {
  const ModelConfig c = testing::make_config(40, 128, 256, 2, 4, 2, false);
  const PrecisionPolicy fp8{.linear = Precision::kFP8};
  auto made = Model::Init(c, fp8, 23);
  ASSERT_TRUE(made.ok());
  testing::randomize(**made, 23);
  testing::TempDir dir;
  ASSERT_TRUE((*made)->save(dir / "fp8", WeightFormat::kFP8).ok());
  auto loaded = Model::Load(dir / "fp8", fp8);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Model& m = **loaded;
  const WeightSet checkpoint = *m.export_weights(WeightFormat::kFP8);
  EXPECT_TRUE(differing_tensors(*(*made)->export_weights(WeightFormat::kFP8), checkpoint).empty());

  AdamW opt(m, {.lr = 2e-2});
  Rng rng(29);
  std::vector<float> g = random_grads(rng, m.num_params());
  ASSERT_TRUE(opt.step(m, g.data()).ok());
  // The same master in a model that never held pinned codes, re-derived by refresh().
  auto fresh = Model::Init(c, fp8, 1);
  ASSERT_TRUE(fresh.ok());
  std::copy(m.params().begin(), m.params().end(), (*fresh)->params().begin());
  (*fresh)->refresh();
  const WeightSet after = *m.export_weights(WeightFormat::kFP8);
  EXPECT_EQ(differing_tensors(*(*fresh)->export_weights(WeightFormat::kFP8), after),
            std::vector<std::string>{});
  // The update moved the FP8 layers (so the comparison above can tell stale codes apart).
  const std::vector<std::string> moved = differing_tensors(checkpoint, after);
  EXPECT_TRUE(std::any_of(moved.begin(), moved.end(), [](const std::string& name) {
    return absl::StrContains(name, "q_proj.weight") && !absl::StrContains(name, "scale");
  })) << absl::StrJoin(moved, ", ");
}

// ZeRO-2's optimizer (docs/design/sharding.md): AdamW cut into shards at uneven points (one
// shard empty), each stepped with the whole gradient's norm, gives the whole optimizer's master
// weights bit for bit over several clipped, decayed steps; the moments of the other shards are
// freed.
TEST(Training, ShardedAdamWEqualsTheWholeStep) {
  const ModelConfig c = testing::make_config(29, 48, 64, 2, 4, 2, false);
  const AdamWConfig cfg{.lr = 2e-2, .weight_decay = 0.1, .max_grad_norm = 0.5, .warmup_steps = 2};
  auto whole_model = Model::Init(c, {}, 17);
  ASSERT_TRUE(whole_model.ok());
  testing::randomize(**whole_model, 17);
  Model& whole = **whole_model;
  const int64_t n = whole.num_params();
  const std::vector<int64_t> bounds = {0, n / 3 + 1, n / 3 + 1, n - 37, n};
  const int shards = static_cast<int>(bounds.size()) - 1;
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::unique_ptr<AdamW>> opts;
  AdamW whole_opt(whole, cfg);
  for (int r = 0; r < shards; ++r) {
    auto m = Model::Init(c, {}, 17);
    ASSERT_TRUE(m.ok());
    testing::randomize(**m, 17);
    opts.push_back(std::make_unique<AdamW>(**m, cfg));
    ASSERT_TRUE(opts.back()->shard(bounds[r], bounds[r + 1]).ok());
    EXPECT_EQ(opts.back()->shard_size(), bounds[r + 1] - bounds[r]);
    models.push_back(std::move(*m));
  }
  Rng rng(9);
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> g = random_grads(rng, n);
    double sq = 0;
    for (float x : g) sq += static_cast<double>(x) * x;
    std::vector<float> gw = g;
    absl::StatusOr<OptimizerStepStats> want = whole_opt.step(whole, gw.data());
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(want->clipped);  // the clip factor is exercised
    for (int r = 0; r < shards; ++r) {
      std::vector<float> gs(g.begin() + bounds[r], g.begin() + bounds[r + 1]);
      absl::StatusOr<OptimizerStepStats> got =
          opts[r]->step_shard(models[r]->params(), gs, std::sqrt(sq));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->grad_norm, want->grad_norm);
      EXPECT_EQ(got->lr, want->lr);
      EXPECT_EQ(got->step, want->step);
      for (int64_t i = bounds[r]; i < bounds[r + 1]; ++i) {
        ASSERT_EQ(models[r]->params()[i], whole.params()[i]) << "step " << step << " param " << i;
        ASSERT_EQ(gs[i - bounds[r]], gw[i]) << "clipped gradient " << i;
      }
    }
    // The shards are gathered before the next step, as the learner's all-gather does.
    for (int r = 0; r < shards; ++r) {
      std::copy(whole.params().begin(), whole.params().end(), models[r]->params().begin());
    }
  }
  // Whole-model calls are refused on a sharded optimizer, and a bad range names it.
  std::vector<float> g(n, 0.5f);
  EXPECT_EQ(opts[0]->step(*models[0], g.data()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(opts[0]->save_state("/tmp/zero_never_written").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(opts[0]->shard(0, 1).code(), absl::StatusCode::kInvalidArgument);
  AdamW fresh(whole, cfg);
  absl::Status out_of_range = fresh.shard(5, n + 1);
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out_of_range.message(), "outside")) << out_of_range;
  std::vector<float> nan_grads(static_cast<size_t>(opts[1]->shard_size()), 1.0f);
  EXPECT_EQ(
      opts[1]
          ->step_shard(models[1]->params(), nan_grads, std::numeric_limits<double>::quiet_NaN())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(Training, SetLrEqualsRebuildingWithSavedState) {
  const ModelConfig c = testing::make_config(29, 48, 64, 2, 4, 2, false);
  const AdamWConfig cfg{.lr = 2e-2,
                        .weight_decay = 0.1,
                        .max_grad_norm = 0.5,
                        .warmup_steps = 2,
                        .schedule = LrSchedule::kCosine,
                        .total_steps = 8,
                        .min_lr_ratio = 0.2};
  auto make = [&] {
    auto m = Model::Init(c, {}, 17);
    EXPECT_TRUE(m.ok());
    testing::randomize(**m, 17);
    return std::move(*m);
  };
  // a: set_lr; b: rebuilt with the new lr + saved/loaded state (the old way); u: unchanged.
  std::unique_ptr<Model> ma = make(), mb = make(), mu = make();
  const int64_t n = ma->num_params();
  auto opt_a = std::make_unique<AdamW>(*ma, cfg);
  auto opt_b = std::make_unique<AdamW>(*mb, cfg);
  auto opt_u = std::make_unique<AdamW>(*mu, cfg);
  Rng rng(5);
  auto step_all = [&] {
    const std::vector<float> g = random_grads(rng, n);
    std::vector<float> ga = g, gb = g, gu = g;
    auto sa = opt_a->step(*ma, ga.data(), 1.5f);
    auto sb = opt_b->step(*mb, gb.data(), 1.5f);
    auto su = opt_u->step(*mu, gu.data(), 1.5f);
    EXPECT_TRUE(sa.ok() && sb.ok() && su.ok());
    EXPECT_EQ(sa->lr, sb->lr);
    return std::make_pair(sa->lr, su->lr);
  };
  for (int i = 0; i < 3; ++i) step_all();

  constexpr double kNewLr = 7e-3;
  ASSERT_TRUE(opt_a->set_lr(kNewLr).ok());
  testing::TempDir dir;
  ASSERT_TRUE(opt_b->save_state(dir / "b.safetensors").ok());
  AdamWConfig rebuilt = cfg;
  rebuilt.lr = kNewLr;
  opt_b = std::make_unique<AdamW>(*mb, rebuilt);
  ASSERT_TRUE(opt_b->load_state(dir / "b.safetensors").ok());

  EXPECT_EQ(opt_a->config().lr, kNewLr);
  EXPECT_EQ(opt_a->steps(), 3);
  for (int64_t k = 0; k < 10; ++k) {
    EXPECT_EQ(opt_a->lr_at(k), opt_b->lr_at(k)) << k;
    // The schedule scales the new base lr exactly as it scaled the old one.
    EXPECT_NEAR(opt_a->lr_at(k), opt_u->lr_at(k) * kNewLr / cfg.lr, 1e-15) << k;
  }
  for (int i = 0; i < 4; ++i) {
    const auto [lr_a, lr_u] = step_all();
    EXPECT_NEAR(lr_a, lr_u * kNewLr / cfg.lr, 1e-15);
    EXPECT_LT(lr_a, lr_u);
  }
  EXPECT_EQ(opt_a->steps(), 7);
  EXPECT_EQ(opt_b->steps(), 7);

  auto pa = ma->params(), pb = mb->params(), pu = mu->params();
  int64_t differ_u = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(pa[i], pb[i]) << "param " << i;
    differ_u += pa[i] != pu[i];
  }
  EXPECT_GT(differ_u, n / 2);  // not changing the lr gives other weights
  const AdamWState sa = read_state(*opt_a, dir / "a.safetensors");
  const AdamWState sb = read_state(*opt_b, dir / "b2.safetensors");
  ASSERT_EQ(sa.m.size(), static_cast<size_t>(n));
  EXPECT_EQ(sa.m, sb.m);
  EXPECT_EQ(sa.v, sb.v);
  EXPECT_GT(testing::max_abs(sa.m.data(), n), 0);
}

TEST(Training, SetLrRejectsBadValuesAndKeepsTheOptimizer) {
  auto made = Model::Init(testing::make_config(8, 8, 8, 1, 1, 1, true), {}, 1);
  ASSERT_TRUE(made.ok());
  AdamW opt(**made, {.lr = 3e-3});
  for (double bad : {0.0, -1e-3, std::nan(""), std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    const absl::Status s = opt.set_lr(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StartsWith(s.message(), "lr: ")) << s;
    EXPECT_EQ(opt.config().lr, 3e-3);
  }
  EXPECT_TRUE(opt.set_lr(1e-300).ok());  // tiny but positive is allowed
  EXPECT_EQ(opt.lr_at(0), 1e-300);
}

}  // namespace
}  // namespace fp8rl::model
