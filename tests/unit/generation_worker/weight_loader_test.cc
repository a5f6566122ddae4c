// The precision policy a worker derives from a weight version (payload format, the optional
// "fp8rl_precision" config entry, flag overrides), and the errors for inconsistent versions.
#include "services/generation_worker/weight_loader.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/unit/generation_worker/test_util.h"

namespace fp8rl::generation {
namespace {

using testing::export_set;
using testing::random_model;

// Adds (or replaces) the fp8rl_precision entry of the set's config.json.
void set_precision_entry(model::WeightSet& set, const nlohmann::json& entry) {
  nlohmann::json config = nlohmann::json::parse(set.config_json);
  config[kPrecisionConfigKey] = entry;
  set.config_json = config.dump();
}

TEST(WeightLoaderTest, Fp8PayloadDefaultsToFp8LinearsAndBf16Cache) {
  auto m = random_model(1);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 3);
  EXPECT_EQ(weight_set_format(set), v1::WEIGHT_FORMAT_FP8);
  auto policy = resolve_precision_policy(set, {});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->linear, model::Precision::kFP8);
  EXPECT_EQ(policy->kv_cache, model::KvCacheDtype::kBF16);
  EXPECT_EQ(policy->bf16_first_layers, 0);
  EXPECT_EQ(policy->bf16_last_layers, 0);
  EXPECT_FALSE(policy->pow2_scales);
}

TEST(WeightLoaderTest, Bf16PayloadDefaultsToBf16) {
  auto m = random_model(2);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kBF16, 1);
  EXPECT_EQ(weight_set_format(set), v1::WEIGHT_FORMAT_BF16);
  auto policy = resolve_precision_policy(set, {});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->linear, model::Precision::kBF16);
  EXPECT_EQ(policy->kv_cache, model::KvCacheDtype::kBF16);
}

TEST(WeightLoaderTest, Bf16EdgeLayersAreInferredFromAnFp8Payload) {
  model::PrecisionPolicy trainer =
      testing::policy_of(model::Precision::kFP8, model::KvCacheDtype::kBF16);
  trainer.bf16_first_layers = 1;
  trainer.bf16_last_layers = 1;
  auto m = random_model(3, trainer);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  ASSERT_EQ(set.find("model.layers.0.self_attn.q_proj.weight")->dtype, DType::kBF16);
  ASSERT_EQ(set.find("model.layers.1.self_attn.q_proj.weight")->dtype, DType::kF8E4M3);
  auto policy = resolve_precision_policy(set, {});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->bf16_first_layers, 1);
  EXPECT_EQ(policy->bf16_last_layers, 1);

  model::WeightSet wrong = set;
  set_precision_entry(wrong, {{"bf16_first_layers", 2}});
  auto bad = resolve_precision_policy(wrong, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("fp8rl_precision.bf16_first_layers"), std::string::npos)
      << bad.status();
}

TEST(WeightLoaderTest, ExplicitEntryAndOverrides) {
  auto m = random_model(4);
  model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  set_precision_entry(set, {{"kv_cache", "fp8"}, {"pow2_scales", true}});
  auto policy = resolve_precision_policy(set, {});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->kv_cache, model::KvCacheDtype::kFP8);
  EXPECT_TRUE(policy->pow2_scales);

  PrecisionOverrides overrides;
  overrides.linear = model::Precision::kBF16;
  overrides.kv_cache = model::KvCacheDtype::kBF16;
  policy = resolve_precision_policy(set, overrides);
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->linear, model::Precision::kBF16);
  EXPECT_EQ(policy->kv_cache, model::KvCacheDtype::kBF16);
}

TEST(WeightLoaderTest, MalformedEntriesNameTheField) {
  auto m = random_model(5);
  const model::WeightSet base = export_set(*m, model::WeightFormat::kFP8, 1);
  const std::pair<nlohmann::json, std::string> cases[] = {
      {{{"linear", "fp4"}}, "fp8rl_precision.linear"},
      {{{"kv_cache", 8}}, "fp8rl_precision.kv_cache"},
      {{{"pow2_scales", "yes"}}, "fp8rl_precision.pow2_scales"},
      {{{"bf16_last_layers", -1}}, "fp8rl_precision.bf16_last_layers"},
      {{{"bogus", 1}}, "fp8rl_precision.bogus"},
  };
  for (const auto& [entry, field] : cases) {
    model::WeightSet set = base;
    set_precision_entry(set, entry);
    auto policy = resolve_precision_policy(set, {});
    ASSERT_FALSE(policy.ok()) << entry.dump();
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(policy.status().message().find(field), std::string::npos) << policy.status();
  }
}

TEST(WeightLoaderTest, Fp8KvCacheNeedsScales) {
  auto m = random_model(6);
  model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  set_precision_entry(set, {{"kv_cache", "fp8"}});
  std::erase_if(set.tensors, [](const model::NamedTensor& t) {
    return t.name == "model.layers.1.self_attn.v_scale";
  });
  auto policy = resolve_precision_policy(set, {});
  ASSERT_FALSE(policy.ok());
  EXPECT_NE(policy.status().message().find("model.layers.1.self_attn.v_scale"), std::string::npos)
      << policy.status();
}

TEST(WeightLoaderTest, LoadBuildsTheModelAndRejectsVersionZero) {
  auto m = random_model(7);
  auto loaded = load_weights(export_set(*m, model::WeightFormat::kFP8, 4), {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->version, 4);
  EXPECT_EQ(loaded->format, v1::WEIGHT_FORMAT_FP8);
  EXPECT_EQ(loaded->model->config().hidden_size, testing::tiny_config().hidden_size);
  auto zero = load_weights(export_set(*m, model::WeightFormat::kFP8, 0), {});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("version"), std::string::npos);
}

}  // namespace
}  // namespace fp8rl::generation
