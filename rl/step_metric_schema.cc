// Checks over the step-metric schema (see step_metric_schema.h).
#include "rl/step_metric_schema.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace fp8rl::rl {
namespace {

// Every charted metric names a chart of kStepCharts, with a label.
constexpr bool charts_are_known() {
  for (const StepMetricDef& m : kStepMetrics) {
    if (m.chart.empty()) continue;
    if (m.chart_label.empty()) return false;
    bool found = false;
    for (const StepChartDef& c : kStepCharts) found = found || c.id == m.chart;
    if (!found) return false;
  }
  return true;
}
static_assert(charts_are_known(), "a kStepMetrics entry names a chart missing from kStepCharts");

}  // namespace

absl::Status check_step_metric_values(const MetricsValues& values, StepMetricSchema schema) {
  for (const StepMetricDef& m : schema) {
    if (!values.contains(std::string(m.name))) {
      return absl::InternalError(
          absl::StrCat("step metric '", std::string(m.name), "' was not computed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::rl
