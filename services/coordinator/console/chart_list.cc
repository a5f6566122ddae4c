// The chart list with the step metrics' charts filled in (see chart_list.h).
#include "services/coordinator/console/chart_list.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "services/coordinator/console/assets.h"

namespace fp8rl::console {
namespace {

using Json = nlohmann::ordered_json;

// kStepCharts that have at least one metric of `schema`, each with those metrics as series.
Json step_charts(rl::StepMetricSchema schema) {
  Json charts = Json::array();
  for (const rl::StepChartDef& chart : rl::kStepCharts) {
    Json series = Json::array();
    for (const rl::StepMetricDef& m : schema) {
      if (m.chart != chart.id) continue;
      series.push_back(Json{{"key", std::string(m.name)}, {"label", std::string(m.chart_label)}});
    }
    if (series.empty()) continue;
    charts.push_back(Json{
        {"id", std::string(chart.id)}, {"title", std::string(chart.title)}, {"series", series}});
  }
  return charts;
}

}  // namespace

absl::StatusOr<std::string> chart_list_json(rl::StepMetricSchema schema) {
  const EmbeddedFile* file = find_embedded_file("charts.json");
  if (file == nullptr) return absl::InternalError("charts.json is not embedded");
  absl::StatusOr<Json> spec = parse_json_strict(file->body, "charts.json");
  if (!spec.ok()) return absl::InternalError(spec.status().message());
  if (!spec->is_object() || !(*spec)["charts"].is_array()) {
    return absl::InternalError("charts.json: expected {\"charts\": [...]}");
  }
  Json charts = Json::array();
  bool placed = false;
  for (const Json& chart : (*spec)["charts"]) {
    if (!chart.is_object() || !chart.value("step_metrics", false)) {
      charts.push_back(chart);
      continue;
    }
    for (const Json& c : step_charts(schema)) charts.push_back(c);
    placed = true;
  }
  if (!placed) return absl::InternalError("charts.json: no {\"step_metrics\": true} entry");
  (*spec)["charts"] = std::move(charts);
  return spec->dump();
}

}  // namespace fp8rl::console
