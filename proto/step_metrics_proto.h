// The one proto <-> row converter of a train step's metrics (rl/step_metric_schema.h):
// v1::TrainStepResponse.metrics, plus its fixed fields 1-8 for peers that predate that map.
#pragma once

#include "fp8rl/v1/trainer.pb.h"
#include "rl/step_metrics.h"

namespace fp8rl {

// Copies every value into response.metrics, and those with a fixed field (loss ... mismatch) into
// that field too. train_tokens is rounded to the int64 `tokens` field.
void step_metrics_to_proto(const rl::MetricsValues& values, v1::TrainStepResponse* response);

// The response's metrics map; from a trainer that predates it (empty map), the fixed fields under
// their metric names.
rl::MetricsValues step_metrics_from_proto(const v1::TrainStepResponse& response);

}  // namespace fp8rl
