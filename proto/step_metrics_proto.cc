// Train-step metrics to and from TrainStepResponse (see step_metrics_proto.h).
#include "proto/step_metrics_proto.h"

#include <cmath>
#include <cstdint>
#include <string_view>

namespace fp8rl {
namespace {

// The metrics that also have a fixed field of TrainStepResponse (fields 1-8), frozen: metrics
// added later travel only in the map.
struct FixedField {
  std::string_view name;
  double (*get)(const v1::TrainStepResponse&);
  void (*set)(v1::TrainStepResponse*, double);
};

constexpr FixedField kFixedFields[] = {
    {"loss", [](const v1::TrainStepResponse& r) { return r.loss(); },
     [](v1::TrainStepResponse* r, double v) { r->set_loss(v); }},
    {"pg_loss", [](const v1::TrainStepResponse& r) { return r.pg_loss(); },
     [](v1::TrainStepResponse* r, double v) { r->set_pg_loss(v); }},
    {"kl", [](const v1::TrainStepResponse& r) { return r.kl(); },
     [](v1::TrainStepResponse* r, double v) { r->set_kl(v); }},
    {"grad_norm", [](const v1::TrainStepResponse& r) { return r.grad_norm(); },
     [](v1::TrainStepResponse* r, double v) { r->set_grad_norm(v); }},
    {"learning_rate", [](const v1::TrainStepResponse& r) { return r.learning_rate(); },
     [](v1::TrainStepResponse* r, double v) { r->set_learning_rate(v); }},
    {"clip_fraction", [](const v1::TrainStepResponse& r) { return r.clip_fraction(); },
     [](v1::TrainStepResponse* r, double v) { r->set_clip_fraction(v); }},
    {"train_tokens", [](const v1::TrainStepResponse& r) { return static_cast<double>(r.tokens()); },
     [](v1::TrainStepResponse* r, double v) { r->set_tokens(std::llround(v)); }},
    {"token_mult_prob_error",
     [](const v1::TrainStepResponse& r) { return r.mismatch().token_mult_prob_error(); },
     [](v1::TrainStepResponse* r, double v) {
       r->mutable_mismatch()->set_token_mult_prob_error(v);
     }},
    {"gen_kl_error", [](const v1::TrainStepResponse& r) { return r.mismatch().gen_kl_error(); },
     [](v1::TrainStepResponse* r, double v) { r->mutable_mismatch()->set_gen_kl_error(v); }},
    {"sampling_importance_ratio",
     [](const v1::TrainStepResponse& r) { return r.mismatch().sampling_importance_ratio(); },
     [](v1::TrainStepResponse* r, double v) {
       r->mutable_mismatch()->set_sampling_importance_ratio(v);
     }},
    {"is_oob_ratio", [](const v1::TrainStepResponse& r) { return r.mismatch().is_oob_ratio(); },
     [](v1::TrainStepResponse* r, double v) { r->mutable_mismatch()->set_is_oob_ratio(v); }},
    {"probs_ratio_min",
     [](const v1::TrainStepResponse& r) { return r.mismatch().probs_ratio_min(); },
     [](v1::TrainStepResponse* r, double v) { r->mutable_mismatch()->set_probs_ratio_min(v); }},
    {"probs_ratio_max",
     [](const v1::TrainStepResponse& r) { return r.mismatch().probs_ratio_max(); },
     [](v1::TrainStepResponse* r, double v) { r->mutable_mismatch()->set_probs_ratio_max(v); }},
};

}  // namespace

void step_metrics_to_proto(const rl::MetricsValues& values, v1::TrainStepResponse* response) {
  for (const auto& [name, value] : values) (*response->mutable_metrics())[name] = value;
  for (const FixedField& f : kFixedFields) {
    if (auto it = values.find(std::string(f.name)); it != values.end()) f.set(response, it->second);
  }
}

rl::MetricsValues step_metrics_from_proto(const v1::TrainStepResponse& response) {
  rl::MetricsValues values;
  if (!response.metrics().empty()) {
    for (const auto& [name, value] : response.metrics()) values[name] = value;
    return values;
  }
  for (const FixedField& f : kFixedFields) values[std::string(f.name)] = f.get(response);
  return values;
}

}  // namespace fp8rl
