// Mixture-of-experts decoders (qwen3_moe, qwen2_moe): the fp32 engine against the float64
// PyTorch oracle tests/reference/moe_ref.py (logits, logprobs, the experts chosen, the
// load-balancing loss and every gradient, with and without routing replay), the bf16/fp8 backward
// against the fp32 one, generation against training (logprobs and the recorded routing),
// checkpoint and weight-set round trips with FP8 experts, and config errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "engine/cpu/train_ops.h"
#include "kernels/calc_diff.h"
#include "model/model.h"
#include "model/step_generator.h"
#include "model/weight_view.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

using testing::kGradRelTol;
using testing::kLogitRelTol;

ModelConfig sparse_step_config() {
  // Layer 0 dense (mlp_only_layers), layer 1 sparse, layer 2 dense (step 2), layer 3 sparse.
  ModelConfig c = testing::make_qwen3_moe_config(53, 48, 80, 4, 4, 2, 16, true, 6, 3, 40, false);
  c.moe.decoder_sparse_step = 2;
  c.moe.mlp_only_layers = {0};
  return c;
}

struct GoldenCase {
  std::string name;
  ModelConfig config;
  float temperature;
  double aux_coef;
  bool replay;
};

const GoldenCase kCases[] = {
    {"qwen3_moe_norm_topk",
     testing::make_qwen3_moe_config(61, 64, 96, 2, 4, 2, 16, false, 8, 2, 48, true), 1.0f, 0.0,
     false},
    {"qwen3_moe_sparse_step_mlp_only_aux", sparse_step_config(), 0.8f, 0.05, false},
    {"qwen2_moe_shared_expert_bias",
     testing::make_qwen2_moe_config(47, 64, 96, 2, 4, 2, false, 5, 2, 32, 56), 1.2f, 0.02, false},
    {"qwen3_moe_replay_aux",
     testing::make_qwen3_moe_config(61, 64, 96, 2, 4, 2, 16, false, 8, 2, 48, true), 1.0f, 0.03,
     true},
};

class MoeGoldenTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    torch_missing_ = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0;
  }
  static inline bool torch_missing_ = false;
};

TEST_P(MoeGoldenTest, LogitsRoutingAuxLossAndEveryGradientMatchPyTorch) {
  if (torch_missing_) {
    GTEST_SKIP() << "SKIPPED: /usr/bin/python3 has no torch (apt python3-torch), the PyTorch "
                    "oracle cannot run";
  }
  const GoldenCase& gc = kCases[GetParam()];
  testing::TempDir dir;
  auto made = Model::Init(gc.config, {}, 1);
  ASSERT_TRUE(made.ok()) << made.status();
  Model& m = **made;
  testing::randomize(m, 7 + GetParam());
  const std::string ckpt = dir / gc.name;
  ASSERT_TRUE(m.save(ckpt).ok());
  Rng rng(11 + GetParam());
  const int64_t vocab = gc.config.vocab_size;
  TokenBatch batch = {testing::random_tokens(rng, 9, vocab), testing::random_tokens(rng, 14, vocab),
                      testing::random_tokens(rng, 1, vocab),
                      testing::random_tokens(rng, 30, vocab)};
  TokenValues dlogp;
  for (const auto& s : batch) {
    dlogp.emplace_back(s.size() - 1);
    for (auto& v : dlogp.back()) v = static_cast<float>(rng.normal());
  }
  // Replay: random distinct experts for the first tokens of each sequence (most differ from
  // what the router would pick, so replay visibly changes the result).
  TokenRouting replay(batch.size());
  const int64_t k = gc.config.moe.num_experts_per_tok, n_exp = gc.config.moe.num_experts;
  if (gc.replay) {
    for (size_t s = 0; s < batch.size(); ++s) {
      const int64_t rows = static_cast<int64_t>(batch[s].size()) * 2 / 3;
      for (int64_t i = 0; i < rows * gc.config.num_sparse_layers(); ++i) {
        std::vector<int32_t> pick;
        while (static_cast<int64_t>(pick.size()) < k) {
          const int32_t e = static_cast<int32_t>(rng.next() % n_exp);
          if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
        }
        replay[s].insert(replay[s].end(), pick.begin(), pick.end());
      }
    }
  }
  nlohmann::json req = {{"sequences", batch},
                        {"dlogp", dlogp},
                        {"temperature", gc.temperature},
                        {"aux_coef", gc.aux_coef}};
  if (gc.replay) req["replay"] = replay;
  std::ofstream(ckpt + ".json") << req.dump();
  const std::string cmd =
      absl::StrCat("/usr/bin/python3 ", testing::source_dir(), "/tests/reference/moe_ref.py ", ckpt,
                   " ", ckpt, ".json ", ckpt, ".out.safetensors");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto golden = SafetensorsFile::Open(ckpt + ".out.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();

  engine::CpuTrainStep ctx;
  engine::TrainStepOptions opts{.temperature = gc.temperature,
                                .replay = gc.replay ? &replay : nullptr,
                                .router_aux_loss_coef = gc.aux_coef};
  auto lp = ctx.forward(m, batch, opts);
  ASSERT_TRUE(lp.ok()) << lp.status();
  double worst_logit = 0;
  int64_t routed = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    auto ref_lp = golden->read_f32(absl::StrCat("logprobs.", s));
    ASSERT_TRUE(ref_lp.ok());
    ASSERT_EQ(ref_lp->size(), (*lp)[s].size());
    for (size_t i = 0; i < ref_lp->size(); ++i) EXPECT_NEAR((*lp)[s][i], (*ref_lp)[i], 1e-4);
    if (!gc.replay) {
      auto ref_logits = golden->read_f32(absl::StrCat("logits.", s));
      ASSERT_TRUE(ref_logits.ok());
      auto logits = engine::cpu_logits(m, batch[s]);
      ASSERT_TRUE(logits.ok());
      const double scale = testing::max_abs(ref_logits->data(), ref_logits->size());
      ASSERT_GT(scale, 0.1);
      const double err =
          testing::max_abs_diff(logits->data(), ref_logits->data(), logits->size()) / scale;
      EXPECT_LE(err, kLogitRelTol) << "sequence " << s;
      worst_logit = std::max(worst_logit, err);
    }
    // The experts used, in descending probability (replayed rows: the replayed order).
    auto ref_routing = golden->read_f32(absl::StrCat("routing.", s));
    ASSERT_TRUE(ref_routing.ok());
    ASSERT_EQ(ref_routing->size(), ctx.routing.used[s].size());
    for (size_t i = 0; i < ref_routing->size(); ++i) {
      ASSERT_EQ(static_cast<int32_t>((*ref_routing)[i]), ctx.routing.used[s][i])
          << "sequence " << s << " entry " << i;
      ++routed;
    }
  }
  ASSERT_GT(routed, 0);
  auto ref_aux = golden->read_f32("aux_loss");
  ASSERT_TRUE(ref_aux.ok());
  EXPECT_NEAR(ctx.routing.aux_loss, (*ref_aux)[0], 1e-5 * (*ref_aux)[0]);
  EXPECT_GT(ctx.routing.aux_loss,
            0.5);  // >= 1 * k-ish for any routing; 0 would mean it was not computed

  std::vector<float> grads(m.num_params(), 0.0f);
  ASSERT_TRUE(ctx.backward(m, dlogp, grads.data()).ok());
  double worst = 0;
  std::string worst_name;
  int experts_checked = 0;
  for (const ParamInfo& info : m.layout().params()) {
    auto ref = golden->read_f32("grad." + info.name);
    ASSERT_TRUE(ref.ok()) << info.name;
    ASSERT_EQ(static_cast<int64_t>(ref->size()), info.numel);
    const double scale = testing::max_abs(ref->data(), info.numel);
    if (scale == 0.0) {
      // An expert no token of the batch was routed to: its gradient must be exactly zero too.
      EXPECT_NE(info.name.find(".experts."), std::string::npos) << info.name;
      EXPECT_EQ(testing::max_abs(grads.data() + info.offset, info.numel), 0.0) << info.name;
      continue;
    }
    experts_checked += info.name.find(".experts.") != std::string::npos;
    const double err =
        testing::max_abs_diff(grads.data() + info.offset, ref->data(), info.numel) / scale;
    EXPECT_LE(err, kGradRelTol) << info.name;
    if (err > worst) {
      worst = err;
      worst_name = info.name;
    }
  }
  EXPECT_GT(experts_checked, 0);
  std::printf(
      "[moe golden] %s: logits worst rel err %.2e (bar %.0e); %zu gradients, worst rel err %.2e "
      "(%s, bar %.0e); aux loss %.6f\n",
      gc.name.c_str(), worst_logit, kLogitRelTol, m.layout().params().size(), worst,
      worst_name.c_str(), kGradRelTol, ctx.routing.aux_loss);
}

INSTANTIATE_TEST_SUITE_P(Configs, MoeGoldenTest,
                         ::testing::Range(0, static_cast<int>(std::size(kCases))),
                         [](const auto& info) { return kCases[info.param].name; });

// ---- precision: bf16 / fp8 experts against fp32 ----

// Hidden 160, expert width 144: full and partial 128-blocks in every expert GEMM.
ModelConfig precision_config() {
  return testing::make_qwen3_moe_config(96, 160, 288, 2, 4, 2, 48, false, 6, 2, 144, true);
}

std::shared_ptr<Model> precision_model(const PrecisionPolicy& policy) {
  auto m = Model::Init(precision_config(), policy, 5);
  EXPECT_TRUE(m.ok()) << m.status();
  testing::randomize(**m, 19, 0.1);
  return std::shared_ptr<Model>(std::move(*m));
}

class MoePrecisionTest : public ::testing::TestWithParam<Precision> {};

// The bf16 / fp8 backward computes the fp32 gradient up to the format's rounding (calc_diff per
// tensor). Routing is replayed from the fp32 forward so the three models run the same experts:
// a flipped choice would be a different function, not a rounding.
TEST_P(MoePrecisionTest, BackwardMatchesTheFp32Backward) {
  const Precision p = GetParam();
  auto model = precision_model({.linear = p});
  auto ref = precision_model({});
  Rng rng(12);
  const TokenBatch batch = {testing::random_tokens(rng, 13, 96),
                            testing::random_tokens(rng, 7, 96)};
  TokenValues dlogp;
  for (const auto& s : batch) {
    dlogp.emplace_back(s.size() - 1);
    for (auto& v : dlogp.back()) v = static_cast<float>(rng.normal());
  }
  engine::CpuTrainStep ref_ctx;
  ASSERT_TRUE(ref_ctx.forward(*ref, batch, {}).ok());
  std::vector<float> g_ref(ref->num_params(), 0.0f);
  ASSERT_TRUE(ref_ctx.backward(*ref, dlogp, g_ref.data()).ok());
  engine::CpuTrainStep ctx;
  ASSERT_TRUE(ctx.forward(*model, batch, {.replay = &ref_ctx.routing.used}).ok());
  EXPECT_EQ(ctx.routing.used, ref_ctx.routing.used);
  std::vector<float> g(model->num_params(), 0.0f);
  ASSERT_TRUE(ctx.backward(*model, dlogp, g.data()).ok());
  const double bar = p == Precision::kF32    ? 0.0
                     : p == Precision::kBF16 ? testing::kMoeBf16GradMaxCalcDiff
                                             : testing::kFp8GradMaxCalcDiff;
  double worst = 0;
  std::string worst_name;
  for (const ParamInfo& info : model->layout().params()) {
    const std::vector<float> a(g.begin() + info.offset, g.begin() + info.offset + info.numel);
    const std::vector<float> b(g_ref.begin() + info.offset,
                               g_ref.begin() + info.offset + info.numel);
    if (testing::max_abs(b.data(), info.numel) == 0.0) continue;  // an expert nobody used
    const double d = kernels::calc_diff(a, b);
    EXPECT_LE(d, bar) << info.name;
    if (d > worst) {
      worst = d;
      worst_name = info.name;
    }
  }
  std::printf("[moe backward] %s: worst calc_diff vs fp32 %.2e (%s), bar %.0e\n",
              std::string(precision_name(p)).c_str(), worst, worst_name.c_str(), bar);
}

// Generation reports the logprobs the training forward computes, and records the routing the
// training forward takes; with that routing replayed the training forward uses it exactly.
TEST_P(MoePrecisionTest, GenerationMatchesTrainingAndRecordsItsRouting) {
  const Precision p = GetParam();
  auto model = precision_model({.linear = p, .kv_cache = KvCacheDtype::kBF16});
  Rng rng(3);
  const std::vector<std::vector<int32_t>> prompts = {testing::random_tokens(rng, 5, 96),
                                                     testing::random_tokens(rng, 11, 96),
                                                     testing::random_tokens(rng, 1, 96)};
  SamplingParams sp{.temperature = 0.9f, .max_new_tokens = 10, .seed = 8};
  auto results = generate(model, prompts, sp);
  ASSERT_TRUE(results.ok()) << results.status();
  TokenBatch batch;
  TokenRouting recorded;
  const int64_t width = model->routing_width();
  ASSERT_EQ(width, 2 * 2);
  for (const auto& r : *results) {
    batch.push_back(r.prompt);
    batch.back().insert(batch.back().end(), r.tokens.begin(), r.tokens.end());
    ASSERT_EQ(static_cast<int64_t>(r.routing.size()),
              static_cast<int64_t>(batch.back().size() - 1) * width);
    recorded.push_back(r.routing);
  }
  const TokenRouting* const replays[] = {nullptr, &recorded};
  for (const TokenRouting* replay : replays) {
    engine::CpuTrainStep ctx;
    auto lp = ctx.forward(*model, batch, {.temperature = sp.temperature, .replay = replay});
    ASSERT_TRUE(lp.ok()) << lp.status();
    double max_abs = 0, sum = 0;
    int64_t n = 0, differ = 0, tokens = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      const size_t pl = (*results)[s].prompt.size();
      for (size_t j = 0; j < (*results)[s].tokens.size(); ++j) {
        const double d =
            std::fabs(static_cast<double>((*lp)[s][pl - 1 + j]) - (*results)[s].full_logprobs[j]);
        max_abs = std::max(max_abs, d);
        sum += d;
        ++n;
      }
      for (size_t t = 0; t * width < recorded[s].size(); ++t, ++tokens) {
        bool same = true;
        for (int64_t i = 0; i < width; ++i) {
          same &= recorded[s][t * width + i] == ctx.routing.used[s][t * width + i];
        }
        differ += same ? 0 : 1;
      }
    }
    ASSERT_EQ(n, 30);
    std::printf(
        "[moe consistency] %s replay %s: max|d| %.3g mean|d| %.3g, tokens routed "
        "differently %lld / %lld\n",
        std::string(precision_name(p)).c_str(), replay ? "on" : "off", max_abs, sum / n,
        static_cast<long long>(differ), static_cast<long long>(tokens));
    // With replay the training forward runs the recorded experts; generation and training share
    // the router math (bf16 weights, double accumulation), so on this model they also agree
    // without it, and the forward reports no token where its router would have chosen otherwise.
    EXPECT_EQ(differ, 0);
    if (replay != nullptr) {
      EXPECT_EQ(ctx.routing.replayed_tokens, tokens);
      EXPECT_EQ(ctx.routing.replay_overrode, 0);
    }
    if (p == Precision::kFP8) {
      EXPECT_LE(sum / n, testing::kConsistencyMeanAbsTol);
    } else {
      EXPECT_LE(max_abs, testing::kConsistencyMaxAbsTol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, MoePrecisionTest,
                         ::testing::Values(Precision::kF32, Precision::kBF16, Precision::kFP8),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

// ---- checkpoints and weight sets ----

TEST(MoeIo, Fp8ExportCarriesExpertCodesAndABf16Router) {
  auto model = precision_model({.linear = Precision::kFP8});
  auto set = model->export_weights(WeightFormat::kFP8, 3);
  ASSERT_TRUE(set.ok()) << set.status();
  const NamedTensor* expert = set->find("model.layers.1.mlp.experts.5.down_proj.weight");
  ASSERT_NE(expert, nullptr);
  EXPECT_EQ(expert->dtype, DType::kF8E4M3);
  EXPECT_EQ(expert->shape, (std::vector<int64_t>{160, 144}));
  const NamedTensor* scales = set->find("model.layers.1.mlp.experts.5.down_proj.weight_scale_inv");
  ASSERT_NE(scales, nullptr);
  EXPECT_EQ(scales->shape, (std::vector<int64_t>{2, 2}));
  const NamedTensor* router = set->find("model.layers.0.mlp.gate.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->dtype, DType::kBF16);
  EXPECT_EQ(router->shape, (std::vector<int64_t>{6, 160}));
  EXPECT_EQ(set->find("model.layers.0.mlp.gate_proj.weight"), nullptr);

  // A full model and an inference-only model built from the version generate the same tokens,
  // logprobs and routing as the exporting model.
  auto view = view_of(*set);
  ASSERT_TRUE(view.ok());
  const PrecisionPolicy policy{.linear = Precision::kFP8, .kv_cache = KvCacheDtype::kBF16};
  auto full = Model::FromWeightView(*view, policy);
  ASSERT_TRUE(full.ok()) << full.status();
  auto inference = Model::ForInference(model->config(), policy);
  ASSERT_TRUE(inference.ok());
  ASSERT_TRUE((*inference)->install(*view).ok());
  Rng rng(4);
  const std::vector<std::vector<int32_t>> prompts = {testing::random_tokens(rng, 6, 96),
                                                     testing::random_tokens(rng, 2, 96)};
  SamplingParams sp{.temperature = 1.0f, .max_new_tokens = 8, .seed = 2};
  auto a = generate(std::shared_ptr<const Model>(std::move(*full)), prompts, sp);
  auto b = generate(std::shared_ptr<const Model>(std::move(*inference)), prompts, sp);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ((*a)[i].tokens, (*b)[i].tokens);
    EXPECT_EQ((*a)[i].logprobs, (*b)[i].logprobs);
    EXPECT_EQ((*a)[i].routing, (*b)[i].routing);
    EXPECT_FALSE((*a)[i].routing.empty());
  }
}

TEST(MoeIo, CheckpointRoundTripKeepsConfigAndWeights) {
  testing::TempDir dir;
  ModelConfig c = testing::make_qwen2_moe_config(47, 64, 96, 3, 4, 2, false, 5, 2, 32, 56);
  c.moe.mlp_only_layers = {1};
  c.moe.norm_topk_prob = true;
  auto m = Model::Init(c, {}, 2);
  ASSERT_TRUE(m.ok());
  testing::randomize(**m, 3);
  ASSERT_TRUE((*m)->save(dir / "ck").ok());
  auto back = Model::Load(dir / "ck", {});
  ASSERT_TRUE(back.ok()) << back.status();
  const ModelConfig& r = (*back)->config();
  EXPECT_EQ(r.model_type, "qwen2_moe");
  EXPECT_EQ(r.moe.num_experts, 5);
  EXPECT_EQ(r.moe.num_experts_per_tok, 2);
  EXPECT_EQ(r.moe.moe_intermediate_size, 32);
  EXPECT_EQ(r.moe.shared_expert_intermediate_size, 56);
  EXPECT_TRUE(r.moe.norm_topk_prob);
  EXPECT_EQ(r.moe.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_EQ(r.num_sparse_layers(), 2);
  ASSERT_EQ((*back)->num_params(), (*m)->num_params());
  for (int64_t i = 0; i < (*m)->num_params(); ++i) {
    ASSERT_EQ((*back)->params()[i], (*m)->params()[i]) << i;
  }
  EXPECT_GE((*m)->layout().find("model.layers.0.mlp.shared_expert_gate.weight"), 0);
  EXPECT_GE((*m)->layout().find("model.layers.1.mlp.gate_proj.weight"), 0);
  EXPECT_LT((*m)->layout().find("model.layers.1.mlp.gate.weight"), 0);
}

// The published Qwen3-30B-A3B config.json (its MoE keys and sizes).
constexpr char kQwen3MoeConfig[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

TEST(MoeConfigTest, Qwen3_30B_A3BConfigParses) {
  auto c = parse_model_config(kQwen3MoeConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->is_moe());
  EXPECT_TRUE(c->qk_norm());
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.num_experts_per_tok, 8);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->num_sparse_layers(), 48);
  EXPECT_DOUBLE_EQ(c->moe.router_aux_loss_coef, 0.001);
  // 48 layers x (router + 128 x 3 experts): the parameter count of the published model.
  ParamLayout layout(*c);
  EXPECT_NEAR(static_cast<double>(layout.total()), 30.53e9, 0.02e9);
  auto again = parse_model_config(model_config_to_json(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->moe.num_experts, 128);
  EXPECT_EQ(again->sparse_index(47), 47);
}

TEST(MoeConfigTest, BadMoeKeysAreErrorsNamingTheKey) {
  auto with = [](const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(kQwen3MoeConfig);
    j[key] = nlohmann::json::parse(value);
    return parse_model_config(j.dump());
  };
  const std::pair<const char*, const char*> bad[] = {
      {"num_experts", "0"},         {"num_experts_per_tok", "129"}, {"moe_intermediate_size", "-1"},
      {"decoder_sparse_step", "0"}, {"mlp_only_layers", "[48]"},    {"norm_topk_prob", "\"yes\""},
      {"num_experts", "null"}};
  for (const auto& [key, value] : bad) {
    auto c = with(key, value);
    ASSERT_FALSE(c.ok()) << key << "=" << value;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(key), std::string::npos) << c.status();
  }
}

TEST(MoeReplay, BadRecordsAreErrorsNamingTheSequenceAndToken) {
  auto model = precision_model({});
  const TokenBatch batch = {{1, 2, 3}, {4, 5}};
  const int64_t w = model->routing_width();
  TokenRouting too_long = {std::vector<int32_t>(4 * w, 0), {}};
  TokenRouting out_of_range = {{}, std::vector<int32_t>(w, 0)};
  out_of_range[1] = {0, 1, 0, 6};
  TokenRouting repeated = {{0, 1, 2, 2}, {}};
  for (const TokenRouting& r : {too_long, out_of_range, repeated}) {
    auto lp = engine::cpu_logprobs(*model, batch, {.replay = &r});
    ASSERT_FALSE(lp.ok());
    EXPECT_EQ(lp.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(lp.status().message().find("routing["), std::string::npos) << lp.status();
  }
}

}  // namespace
}  // namespace fp8rl::model
