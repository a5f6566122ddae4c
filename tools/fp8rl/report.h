// `fp8rl report`'s output, independent of how the job was fetched: the console's charts
// (services/coordinator/console/charts.json) drawn as standalone SVG files, and summary.md with
// the job's outcome, the held-out accuracy per evaluated step and the final value of each charted
// metric. Kept apart from the gRPC client so that it is unit-tested on plain data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl::cli {

struct ReportRow {
  int64_t step = 0;
  std::map<std::string, double> values;
};

struct ReportJob {
  std::string id;
  std::string state;  // "SUCCEEDED", ...
  int64_t step = 0;
  int64_t total_steps = 0;
  std::string error;
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  std::string config_json;
  std::vector<ReportRow> rows;  // the metrics history in step order (row 0 first)
};

struct ChartSeries {
  std::string key;
  std::string label;
};

struct ChartSpec {
  std::string id;  // file name stem: "<id>.svg"
  std::string title;
  bool stacked = false;
  std::vector<ChartSeries> series;
};

struct ChartList {
  std::vector<ChartSpec> charts;
  std::vector<std::string> palette;
};

// The chart list the console uses (the embedded charts.json).
absl::StatusOr<ChartList> console_charts();

// A standalone SVG of one chart: a polyline per series over the rows carrying its key, a
// <circle data-key data-step data-value> per point (raw values, also when stacked). Empty string
// when no row carries any of the chart's keys.
std::string render_chart_svg(const ChartSpec& chart, const std::vector<std::string>& palette,
                             const std::vector<ReportRow>& rows);

// summary.md; `chart_files` are the charts written (id -> title), linked in order.
std::string render_summary(const ReportJob& job, const ChartList& charts,
                           const std::vector<std::string>& chart_files);

// Writes <out>/summary.md and <out>/<chart id>.svg for every chart with data, atomically (a
// temporary folder renamed into place). `out`'s parent must exist; an existing `out` is replaced
// only when it is empty or an earlier report (holds summary.md), else InvalidArgument "--out: ...".
absl::Status write_report(const ReportJob& job, const std::string& out);

}  // namespace fp8rl::cli
