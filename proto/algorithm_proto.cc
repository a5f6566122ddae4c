// Algorithm parameters to and from proto (see algorithm_proto.h).
#include "proto/algorithm_proto.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fp8rl {
namespace {

// The one mapping between the two IS rule enums; both directions read it.
constexpr std::pair<rl::IsRule, v1::ImportanceSamplingRule> kIsRules[] = {
    {rl::IsRule::kNone, v1::IS_RULE_NONE},
    {rl::IsRule::kTis, v1::IS_RULE_TIS},
    {rl::IsRule::kIcepop, v1::IS_RULE_ICEPOP},
    {rl::IsRule::kSeqMaskTis, v1::IS_RULE_SEQ_MASK_TIS},
};

}  // namespace

v1::ImportanceSamplingRule is_rule_to_proto(rl::IsRule rule) {
  for (const auto& [ours, proto] : kIsRules) {
    if (ours == rule) return proto;
  }
  return v1::IS_RULE_UNSPECIFIED;
}

absl::StatusOr<rl::IsRule> is_rule_from_proto(v1::ImportanceSamplingRule rule) {
  if (rule == v1::IS_RULE_UNSPECIFIED) return rl::IsRule::kTis;
  for (const auto& [ours, proto] : kIsRules) {
    if (proto == rule) return ours;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("algorithm.is_rule: unknown rule ", static_cast<int>(rule)));
}

void is_config_to_proto(const rl::IsConfig& is, v1::AlgorithmParams* params) {
  params->set_is_rule(is_rule_to_proto(is.rule));
  if (is.rule == rl::IsRule::kTis) params->set_is_cap(is.cap);
  if (is.rule == rl::IsRule::kIcepop || is.rule == rl::IsRule::kSeqMaskTis) {
    params->set_is_lo(is.lo);
    params->set_is_hi(is.hi);
  }
}

absl::StatusOr<rl::IsConfig> is_config_from_proto(const v1::AlgorithmParams& a) {
  rl::IsConfig c;
  absl::StatusOr<rl::IsRule> rule = is_rule_from_proto(a.is_rule());
  if (!rule.ok()) return rule.status();
  c.rule = *rule;
  for (const auto& [name, value] : {std::pair{"is_lo", a.is_lo()}, std::pair{"is_hi", a.is_hi()},
                                    std::pair{"is_cap", a.is_cap()}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("algorithm.", name, ": must be >= 0, got ", value));
    }
  }
  const rl::IsConfig rule_defaults = rl::default_is_config(c.rule);
  // hi and cap are >= 1 whenever they are set, so 0 can only mean "not sent"; lo = 0 is a valid
  // bound (nothing is masked from below) and is used as sent. The coordinator always sends the
  // job's values (the job config fills in each rule's defaults at submission).
  const double cap = a.is_cap() > 0 ? a.is_cap() : a.is_hi();
  c.cap = cap > 0 ? cap : rule_defaults.cap;
  c.hi = a.is_hi() > 0 ? a.is_hi() : rule_defaults.hi;
  c.lo = a.is_lo();
  if (absl::Status s = rl::validate_is_config(c, "algorithm.is"); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (from algorithm.is_lo=", a.is_lo(), ", is_hi=", a.is_hi(),
                     ", is_cap=", a.is_cap(), ")"));
  }
  return c;
}

v1::OptimizerParams optimizer_to_proto(const rl::AlgorithmConfig& algorithm) {
  v1::OptimizerParams o;
  o.set_learning_rate(algorithm.learning_rate);
  o.set_adam_beta1(algorithm.adam_beta1);
  o.set_adam_beta2(algorithm.adam_beta2);
  o.set_adam_epsilon(algorithm.adam_epsilon);
  o.set_weight_decay(algorithm.weight_decay);
  o.set_max_grad_norm(algorithm.max_grad_norm);
  return o;
}

v1::AlgorithmParams algorithm_to_proto(const rl::AlgorithmConfig& algorithm, int64_t step) {
  v1::AlgorithmParams a;
  a.set_clip_eps(algorithm.clip_eps);
  a.set_kl_beta(algorithm.kl_beta);
  a.set_temperature(algorithm.temperature);
  is_config_to_proto(algorithm.is, &a);
  a.set_minibatches(static_cast<int32_t>(algorithm.minibatches));
  a.set_epochs(static_cast<int32_t>(algorithm.epochs));
  a.set_routing_replay(algorithm.routing_replay);
  a.set_router_aux_loss_coef(algorithm.router_aux_loss_coef);
  a.set_learning_rate(rl::learning_rate_at(algorithm, step));
  return a;
}

}  // namespace fp8rl
