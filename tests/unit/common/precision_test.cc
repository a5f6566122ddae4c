// The shared precision type: names, the bf16-layer rule and the one JSON encoding.
#include "common/precision.h"

#include <gtest/gtest.h>

namespace fp8rl {
namespace {

TEST(Precision, NamesRoundTripAndUnknownNamesAreRejected) {
  for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kFP8}) {
    absl::StatusOr<Precision> back = parse_precision(precision_name(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  EXPECT_EQ(*parse_precision("fp8_e4m3"), Precision::kFP8);
  EXPECT_EQ(parse_precision("fp4").status().message(),
            "unknown precision 'fp4' (expected fp32, bf16 or fp8)");
}

TEST(Precision, LayerLinearKeepsTheFirstAndLastLayersInBf16) {
  PrecisionPolicy p;
  p.linear = Precision::kFP8;
  p.bf16_first_layers = 1;
  p.bf16_last_layers = 2;
  const Precision want[] = {Precision::kBF16, Precision::kFP8, Precision::kFP8, Precision::kBF16,
                            Precision::kBF16};
  for (int64_t l = 0; l < 5; ++l) EXPECT_EQ(p.layer_linear(l, 5), want[l]) << l;
  p.linear = Precision::kBF16;
  EXPECT_EQ(p.layer_linear(2, 5), Precision::kBF16);
}

TEST(Precision, ConfigGivesPoliciesThatDifferOnlyInTheLinears) {
  PrecisionConfig c;
  c.training = Precision::kBF16;
  c.generation = Precision::kFP8;
  c.kv_cache = Precision::kFP8;
  c.pow2_scales = true;
  c.bf16_last_layers = 1;
  const PrecisionPolicy t = c.training_policy(), g = c.generation_policy();
  EXPECT_EQ(t.linear, Precision::kBF16);
  EXPECT_EQ(g.linear, Precision::kFP8);
  PrecisionPolicy g_as_t = g;
  g_as_t.linear = Precision::kBF16;
  EXPECT_EQ(g_as_t, t);
  EXPECT_EQ(g.kv_cache, Precision::kFP8);
  EXPECT_TRUE(g.pow2_scales);
  EXPECT_EQ(g.bf16_last_layers, 1);
}

TEST(Precision, JsonRoundTripsAndNamesTheBadField) {
  PrecisionPolicy p;
  p.linear = Precision::kFP8;
  p.kv_cache = Precision::kBF16;
  p.pow2_scales = true;
  p.bf16_first_layers = 2;
  p.bf16_last_layers = 3;
  const nlohmann::json j = nlohmann::json::parse(precision_policy_to_json(p).dump());
  EXPECT_EQ(j.at("linear"), "fp8");
  PrecisionPolicy back;
  ASSERT_TRUE(precision_policy_from_json(j, "x", &back).ok());
  EXPECT_EQ(back, p);

  PrecisionConfig c;
  c.training = Precision::kBF16;
  c.bf16_first_layers = 1;
  PrecisionConfig c_back;
  ASSERT_TRUE(precision_config_from_json(nlohmann::json::parse(precision_config_to_json(c).dump()),
                                         "precision", &c_back)
                  .ok());
  EXPECT_EQ(c_back, c);

  // Absent keys keep their value.
  PrecisionPolicy partial = p;
  ASSERT_TRUE(precision_policy_from_json(nlohmann::json{{"linear", "bf16"}}, "x", &partial).ok());
  EXPECT_EQ(partial.linear, Precision::kBF16);
  EXPECT_EQ(partial.bf16_last_layers, 3);

  struct Bad {
    nlohmann::json json;
    const char* error;
  };
  const Bad cases[] = {
      {{{"linear", "fp4"}}, "cfg.linear: unknown precision 'fp4' (expected fp32, bf16 or fp8)"},
      {{{"kv_cache", 8}}, "cfg.kv_cache: expected a string"},
      {{{"pow2_scales", "yes"}}, "cfg.pow2_scales: expected a boolean"},
      {{{"bf16_first_layers", -1}}, "cfg.bf16_first_layers: expected an integer >= 0"},
      {{{"training", "fp8"}},
       "cfg.training: unknown key (expected linear, kv_cache, pow2_scales, bf16_first_layers, "
       "bf16_last_layers)"},
      {nlohmann::json::array(), "cfg: expected an object"},
  };
  for (const Bad& b : cases) {
    PrecisionPolicy out = p;
    absl::Status s = precision_policy_from_json(b.json, "cfg", &out);
    EXPECT_EQ(s.message(), b.error) << b.json.dump();
    EXPECT_EQ(out, p) << "a failed read leaves the policy unchanged";
  }
}

}  // namespace
}  // namespace fp8rl
