// Generation pinned to stored bytes: sampled tokens, both logprobs (as float bits) and the
// mixture-of-experts routing record of model::generate on dense and MoE models in several
// precisions, KV dtypes and seeds, against tests/unit/model/testdata/generation_golden.jsonl.
// The file was written by model::Generator over Model::forward_cached (the CPU generation path
// until the decoder engine's CPU backend replaced it), so the test shows the engine path gives
// the same bytes. FP8RL_WRITE_GENERATION_GOLDEN=1 rewrites the file from the current code.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/step_generator.h"
#include "model/weight_view.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

struct Case {
  std::string name;
  ModelConfig config;
  PrecisionPolicy policy;
  // How the generating model is made: the model itself, FromWeightSet of its FP8 export (what a
  // worker loads), or an inference-only model with the export installed (what a worker serves).
  enum class Served { kSelf, kFromWeightSet, kInstalled } served;
};

std::vector<Case> cases() {
  const ModelConfig llama = testing::make_config(96, 128, 256, 2, 4, 2, false);
  const ModelConfig qwen3 = testing::make_qwen3_config(96, 128, 256, 2, 4, 2, 32, true);
  const ModelConfig qwen3_moe =
      testing::make_qwen3_moe_config(96, 160, 288, 2, 4, 2, 48, false, 6, 2, 144, true);
  ModelConfig qwen2_moe =
      testing::make_qwen2_moe_config(96, 128, 256, 2, 4, 2, false, 5, 2, 128, 128);
  const auto policy = [](Precision linear, KvCacheDtype kv) {
    return PrecisionPolicy{.linear = linear, .kv_cache = kv};
  };
  using S = Case::Served;
  return {
      {"llama_fp8_kvf32", llama, policy(Precision::kFP8, KvCacheDtype::kF32), S::kSelf},
      {"llama_fp8_kvfp8", llama, policy(Precision::kFP8, KvCacheDtype::kFP8), S::kSelf},
      {"llama_bf16_kvf32", llama, policy(Precision::kBF16, KvCacheDtype::kF32), S::kSelf},
      {"llama_bf16_kvfp8", llama, policy(Precision::kBF16, KvCacheDtype::kFP8), S::kSelf},
      {"llama_f32_kvbf16", llama, policy(Precision::kF32, KvCacheDtype::kBF16), S::kSelf},
      {"qwen3_fp8_kvbf16_weight_set", qwen3, policy(Precision::kFP8, KvCacheDtype::kBF16),
       S::kFromWeightSet},
      {"qwen3_fp8_kvfp8_installed", qwen3, policy(Precision::kFP8, KvCacheDtype::kFP8),
       S::kInstalled},
      {"qwen3_moe_fp8_kvbf16", qwen3_moe, policy(Precision::kFP8, KvCacheDtype::kBF16), S::kSelf},
      {"qwen3_moe_bf16_kvfp8_installed", qwen3_moe, policy(Precision::kBF16, KvCacheDtype::kFP8),
       S::kInstalled},
      {"qwen2_moe_fp8_kvf32", qwen2_moe, policy(Precision::kFP8, KvCacheDtype::kF32), S::kSelf},
  };
}

std::shared_ptr<const Model> make_model(const Case& c, uint64_t seed) {
  auto made = Model::Init(c.config, c.policy, seed);
  EXPECT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Model> m = *std::move(made);
  testing::randomize(*m, seed + 100, 0.1);
  if (c.policy.kv_cache == KvCacheDtype::kFP8) {
    KvScales s = m->kv_scales();
    for (size_t l = 0; l < s.k.size(); ++l) {
      s.k[l] = 0.01f * static_cast<float>(l + 2);
      s.v[l] = 0.008f * static_cast<float>(l + 1);
    }
    EXPECT_TRUE(m->set_kv_scales(s).ok());
  }
  if (c.served == Case::Served::kSelf) return std::shared_ptr<const Model>(std::move(m));
  auto set = m->export_weights(WeightFormat::kFP8, 1);
  EXPECT_TRUE(set.ok()) << set.status();
  if (c.served == Case::Served::kFromWeightSet) {
    auto served = Model::FromWeightSet(*set, c.policy);
    EXPECT_TRUE(served.ok()) << served.status();
    return std::shared_ptr<const Model>(*std::move(served));
  }
  auto view = view_of(*set);
  EXPECT_TRUE(view.ok()) << view.status();
  auto inference = Model::ForInference(c.config, c.policy);
  EXPECT_TRUE(inference.ok()) << inference.status();
  EXPECT_TRUE((*inference)->install(*view).ok());
  return std::shared_ptr<const Model>(*std::move(inference));
}

std::vector<std::string> bits_of(const std::vector<float>& v) {
  std::vector<std::string> out;
  for (float f : v) out.push_back(absl::StrCat(absl::Hex(std::bit_cast<uint32_t>(f))));
  return out;
}

std::string reason_name(FinishReason r) {
  return r == FinishReason::kStop ? "stop" : r == FinishReason::kLength ? "length" : "cancelled";
}

// Every case with two model seeds and three sampling settings (plain, top-k/top-p with stop
// tokens, greedy), over prompts of 1..19 tokens: one line per sample.
std::vector<nlohmann::json> run_all() {
  std::vector<nlohmann::json> lines;
  for (const Case& c : cases()) {
    for (uint64_t seed : {3, 4}) {
      auto model = make_model(c, seed);
      Rng rng(seed * 7 + 1);
      std::vector<std::vector<int32_t>> prompts;
      for (int64_t n : {5, 1, 19, 8}) prompts.push_back(testing::random_tokens(rng, n, 96));
      std::vector<SamplingParams> settings = {
          {.temperature = 1.0f, .max_new_tokens = 9, .seed = seed},
          {.temperature = 0.8f,
           .top_p = 0.9f,
           .top_k = 20,
           .max_new_tokens = 12,
           .stop_tokens = {3, 17, 40, 41, 60, 77},
           .seed = seed + 10},
          {.temperature = 0.0f, .max_new_tokens = 6, .seed = seed}};
      for (size_t k = 0; k < settings.size(); ++k) {
        auto results = generate(model, prompts, settings[k]);
        EXPECT_TRUE(results.ok()) << c.name << ": " << results.status();
        if (!results.ok()) continue;
        for (size_t i = 0; i < results->size(); ++i) {
          const GenerationResult& r = (*results)[i];
          lines.push_back({{"case", c.name},
                           {"seed", seed},
                           {"setting", k},
                           {"sample", i},
                           {"tokens", r.tokens},
                           {"logprobs", bits_of(r.logprobs)},
                           {"full_logprobs", bits_of(r.full_logprobs)},
                           {"routing", r.routing},
                           {"reason", reason_name(r.reason)}});
        }
      }
    }
  }
  return lines;
}

std::string golden_path() {
  return testing::source_dir() + "/tests/unit/model/testdata/generation_golden.jsonl";
}

TEST(GenerationGolden, TokensLogprobsAndRoutingEqualTheStoredBytes) {
  const std::vector<nlohmann::json> got = run_all();
  if (std::getenv("FP8RL_WRITE_GENERATION_GOLDEN") != nullptr) {
    std::ofstream out(golden_path());
    for (const auto& l : got) out << l.dump() << "\n";
    ASSERT_TRUE(out.good()) << golden_path();
    GTEST_SKIP() << "wrote " << got.size() << " lines to " << golden_path();
  }
  std::ifstream in(golden_path());
  ASSERT_TRUE(in.good()) << "missing " << golden_path();
  std::vector<nlohmann::json> want;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) want.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(got.size(), want.size());
  int64_t routed = 0, stopped = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].dump());
    EXPECT_EQ(got[i], want[i]) << "got " << got[i].dump();
    routed += want[i]["routing"].empty() ? 0 : 1;
    stopped += want[i]["reason"] == "stop" ? 1 : 0;
  }
  // The file exercises what it claims to: MoE samples carry routing, some samples stop early.
  EXPECT_GT(routed, 0);
  EXPECT_GT(stopped, 0);
}

}  // namespace
}  // namespace fp8rl::model
