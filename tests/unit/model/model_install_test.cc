// Inference-only models (Model::ForInference + install): generation bit-identical to the full
// model built from the same version, storage reused in place across versions, only what the
// forward reads is held, and install errors name the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "engine/cpu/train_ops.h"
#include "kernels/formats.h"
#include "model/model.h"
#include "model/step_generator.h"
#include "model/weight_view.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

using testing::make_config;
using testing::randomize;

PrecisionPolicy fp8_policy(int64_t bf16_first, int64_t bf16_last, KvCacheDtype kv) {
  PrecisionPolicy p;
  p.linear = Precision::kFP8;
  p.kv_cache = kv;
  p.bf16_first_layers = bf16_first;
  p.bf16_last_layers = bf16_last;
  return p;
}

// A weight version of a random model (non-zero weights, norms and biases; calibrated-looking KV
// scales) in `format`.
WeightSet version_of(const ModelConfig& config, const PrecisionPolicy& policy, uint64_t seed,
                     WeightFormat format, int64_t version) {
  auto m = Model::Init(config, policy, seed);
  EXPECT_TRUE(m.ok()) << m.status();
  randomize(**m, seed, 0.2);
  KvScales kv;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    kv.k.push_back(0.01f + 0.003f * static_cast<float>(l + seed % 5));
    kv.v.push_back(0.02f + 0.002f * static_cast<float>(l + seed % 3));
  }
  EXPECT_TRUE((*m)->set_kv_scales(kv).ok());
  auto set = (*m)->export_weights(format, version);
  EXPECT_TRUE(set.ok()) << set.status();
  return std::move(*set);
}

std::vector<GenerationResult> run(std::shared_ptr<const Model> m) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.max_new_tokens = 12;
  params.seed = 7;
  std::vector<std::vector<int32_t>> prompts;
  Rng rng(3);
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(testing::random_tokens(rng, 3 + 2 * i, m->config().vocab_size));
  }
  auto out = generate(std::move(m), prompts, params);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<GenerationResult>{};
}

// Tokens equal and logprobs equal bit for bit.
void expect_identical(const std::vector<GenerationResult>& a,
                      const std::vector<GenerationResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "sequence " << i;
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size());
    EXPECT_EQ(0, std::memcmp(a[i].logprobs.data(), b[i].logprobs.data(),
                             a[i].logprobs.size() * sizeof(float)))
        << "sequence " << i;
    EXPECT_EQ(0, std::memcmp(a[i].full_logprobs.data(), b[i].full_logprobs.data(),
                             a[i].full_logprobs.size() * sizeof(float)))
        << "sequence " << i;
  }
}

struct Case {
  const char* name;
  ModelConfig config;
  PrecisionPolicy policy;
  WeightFormat format;
};

std::vector<Case> cases() {
  // hidden 160 / intermediate 192: partial 128-blocks; Qwen2 adds biases; untied adds lm_head.
  const ModelConfig llama = make_config(97, 160, 192, 4, 4, 2, /*tied=*/true);
  const ModelConfig qwen = make_config(90, 128, 256, 3, 4, 2, /*tied=*/false, /*qwen2=*/true);
  PrecisionPolicy bf16;
  bf16.linear = Precision::kBF16;
  bf16.kv_cache = KvCacheDtype::kBF16;
  return {
      {"llama fp8, bf16 first/last layers, fp8 kv", llama, fp8_policy(1, 1, KvCacheDtype::kFP8),
       WeightFormat::kFP8},
      {"qwen2 untied fp8, bf16 kv", qwen, fp8_policy(0, 0, KvCacheDtype::kBF16),
       WeightFormat::kFP8},
      {"llama bf16", llama, bf16, WeightFormat::kBF16},
      {"qwen2 bf16 version served in fp8 (quantized at install)", qwen,
       fp8_policy(0, 1, KvCacheDtype::kFP8), WeightFormat::kBF16},
  };
}

TEST(ModelInstallTest, GenerationIsBitIdenticalToTheFullModel) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const WeightSet set = version_of(c.config, c.policy, 11, c.format, 1);
    auto full = Model::FromWeightSet(set, c.policy);
    ASSERT_TRUE(full.ok()) << full.status();
    auto inf = Model::ForInference(c.config, c.policy);
    ASSERT_TRUE(inf.ok()) << inf.status();
    auto view = view_of(set);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE((*inf)->install(*view).ok());
    EXPECT_TRUE((*inf)->inference_only());
    EXPECT_EQ((*inf)->kv_scales().k, (*full)->kv_scales().k);
    const auto want = run(std::shared_ptr<const Model>(std::move(*full)));
    ASSERT_FALSE(want.empty());
    ASSERT_GT(want[0].tokens.size(), 0u);
    expect_identical(run(std::shared_ptr<const Model>(std::move(*inf))), want);
  }
}

TEST(ModelInstallTest, LaterVersionsAreWrittenInPlaceAndMatchAFreshLoad) {
  const Case c = cases()[0];
  auto inf = Model::ForInference(c.config, c.policy);
  ASSERT_TRUE(inf.ok()) << inf.status();
  std::shared_ptr<Model> m(std::move(*inf));
  int64_t bytes = 0;
  std::vector<GenerationResult> first;
  for (int64_t v = 1; v <= 3; ++v) {
    const WeightSet set = version_of(c.config, c.policy, 100 + v, c.format, v);
    auto view = view_of(set);
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(m->install(*view).ok()) << "version " << v;
    if (v == 1) bytes = m->weight_bytes();
    EXPECT_EQ(m->weight_bytes(), bytes) << "version " << v;
    auto full = Model::FromWeightSet(set, c.policy);
    ASSERT_TRUE(full.ok());
    const auto got = run(m);
    expect_identical(got, run(std::shared_ptr<const Model>(std::move(*full))));
    if (v == 1) first = got;
  }
  // The versions differ (the test would not notice a stale install otherwise).
  bool differs = false;
  const auto last = run(m);
  for (size_t i = 0; i < first.size(); ++i) differs |= first[i].tokens != last[i].tokens;
  EXPECT_TRUE(differs);
}

TEST(ModelInstallTest, HoldsOnlyWhatTheForwardReads) {
  const ModelConfig c = make_config(97, 160, 192, 4, 4, 2, /*tied=*/true);
  const PrecisionPolicy policy = fp8_policy(1, 0, KvCacheDtype::kFP8);
  const WeightSet set = version_of(c, policy, 5, WeightFormat::kFP8, 1);
  auto inf = Model::ForInference(c, policy);
  ASSERT_TRUE(inf.ok());
  auto view = view_of(set);
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE((*inf)->install(*view).ok());
  // FP8 layers 1..3: codes (1 B) + 128x128 scales (4 B); BF16 layer 0: the double operand (8 B);
  // tied embedding: held once, as the lm_head's double operand (8 B; the lookup reads it); norms.
  const int64_t h = 160, q = 160, kv = 80, f = 192, layers = 4;
  const int64_t shapes[7][2] = {{q, h}, {kv, h}, {kv, h}, {h, q}, {f, h}, {f, h}, {h, f}};
  int64_t fp8_layer = 0, bf16_layer = 0;
  for (const auto& s : shapes) {
    fp8_layer += s[0] * s[1] + ((s[0] + 127) / 128) * ((s[1] + 127) / 128) * 4;
    bf16_layer += s[0] * s[1] * 8;
  }
  const int64_t norms = (2 * layers + 1) * h * 4;
  const int64_t want = bf16_layer + 3 * fp8_layer + 97 * h * 8 + norms;
  EXPECT_EQ((*inf)->weight_bytes(), want);
  auto full = Model::FromWeightSet(set, policy);
  ASSERT_TRUE(full.ok());
  EXPECT_LT((*inf)->weight_bytes() * 2, (*full)->weight_bytes());
  EXPECT_TRUE((*inf)->params().empty());
}

TEST(ModelInstallTest, ErrorsNameTheTensor) {
  const Case c = cases()[0];
  const WeightSet good = version_of(c.config, c.policy, 9, c.format, 4);
  auto inf = Model::ForInference(c.config, c.policy);
  ASSERT_TRUE(inf.ok());
  Model& m = **inf;
  auto install = [&](const WeightSet& set) {
    auto view = view_of(set);
    EXPECT_TRUE(view.ok()) << view.status();
    return m.install(*view);
  };
  const std::string w = "model.layers.2.mlp.up_proj.weight";
  {
    WeightSet set = good;
    std::erase_if(set.tensors, [&](const NamedTensor& t) { return t.name == w; });
    const absl::Status s = install(set);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_NE(s.message().find(w), std::string::npos) << s;
  }
  {
    WeightSet set = good;
    for (auto& t : set.tensors) {
      if (t.name == w) t.bytes[17] = kernels::kE4M3NaN;
    }
    const absl::Status s = install(set);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(w), std::string::npos) << s;
    EXPECT_NE(s.message().find("non-finite"), std::string::npos) << s;
  }
  {
    WeightSet set = good;
    for (auto& t : set.tensors) {
      if (t.name == w + "_scale_inv") {
        const float zero = 0.0f;
        std::memcpy(t.bytes.data(), &zero, 4);
      }
    }
    const absl::Status s = install(set);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(w + "_scale_inv"), std::string::npos) << s;
  }
  {
    // A non-finite code in a layer the policy runs in bf16 (layer 0: dequantized at install)
    // and an infinite bf16 value in the embedding (converted straight from the wire).
    const std::string w0 = "model.layers.0.self_attn.q_proj.weight";
    const std::string e = "model.embed_tokens.weight";
    for (const std::string& name : {w0, e}) {
      WeightSet set = good;
      for (auto& t : set.tensors) {
        if (t.name != name) continue;
        if (name == w0) {
          t.bytes[t.bytes.size() - 3] = kernels::kE4M3NaN;
        } else {
          const uint16_t inf = 0x7F80;
          std::memcpy(t.bytes.data() + 2 * 1001, &inf, 2);
        }
      }
      const absl::Status s = install(set);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_NE(s.message().find(name), std::string::npos) << s;
      EXPECT_NE(s.message().find("non-finite"), std::string::npos) << s;
    }
  }
  {
    const ModelConfig other = make_config(97, 160, 192, 4, 4, 2, /*tied=*/false);
    const WeightSet set = version_of(other, c.policy, 9, c.format, 5);
    // A version of another shape: the embedding has 97 rows where the model has 98.
    ModelConfig wider = c.config;
    wider.vocab_size = 98;
    auto m2 = Model::ForInference(wider, c.policy);
    ASSERT_TRUE(m2.ok());
    auto view = view_of(set);
    ASSERT_TRUE(view.ok());
    const absl::Status s = (*m2)->install(*view);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("model.embed_tokens.weight"), std::string::npos) << s;
  }
  // After errors, a good version installs and serves as a fresh load would.
  ASSERT_TRUE(install(good).ok());
  auto full = Model::FromWeightSet(good, c.policy);
  ASSERT_TRUE(full.ok());
  const auto got = run(std::shared_ptr<const Model>(std::move(*inf)));
  expect_identical(got, run(std::shared_ptr<const Model>(std::move(*full))));
}

TEST(ModelInstallTest, InferenceOnlyModelsRefuseWhatNeedsTheMaster) {
  const Case c = cases()[0];
  PrecisionPolicy f32;
  auto bad = Model::ForInference(c.config, f32);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("policy.linear"), std::string::npos);

  auto inf = Model::ForInference(c.config, c.policy);
  ASSERT_TRUE(inf.ok());
  const WeightSet set = version_of(c.config, c.policy, 2, c.format, 1);
  auto live = view_of(set);
  ASSERT_TRUE(live.ok());
  ASSERT_TRUE((*inf)->install(*live).ok());
  EXPECT_EQ((*inf)->export_weights(WeightFormat::kFP8).status().code(),
            absl::StatusCode::kFailedPrecondition);
  engine::CpuTrainStep ctx;
  auto lp = ctx.forward(**inf, {{1, 2, 3, 4}}, {});
  ASSERT_TRUE(lp.ok()) << lp.status();
  std::vector<float> grads(16, 0.0f);
  EXPECT_EQ(ctx.backward(**inf, {{1.0f, 1.0f, 1.0f}}, grads.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  auto full = Model::FromWeightSet(set, c.policy);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ((*full)->install(*live).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fp8rl::model
