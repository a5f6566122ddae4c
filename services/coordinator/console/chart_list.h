// The console's chart list, as served at /console/charts.json and drawn by `fp8rl report`: the
// embedded charts.json with its {"step_metrics": true} entry replaced by the charts of the step
// metrics (rl/step_metric_schema.h kStepCharts, each with the metrics that name it, in schema
// order), so a metric added to the schema with a chart shows up without editing charts.json.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "rl/step_metric_schema.h"

namespace fp8rl::console {

// JSON text; Internal when the embedded charts.json is malformed or lacks the step_metrics entry.
absl::StatusOr<std::string> chart_list_json(rl::StepMetricSchema schema = rl::kStepMetrics);

}  // namespace fp8rl::console
