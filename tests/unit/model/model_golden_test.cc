// The fp32 engine against an independent PyTorch implementation (tests/reference/llama_ref.py, run
// in float64): logits and the gradient of every parameter, for GQA / MHA, tied / untied, Llama,
// Llama 3.1 rope scaling, Qwen2/2.5 (q/k/v bias) and Qwen3 (q/k norm, head_dim != hidden / heads);
// plus finite-difference checks of the backward on micro configs. Skips (with a message) when the
// oracle's PyTorch is not installed.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "engine/cpu/train_ops.h"
#include "model/model.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

using testing::kGradRelTol;
using testing::kLogitRelTol;

struct GoldenCase {
  std::string name;
  ModelConfig config;
  float temperature;
};

const GoldenCase kCases[] = {
    {"llama_gqa_untied", testing::make_config(61, 64, 96, 2, 4, 2, false), 1.0f},
    {"llama_mha_tied", testing::make_config(53, 48, 80, 2, 3, 3, true), 0.7f},
    {"qwen2_gqa_bias_tied", testing::make_config(47, 64, 112, 2, 8, 2, true, true), 1.3f},
    {"qwen25_gqa_bias_untied", testing::make_config(45, 48, 96, 2, 4, 2, false, true), 1.0f},
    // head_dim 16 with hidden 48 / 4 heads: q_dim 64 != hidden.
    {"qwen3_gqa_headdim_tied", testing::make_qwen3_config(59, 48, 96, 2, 4, 2, 16, true), 0.9f},
    {"qwen3_mha_headdim_untied", testing::make_qwen3_config(37, 32, 64, 2, 2, 2, 24, false), 1.0f},
    {"llama31_rope_scaled_gqa_untied",
     testing::with_llama3_rope(testing::make_config(61, 64, 96, 2, 4, 2, false)), 1.0f},
};

// One case's model, batch and the oracle's answers.
struct Prepared {
  std::unique_ptr<Model> model;
  TokenBatch batch;
  TokenValues dlogp;
  std::unique_ptr<SafetensorsFile> golden;
};

// Builds one case and runs the oracle on it (one python start per case: ctest runs each case in
// its own process, so a suite-wide oracle run would be repeated for every case).
class GoldenTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    torch_missing_ = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0;
  }
  static void TearDownTestSuite() { delete dir_; }

  static void prepare(size_t c, Prepared& p) {
    const GoldenCase& gc = kCases[c];
    auto made = Model::Init(gc.config, {}, 1);
    ASSERT_TRUE(made.ok()) << made.status();
    p.model = std::move(*made);
    testing::randomize(*p.model, 7 + c);
    const std::string ckpt = *dir_ / gc.name;
    ASSERT_TRUE(p.model->save(ckpt).ok());
    Rng rng(11 + c);
    // 40 tokens: the llama3-scaled low frequencies turn far enough to matter.
    p.batch = {testing::random_tokens(rng, 9, gc.config.vocab_size),
               testing::random_tokens(rng, 14, gc.config.vocab_size),
               testing::random_tokens(rng, 1, gc.config.vocab_size),
               testing::random_tokens(rng, 40, gc.config.vocab_size)};
    for (const auto& s : p.batch) {
      p.dlogp.emplace_back(s.size() - 1);
      for (auto& v : p.dlogp.back()) v = static_cast<float>(rng.normal());
    }
    nlohmann::json req = {
        {"sequences", p.batch}, {"dlogp", p.dlogp}, {"temperature", gc.temperature}};
    std::ofstream(ckpt + ".json") << req.dump();
    const std::string cmd =
        absl::StrCat("/usr/bin/python3 ", testing::source_dir(), "/tests/reference/llama_ref.py ",
                     ckpt, " ", ckpt, ".json ", ckpt, ".out.safetensors");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto golden = SafetensorsFile::Open(ckpt + ".out.safetensors");
    ASSERT_TRUE(golden.ok()) << golden.status();
    p.golden = std::make_unique<SafetensorsFile>(std::move(*golden));
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline bool torch_missing_ = false;
};

TEST_P(GoldenTest, LogitsAndEveryGradientMatchPyTorch) {
  const GoldenCase& gc = kCases[GetParam()];
  if (torch_missing_) {
    GTEST_SKIP() << "SKIPPED: /usr/bin/python3 has no torch (apt python3-torch), the PyTorch "
                    "oracle cannot run";
  }
  Prepared p;
  ASSERT_NO_FATAL_FAILURE(prepare(GetParam(), p));
  Model& m = *p.model;
  const TokenBatch& batch = p.batch;
  const TokenValues& dlogp = p.dlogp;
  engine::CpuTrainStep ctx;
  auto lp = ctx.forward(m, batch, {.temperature = gc.temperature});
  ASSERT_TRUE(lp.ok()) << lp.status();
  double worst_logit = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    auto ref_logits = p.golden->read_f32(absl::StrCat("logits.", s));
    ASSERT_TRUE(ref_logits.ok());
    auto logits = engine::cpu_logits(m, batch[s]);
    ASSERT_TRUE(logits.ok());
    ASSERT_EQ(logits->size(), ref_logits->size());
    const double scale = testing::max_abs(ref_logits->data(), ref_logits->size());
    ASSERT_GT(scale, 0.1) << "logits must be non-trivial";
    const double err =
        testing::max_abs_diff(logits->data(), ref_logits->data(), logits->size()) / scale;
    EXPECT_LE(err, kLogitRelTol) << "sequence " << s;
    worst_logit = std::max(worst_logit, err);
    auto ref_lp = p.golden->read_f32(absl::StrCat("logprobs.", s));
    ASSERT_TRUE(ref_lp.ok());
    ASSERT_EQ(ref_lp->size(), (*lp)[s].size());
    for (size_t i = 0; i < ref_lp->size(); ++i) EXPECT_NEAR((*lp)[s][i], (*ref_lp)[i], 1e-4);
  }

  std::vector<float> grads(m.num_params(), 0.0f);
  ASSERT_TRUE(ctx.backward(m, dlogp, grads.data()).ok());
  double worst = 0;
  for (const ParamInfo& info : m.layout().params()) {
    auto ref = p.golden->read_f32("grad." + info.name);
    ASSERT_TRUE(ref.ok()) << info.name;
    ASSERT_EQ(static_cast<int64_t>(ref->size()), info.numel);
    const double scale = testing::max_abs(ref->data(), info.numel);
    ASSERT_GT(scale, 0.0) << info.name << ": oracle gradient is zero";
    const double err =
        testing::max_abs_diff(grads.data() + info.offset, ref->data(), info.numel) / scale;
    EXPECT_LE(err, kGradRelTol) << info.name;
    worst = std::max(worst, err);
  }
  std::printf(
      "[golden] %s: logits worst relative error %.2e (bar %.0e); %zu parameter gradients, worst "
      "relative error %.2e (bar %.0e)\n",
      gc.name.c_str(), worst_logit, kLogitRelTol, m.layout().params().size(), worst, kGradRelTol);
}

INSTANTIATE_TEST_SUITE_P(Configs, GoldenTest,
                         ::testing::Range(0, static_cast<int>(std::size(kCases))),
                         [](const auto& info) { return kCases[info.param].name; });

// Directional finite differences of L = sum dlogp * logprobs in fp32 on micro configs (Qwen2 with
// bias; Qwen3 with q/k norm, head_dim 12 != 16 / 2 and llama3 rope scaling):
// (L(p + e d) - L(p - e d)) / 2e vs grad . d, per parameter tensor.
class FiniteDifference : public ::testing::TestWithParam<int> {};

TEST_P(FiniteDifference, BackwardMatchesCentralDifferences) {
  const ModelConfig c =
      GetParam() == 0
          ? testing::make_config(13, 16, 24, 2, 2, 1, false, true)
          : testing::with_llama3_rope(testing::make_qwen3_config(13, 16, 24, 2, 2, 1, 12, false));
  auto made = Model::Init(c, {}, 3);
  ASSERT_TRUE(made.ok());
  Model& m = **made;
  testing::randomize(m, 5, 0.3);
  Rng rng(9);
  TokenBatch batch = {testing::random_tokens(rng, 6, c.vocab_size),
                      testing::random_tokens(rng, 4, c.vocab_size)};
  TokenValues dlogp;
  for (const auto& s : batch) {
    dlogp.emplace_back(s.size() - 1);
    for (auto& v : dlogp.back()) v = static_cast<float>(rng.normal());
  }
  auto loss = [&]() {
    auto lp = engine::cpu_logprobs(m, batch, {.temperature = 0.9f});
    double l = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      for (size_t i = 0; i < dlogp[s].size(); ++i)
        l += static_cast<double>(dlogp[s][i]) * (*lp)[s][i];
    }
    return l;
  };
  engine::CpuTrainStep ctx;
  ASSERT_TRUE(ctx.forward(m, batch, {.temperature = 0.9f}).ok());
  std::vector<float> grads(m.num_params(), 0.0f);
  ASSERT_TRUE(ctx.backward(m, dlogp, grads.data()).ok());
  const std::vector<float> base(m.params().begin(), m.params().end());
  const double eps = 2e-3;
  for (const ParamInfo& p : m.layout().params()) {
    // A random unit direction, so the step is eps in parameter space.
    std::vector<double> d(p.numel);
    double norm = 0;
    for (auto& x : d) {
      x = rng.normal();
      norm += x * x;
    }
    double analytic = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      d[i] /= std::sqrt(norm);
      analytic += d[i] * grads[p.offset + i];
    }
    double lossp = 0, lossm = 0;
    for (int sign : {1, -1}) {
      for (int64_t i = 0; i < p.numel; ++i) {
        m.params()[p.offset + i] = static_cast<float>(base[p.offset + i] + sign * eps * d[i]);
      }
      m.refresh();
      (sign > 0 ? lossp : lossm) = loss();
    }
    std::copy(base.begin(), base.end(), m.params().begin());
    m.refresh();
    const double numeric = (lossp - lossm) / (2 * eps);
    EXPECT_NEAR(analytic, numeric, 2e-3 + 1e-2 * std::fabs(numeric)) << p.name;
    ASSERT_GT(std::fabs(analytic), 1e-3) << p.name << ": gradient too small to test";
  }
}

INSTANTIATE_TEST_SUITE_P(MicroConfigs, FiniteDifference, ::testing::Values(0, 1),
                         [](const auto& info) {
                           return info.param == 0 ? std::string("qwen2_bias")
                                                  : std::string("qwen3_qknorm_llama3_rope");
                         });

}  // namespace
}  // namespace fp8rl::model
