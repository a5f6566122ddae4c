// The algorithm-parameter converters (proto/algorithm_proto.h): every IS rule and its bounds
// survive job config -> proto -> trainer, the optimizer keys keep their values, and bad proto
// values are InvalidArgument naming the field.
#include "proto/algorithm_proto.h"

#include <gtest/gtest.h>

#include <cmath>

#include "rl/job_config.h"

namespace fp8rl {
namespace {

TEST(AlgorithmProto, EveryIsRuleRoundTrips) {
  for (rl::IsRule rule :
       {rl::IsRule::kNone, rl::IsRule::kTis, rl::IsRule::kIcepop, rl::IsRule::kSeqMaskTis}) {
    absl::StatusOr<rl::IsRule> back = is_rule_from_proto(is_rule_to_proto(rule));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, rule);
    EXPECT_NE(is_rule_to_proto(rule), v1::IS_RULE_UNSPECIFIED);
  }
  // The four rules map to four different proto values.
  EXPECT_NE(is_rule_to_proto(rl::IsRule::kIcepop), is_rule_to_proto(rl::IsRule::kSeqMaskTis));
  EXPECT_EQ(*is_rule_from_proto(v1::IS_RULE_UNSPECIFIED), rl::IsRule::kTis);
  absl::StatusOr<rl::IsRule> unknown =
      is_rule_from_proto(static_cast<v1::ImportanceSamplingRule>(9));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("algorithm.is_rule"), std::string::npos);
}

TEST(AlgorithmProto, IsConfigRoundTripsWithItsBounds) {
  const rl::IsConfig configs[] = {
      {rl::IsRule::kNone, 2.0, 0.5, 2.0},
      {rl::IsRule::kTis, 1.7, 0.5, 2.0},
      {rl::IsRule::kIcepop, 2.0, 0.8, 1.3},
      {rl::IsRule::kSeqMaskTis, 2.0, 0.93, 1.07},
  };
  for (const rl::IsConfig& c : configs) {
    v1::AlgorithmParams params;
    is_config_to_proto(c, &params);
    absl::StatusOr<rl::IsConfig> back = is_config_from_proto(params);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->rule, c.rule);
    if (c.rule == rl::IsRule::kTis) {
      EXPECT_EQ(back->cap, c.cap);
    }
    if (c.rule == rl::IsRule::kIcepop || c.rule == rl::IsRule::kSeqMaskTis) {
      EXPECT_EQ(back->lo, c.lo);
      EXPECT_EQ(back->hi, c.hi);
    }
  }
  v1::AlgorithmParams bad;
  bad.set_is_rule(v1::IS_RULE_ICEPOP);
  bad.set_is_lo(-0.5);
  absl::StatusOr<rl::IsConfig> rejected = is_config_from_proto(bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rejected.status().message().find("algorithm.is_lo"), std::string::npos);
}

TEST(AlgorithmProto, JobConfigKeysReachTheProtoFieldsOfTheSameName) {
  absl::StatusOr<rl::JobConfig> config = rl::parse_job_config(R"(
model: {init: {config: configs/models/tiny.json}}
task: {name: addition}
algorithm:
  learning_rate: 3.0e-4
  weight_decay: 0.05
  max_grad_norm: 0.7
  adam_beta1: 0.85
  adam_beta2: 0.995
  adam_epsilon: 3.0e-7
  clip_eps: 0.15
  kl_beta: 0.02
  temperature: 0.9
  minibatches: 2
  epochs: 3
  is: {rule: icepop, lo: 0.6, hi: 1.8}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  const v1::OptimizerParams o = optimizer_to_proto(config->algorithm);
  EXPECT_EQ(o.learning_rate(), 3.0e-4);
  EXPECT_EQ(o.weight_decay(), 0.05);
  EXPECT_EQ(o.max_grad_norm(), 0.7);
  EXPECT_EQ(o.adam_beta1(), 0.85);
  EXPECT_EQ(o.adam_beta2(), 0.995);
  EXPECT_EQ(o.adam_epsilon(), 3.0e-7);
  const v1::AlgorithmParams a = algorithm_to_proto(config->algorithm, 5);
  EXPECT_EQ(a.clip_eps(), 0.15);
  EXPECT_EQ(a.kl_beta(), 0.02);
  EXPECT_EQ(a.temperature(), 0.9);
  EXPECT_EQ(a.minibatches(), 2);
  EXPECT_EQ(a.epochs(), 3);
  EXPECT_EQ(a.learning_rate(), rl::learning_rate_at(config->algorithm, 5));
  EXPECT_EQ(a.is_rule(), v1::IS_RULE_ICEPOP);
  EXPECT_EQ(a.is_lo(), 0.6);
  EXPECT_EQ(a.is_hi(), 1.8);
}

}  // namespace
}  // namespace fp8rl
