// The architectures beyond plain Llama/Qwen2: Qwen3 (per-head q/k RMSNorm, explicit head_dim) and
// Llama 3.1 rope scaling. Real config.json shapes parse to the right layout, every key that would
// change the math without being implemented is an error naming it, the llama3 frequencies have
// the HF piecewise shape, and in every linear precision generation matches training and the
// backward matches the fp32 backward. (Numerics against PyTorch: model_golden_test.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/cpu/train_ops.h"
#include "kernels/calc_diff.h"
#include "model/model.h"
#include "model/ops.h"
#include "model/step_generator.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

using Json = nlohmann::ordered_json;

// The architecture fields of the published config.json of each model family (HF hub).
Json qwen3_0_6b() {
  return Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

Json llama31_8b() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256})");
}

Json qwen25_1_5b() {
  return Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1536,
    "initializer_range": 0.02, "intermediate_size": 8960, "max_position_embeddings": 32768,
    "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 12,
    "num_hidden_layers": 28, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

TEST(ArchConfig, Qwen3RealConfigHasQkNormAndHeadDim) {
  auto c = parse_model_config(qwen3_0_6b().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm());
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 2048);  // != hidden_size 1024
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->rope_scaling.llama3());
  const ParamLayout layout(*c);
  // Qwen3-0.6B's model card: 0.6B parameters, 0.44B without the (tied) embedding.
  EXPECT_EQ(layout.total(), 596049920);
  EXPECT_EQ(layout.total() - 151936 * 1024, 440467456);
  const int64_t qn = layout.find("model.layers.27.self_attn.q_norm.weight");
  const int64_t kn = layout.find("model.layers.27.self_attn.k_norm.weight");
  ASSERT_GE(qn, 0);
  ASSERT_GE(kn, 0);
  EXPECT_EQ(layout.params()[qn].shape, std::vector<int64_t>{128});
  EXPECT_EQ(layout.params()[kn].kind, ParamKind::kNorm);
  EXPECT_EQ(layout.find("model.layers.0.self_attn.q_proj.bias"), -1);
  EXPECT_EQ(layout.find("lm_head.weight"), -1);

  // head_dim defaults to 128 for qwen3 (Qwen3Config), to hidden / heads otherwise.
  Json j = qwen3_0_6b();
  j.erase("head_dim");
  j["hidden_size"] = 512;
  auto d = parse_model_config(j.dump());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->head_dim, 128);
}

TEST(ArchConfig, Llama31RopeScalingAndQwen25Parse) {
  auto l = parse_model_config(llama31_8b().dump());
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->rope_scaling.llama3());
  EXPECT_EQ(l->rope_scaling.factor, 8.0);
  EXPECT_EQ(l->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(l->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l->rope_theta, 500000.0);
  EXPECT_FALSE(l->qk_norm());
  EXPECT_EQ(l->head_dim, 128);

  auto q = parse_model_config(qwen25_1_5b().dump());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->attention_bias);
  EXPECT_FALSE(q->qk_norm());
  EXPECT_GE(ParamLayout(*q).find("model.layers.3.self_attn.k_proj.bias"), 0);

  // transformers 5 spells it rope_parameters, with rope_theta inside.
  Json j = llama31_8b();
  j["rope_parameters"] = j["rope_scaling"];
  j["rope_parameters"]["rope_theta"] = 250000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  auto v5 = parse_model_config(j.dump());
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_TRUE(v5->rope_scaling.llama3());
  EXPECT_EQ(v5->rope_theta, 250000.0);
}

TEST(ArchConfig, WrittenConfigReadsBackTheSame) {
  for (const Json& src : {qwen3_0_6b(), llama31_8b(), qwen25_1_5b()}) {
    auto a = parse_model_config(src.dump());
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string text = model_config_to_json(*a);
    auto b = parse_model_config(text);
    ASSERT_TRUE(b.ok()) << b.status() << "\n" << text;
    EXPECT_EQ(b->model_type, a->model_type);
    EXPECT_EQ(b->head_dim, a->head_dim);
    EXPECT_EQ(b->attention_bias, a->attention_bias);
    EXPECT_EQ(b->tie_word_embeddings, a->tie_word_embeddings);
    EXPECT_EQ(b->rope_theta, a->rope_theta);
    EXPECT_EQ(b->rope_scaling.rope_type, a->rope_scaling.rope_type);
    EXPECT_EQ(b->rope_scaling.factor, a->rope_scaling.factor);
    EXPECT_EQ(b->rope_scaling.original_max_position_embeddings,
              a->rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(ParamLayout(*b).total(), ParamLayout(*a).total());
    EXPECT_EQ(Json::parse(text)["architectures"], src["architectures"]);
  }
}

TEST(ArchConfig, UnimplementedMathIsAnErrorNamingTheKey) {
  struct Case {
    Json base;
    std::string key;
    Json value;  // null: erase the key
    std::string expected;
  };
  const Json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}};
  Json no_low = llama31_8b()["rope_scaling"];
  no_low.erase("low_freq_factor");
  Json extra = llama31_8b()["rope_scaling"];
  extra["attention_factor"] = 1.0;
  Json inverted = llama31_8b()["rope_scaling"];
  inverted["high_freq_factor"] = 0.5;
  const Case cases[] = {
      {llama31_8b(), "rope_scaling", yarn,
       "config.json: rope_scaling.rope_type: 'yarn' is not supported"},
      {llama31_8b(),
       "rope_scaling",
       {{"type", "linear"}, {"factor", 2.0}},
       "config.json: rope_scaling.rope_type: 'linear' is not supported"},
      {llama31_8b(), "rope_scaling", Json::object(),
       "config.json: rope_scaling.rope_type: missing"},
      {llama31_8b(), "rope_scaling", no_low, "config.json: rope_scaling.low_freq_factor: missing"},
      {llama31_8b(), "rope_scaling", extra,
       "config.json: rope_scaling.attention_factor: not supported with rope_type 'llama3'"},
      {llama31_8b(), "rope_scaling", inverted,
       "config.json: rope_scaling.high_freq_factor: must be > low_freq_factor"},
      {qwen3_0_6b(),
       "rope_scaling",
       {{"rope_type", "default"}, {"factor", 2.0}},
       "config.json: rope_scaling.factor: not supported with rope_type 'default'"},
      {qwen3_0_6b(), "rope_parameters", yarn, "config.json: rope_parameters.rope_type: 'yarn'"},
      {llama31_8b(), "mlp_bias", true, "config.json: mlp_bias: only false is supported"},
      {qwen3_0_6b(), "use_sliding_window", true,
       "config.json: use_sliding_window: only false is supported"},
      {qwen3_0_6b(), "attention_dropout", 0.1, "config.json: attention_dropout: only 0"},
      {qwen3_0_6b(),
       "layer_types",
       {"full_attention", "sliding_attention"},
       "config.json: layer_types[1]: only \"full_attention\""},
      {qwen3_0_6b(), "partial_rotary_factor", 0.5, "config.json: partial_rotary_factor"},
      {qwen3_0_6b(), "hidden_act", "gelu", "config.json: hidden_act"},
      {qwen3_0_6b(), "model_type", "mixtral", "config.json: model_type: unsupported 'mixtral'"},
      // qwen3_moe is supported (moe_test); without its expert keys it names the first missing one.
      {qwen3_0_6b(), "model_type", "qwen3_moe", "config.json: num_experts: missing"},
      {qwen3_0_6b(), "head_dim", 127, "config.json: head_dim: must be even"},
  };
  for (const Case& c : cases) {
    Json j = c.base;
    j[c.key] = c.value;
    auto parsed = parse_model_config(j.dump());
    ASSERT_FALSE(parsed.ok()) << c.key << " = " << c.value.dump();
    EXPECT_NE(parsed.status().message().find(c.expected), std::string::npos)
        << parsed.status() << "\nexpected: " << c.expected;
  }
  // Validation of a config built in code applies the same rules.
  ModelConfig c = testing::with_llama3_rope(testing::make_config(8, 8, 8, 1, 1, 1, true));
  c.rope_scaling.rope_type = "dynamic";
  EXPECT_FALSE(validate_model_config(c).ok());
}

// Llama 3.1's real parameters (theta 5e5, head_dim 128, factor 8, low 1, high 4, original 8192):
// HF's piecewise map leaves the short wavelengths, divides the long ones by 8 and blends between.
TEST(Rope, Llama3FrequenciesFollowThePiecewiseMap) {
  auto cfg = parse_model_config(llama31_8b().dump());
  ASSERT_TRUE(cfg.ok());
  const std::vector<float> plain = ops::rope_inv_freq(500000.0, 128, RopeScaling{});
  const std::vector<float> scaled = ops::rope_inv_freq(500000.0, 128, cfg->rope_scaling);
  ASSERT_EQ(scaled.size(), 64u);
  int high = 0, medium = 0, low = 0;
  double prev_ratio = 1.0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    const double ratio = static_cast<double>(scaled[i]) / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++high;
    } else if (wavelen > 8192.0) {
      EXPECT_NEAR(ratio, 1.0 / 8, 1e-7) << i;
      ++low;
    } else {
      // s = (8192 / w - 1) / 3 falls from 1 to 0: the ratio (1 - s) / 8 + s falls from 1 to 1/8.
      const double s = (8192.0 / wavelen - 1.0) / 3.0;
      EXPECT_NEAR(ratio, (1 - s) / 8 + s, 1e-6) << i;
      EXPECT_LT(ratio, 1.0);
      EXPECT_GT(ratio, 1.0 / 8);
      ++medium;
    }
    EXPECT_LE(ratio, prev_ratio + 1e-12) << "scaling must not increase with wavelength, i=" << i;
    prev_ratio = ratio;
  }
  EXPECT_EQ(high + medium + low, 64);
  EXPECT_GT(high, 0);
  EXPECT_GT(medium, 0);
  EXPECT_GT(low, 0);
  std::printf("[rope] llama3.1 8B frequencies: %d kept, %d smoothed, %d divided by 8\n", high,
              medium, low);
}

// The two architectures at FP8-block-friendly sizes (160 / 288: full and partial 128 blocks).
ModelConfig arch_config(int which) {
  return which == 0 ? testing::make_qwen3_config(96, 160, 288, 2, 4, 2, 48, false)
                    : testing::with_llama3_rope(testing::make_config(96, 160, 288, 2, 4, 2, true),
                                                8.0, 1.0, 8.0, 64);
}

std::shared_ptr<Model> arch_model(int which, const PrecisionPolicy& policy) {
  auto m = Model::Init(arch_config(which), policy, 5);
  EXPECT_TRUE(m.ok()) << m.status();
  testing::randomize(**m, 17 + which, 0.1);
  return std::shared_ptr<Model>(std::move(*m));
}

struct PrecisionCase {
  int arch;  // 0: qwen3, 1: llama3.1 rope
  Precision linear;
};

std::string case_name(const PrecisionCase& c) {
  return std::string(c.arch == 0 ? "qwen3" : "llama31") + "_" +
         std::string(precision_name(c.linear));
}

class ArchPrecisionTest : public ::testing::TestWithParam<PrecisionCase> {};

// Generation (KV-cache prefill + decode) reports the logprobs the training forward computes.
TEST_P(ArchPrecisionTest, GenerationLogprobsEqualTrainingLogprobs) {
  const PrecisionCase pc = GetParam();
  auto model = arch_model(pc.arch, {.linear = pc.linear, .kv_cache = KvCacheDtype::kBF16});
  Rng rng(3);
  const std::vector<std::vector<int32_t>> prompts = {testing::random_tokens(rng, 5, 96),
                                                     testing::random_tokens(rng, 11, 96),
                                                     testing::random_tokens(rng, 1, 96)};
  SamplingParams sp{.temperature = 0.9f, .max_new_tokens = 10, .seed = 8};
  auto results = generate(model, prompts, sp);
  ASSERT_TRUE(results.ok()) << results.status();
  TokenBatch batch;
  for (const auto& r : *results) {
    batch.push_back(r.prompt);
    batch.back().insert(batch.back().end(), r.tokens.begin(), r.tokens.end());
  }
  auto lp = engine::cpu_logprobs(*model, batch, {.temperature = sp.temperature});
  ASSERT_TRUE(lp.ok()) << lp.status();
  double max_abs = 0, sum = 0;
  int64_t n = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const size_t p = (*results)[s].prompt.size();
    for (size_t j = 0; j < (*results)[s].tokens.size(); ++j) {
      const double d =
          std::fabs(static_cast<double>((*lp)[s][p - 1 + j]) - (*results)[s].full_logprobs[j]);
      max_abs = std::max(max_abs, d);
      sum += d;
      ++n;
    }
  }
  ASSERT_EQ(n, 30);
  std::printf("[arch consistency] %s: max|d| %.3g mean|d| %.3g\n", case_name(pc).c_str(), max_abs,
              sum / n);
  if (pc.linear == Precision::kFP8) {
    EXPECT_LE(sum / n, testing::kConsistencyMeanAbsTol);
  } else {
    EXPECT_LE(max_abs, testing::kConsistencyMaxAbsTol);
  }
}

// The backward in bf16 / fp8 computes the fp32 gradient up to the format's rounding: per parameter
// tensor (q_norm / k_norm included), calc_diff against the fp32 model's gradient on the same
// master weights. In fp32 the two models are the same object in effect, so the bar is 0.
TEST_P(ArchPrecisionTest, BackwardMatchesTheFp32Backward) {
  const PrecisionCase pc = GetParam();
  auto model = arch_model(pc.arch, {.linear = pc.linear});
  auto ref = arch_model(pc.arch, {});
  Rng rng(12);
  const TokenBatch batch = {testing::random_tokens(rng, 13, 96),
                            testing::random_tokens(rng, 7, 96)};
  TokenValues dlogp;
  for (const auto& s : batch) {
    dlogp.emplace_back(s.size() - 1);
    for (auto& v : dlogp.back()) v = static_cast<float>(rng.normal());
  }
  auto grads_of = [&](const Model& m) {
    engine::CpuTrainStep ctx;
    EXPECT_TRUE(ctx.forward(m, batch, {.temperature = 1.0f}).ok());
    std::vector<float> g(m.num_params(), 0.0f);
    EXPECT_TRUE(ctx.backward(m, dlogp, g.data()).ok());
    return g;
  };
  const std::vector<float> g = grads_of(*model), g_ref = grads_of(*ref);
  const double bar = pc.linear == Precision::kF32    ? 0.0
                     : pc.linear == Precision::kBF16 ? testing::kBf16GradMaxCalcDiff
                                                     : testing::kFp8GradMaxCalcDiff;
  double worst = 0;
  std::string worst_name;
  int norms = 0;
  for (const ParamInfo& p : model->layout().params()) {
    const std::vector<float> a(g.begin() + p.offset, g.begin() + p.offset + p.numel);
    const std::vector<float> b(g_ref.begin() + p.offset, g_ref.begin() + p.offset + p.numel);
    ASSERT_GT(testing::max_abs(b.data(), p.numel), 0.0) << p.name << ": fp32 gradient is zero";
    const double d = kernels::calc_diff(a, b);
    EXPECT_LE(d, bar) << p.name;
    if (d > worst) {
      worst = d;
      worst_name = p.name;
    }
    norms += p.name.find("_norm.weight") != std::string::npos &&
             p.name.find("self_attn") != std::string::npos;
  }
  EXPECT_EQ(norms, pc.arch == 0 ? 4 : 0);  // q_norm and k_norm of 2 layers
  std::printf("[arch backward] %s: worst calc_diff vs fp32 %.2e (%s), bar %.0e\n",
              case_name(pc).c_str(), worst, worst_name.c_str(), bar);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, ArchPrecisionTest,
    ::testing::Values(PrecisionCase{0, Precision::kF32}, PrecisionCase{0, Precision::kBF16},
                      PrecisionCase{0, Precision::kFP8}, PrecisionCase{1, Precision::kF32},
                      PrecisionCase{1, Precision::kBF16}, PrecisionCase{1, Precision::kFP8}),
    [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace fp8rl::model
