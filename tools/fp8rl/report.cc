// SVG charts and a markdown summary of one job (see report.h).
#include "tools/fp8rl/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/console/chart_list.h"

namespace fp8rl::cli {
namespace {

std::string xml_escape(const std::string& text) {
  return absl::StrReplaceAll(text,
                             {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

// 4 significant digits, like the console.
std::string fmt(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) return absl::StrFormat("%.2e", v);
  return absl::StrFormat("%.4g", v);
}

std::string utc_time(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

struct Point {
  int64_t step;
  double raw;
  double drawn;  // cumulative when stacked
};

}  // namespace

absl::StatusOr<ChartList> console_charts() {
  absl::StatusOr<std::string> text = console::chart_list_json();
  if (!text.ok()) return text.status();
  const nlohmann::json spec = nlohmann::json::parse(*text, nullptr, false);
  if (!spec.is_object() || !spec["charts"].is_array()) {
    return absl::InternalError("charts.json: expected {\"charts\": [...]}");
  }
  ChartList list;
  for (const auto& c : spec["charts"]) {
    ChartSpec chart;
    chart.id = c.value("id", "");
    chart.title = c.value("title", "");
    chart.stacked = c.value("stacked", false);
    for (const auto& s : c["series"])
      chart.series.push_back({s.value("key", ""), s.value("label", "")});
    list.charts.push_back(std::move(chart));
  }
  for (const auto& color : spec["palette"]) list.palette.push_back(color.get<std::string>());
  if (list.palette.empty()) list.palette.push_back("#1f6fb2");
  return list;
}

std::string render_chart_svg(const ChartSpec& chart, const std::vector<std::string>& palette,
                             const std::vector<ReportRow>& rows) {
  // points[i]: series i's points, in step order.
  std::vector<std::vector<Point>> points(chart.series.size());
  for (const ReportRow& row : rows) {
    double sum = 0;
    for (size_t i = 0; i < chart.series.size(); ++i) {
      auto it = row.values.find(chart.series[i].key);
      if (it == row.values.end() || !std::isfinite(it->second)) continue;
      sum += it->second;
      points[i].push_back({row.step, it->second, chart.stacked ? sum : it->second});
    }
  }
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& series : points) {
    for (const Point& p : series) {
      x0 = std::min(x0, double(p.step));
      x1 = std::max(x1, double(p.step));
      y0 = std::min(y0, p.drawn);
      y1 = std::max(y1, p.drawn);
    }
  }
  if (!std::isfinite(x0)) return "";
  if (chart.stacked) y0 = std::min(0.0, y0);
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) {
    const double d = std::fabs(y0) * 0.1 > 0 ? std::fabs(y0) * 0.1 : 1;
    y0 -= d, y1 += d;
  }
  // Canvas: plot area [L, W-R] x [T, H-B], legend below it.
  const double W = 640, H = 300, L = 64, R = 16, T = 34, B = 64;
  auto sx = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto sy = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %g %g\" width=\"%g\" "
      "height=\"%g\" font-family=\"DejaVu Sans, sans-serif\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n"
      "<text x=\"%g\" y=\"20\" font-size=\"14\" font-weight=\"bold\">%s</text>\n"
      "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"#fbfcfd\" stroke=\"#d5dae1\"/>\n",
      W, H, W, H, L, xml_escape(chart.title), L, T, W - L - R, H - T - B);
  for (double f : {0.0, 0.5, 1.0}) {
    const double y = y0 + f * (y1 - y0);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e9ee\"/>\n"
                          "<text x=\"%g\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" "
                          "fill=\"#556\">%s</text>\n",
                          L, W - R, sy(y), sy(y), L - 4, sy(y) + 4, fmt(y));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%g\" y=\"%g\" font-size=\"11\" fill=\"#556\">step %s</text>\n"
                        "<text x=\"%g\" y=\"%g\" font-size=\"11\" text-anchor=\"end\" "
                        "fill=\"#556\">step %s</text>\n",
                        L, H - B + 16, fmt(x0), W - R, H - B + 16, fmt(x1));
  std::set<int64_t> steps;
  for (const auto& series : points) {
    for (const Point& p : series) steps.insert(p.step);
  }
  const double bar_width = std::clamp(
      0.8 * (W - L - R) / static_cast<double>(std::max<size_t>(1, steps.size())), 1.0, 24.0);
  double legend_x = L;
  for (size_t i = 0; i < chart.series.size(); ++i) {
    if (points[i].empty()) continue;
    const std::string& color = palette[i % palette.size()];
    const std::string key = xml_escape(chart.series[i].key);
    if (chart.stacked) {
      // One bar per step, a segment per series from the sum below it to its own top.
      for (const Point& p : points[i]) {
        const double top = sy(p.drawn), bottom = sy(p.drawn - p.raw);
        absl::StrAppendFormat(&svg,
                              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                              "fill=\"%s\" opacity=\"0.85\"/>\n",
                              sx(p.step) - bar_width / 2, top, bar_width,
                              std::max(0.0, bottom - top), color);
      }
    } else {
      std::string line;
      for (const Point& p : points[i]) {
        absl::StrAppendFormat(&line, "%s%.1f,%.1f", line.empty() ? "" : " ", sx(p.step),
                              sy(p.drawn));
      }
      absl::StrAppendFormat(&svg,
                            "<polyline data-key=\"%s\" fill=\"none\" stroke=\"%s\" "
                            "stroke-width=\"1.5\" points=\"%s\"/>\n",
                            key, color, line);
    }
    for (const Point& p : points[i]) {
      absl::StrAppendFormat(&svg,
                            "<circle data-key=\"%s\" data-step=\"%d\" data-value=\"%.17g\" "
                            "cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\"/>\n",
                            key, p.step, p.raw, sx(p.step), sy(p.drawn), color);
    }
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%g\" y=\"%g\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                          "<text x=\"%g\" y=\"%g\" font-size=\"11\">%s</text>\n",
                          legend_x, H - 30, color, legend_x + 14, H - 21,
                          xml_escape(chart.series[i].label));
    legend_x += 24 + 6.5 * chart.series[i].label.size();
  }
  svg += "</svg>\n";
  return svg;
}

std::string render_summary(const ReportJob& job, const ChartList& charts,
                           const std::vector<std::string>& chart_files) {
  std::string md = absl::StrCat("# Job ", job.id, "\n\n");
  absl::StrAppend(&md, "| | |\n|---|---|\n| state | ", job.state, " |\n| steps | ", job.step, " / ",
                  job.total_steps, " |\n| submitted | ", utc_time(job.created_unix_ms),
                  " |\n| last update | ", utc_time(job.updated_unix_ms), " |\n");
  if (job.created_unix_ms > 0 && job.updated_unix_ms >= job.created_unix_ms) {
    absl::StrAppendFormat(&md, "| duration | %.1f s |\n",
                          (job.updated_unix_ms - job.created_unix_ms) / 1000.0);
  }
  if (!job.error.empty()) absl::StrAppend(&md, "| error | ", job.error, " |\n");

  md += "\n## Held-out accuracy\n\n";
  std::string acc;
  for (const ReportRow& row : job.rows) {
    auto it = row.values.find("val_accuracy");
    if (it == row.values.end()) continue;
    absl::StrAppend(&acc, "| ", row.step, row.step == 0 ? " (before RL)" : "", " | ",
                    fmt(it->second), " |\n");
  }
  md += acc.empty() ? "No validation recorded.\n" : "| step | val_accuracy |\n|---|---|\n" + acc;

  md += "\n## Charted metrics\n\n";
  std::string table;
  for (const ChartSpec& chart : charts.charts) {
    for (const ChartSeries& s : chart.series) {
      int64_t n = 0, last_step = 0;
      double first = 0, last = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (const ReportRow& row : job.rows) {
        auto it = row.values.find(s.key);
        if (it == row.values.end()) continue;
        if (n++ == 0) first = it->second;
        last = it->second, last_step = row.step;
        lo = std::min(lo, it->second), hi = std::max(hi, it->second);
      }
      if (n == 0) continue;
      absl::StrAppend(&table, "| `", s.key, "` | ", n, " | ", fmt(first), " | ", fmt(last),
                      " (step ", last_step, ") | ", fmt(lo), " | ", fmt(hi), " |\n");
    }
  }
  md += table.empty()
            ? "No metrics recorded.\n"
            : "| metric | rows | first | last | min | max |\n|---|---|---|---|---|---|\n" + table;
  if (!chart_files.empty()) {
    md += "\n## Charts\n\n";
    for (const std::string& id : chart_files) {
      for (const ChartSpec& chart : charts.charts) {
        if (chart.id == id) absl::StrAppend(&md, "![", chart.title, "](", id, ".svg)\n\n");
      }
    }
  }
  const nlohmann::json config = nlohmann::json::parse(job.config_json, nullptr, false);
  if (!config.is_discarded()) {
    absl::StrAppend(&md, "## Config\n\n```json\n", config.dump(2), "\n```\n");
  }
  return md;
}

absl::Status write_report(const ReportJob& job, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out_path(out);
  if (fs::exists(out_path, ec)) {
    if (!fs::is_directory(out_path, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--out: '", out, "' exists and is not a folder"));
    }
    if (!fs::is_empty(out_path, ec) && !fs::exists(out_path / "summary.md", ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--out: '", out,
                       "' is a non-empty folder that is not an earlier report; not replacing it"));
    }
  }
  const fs::path parent = out_path.has_parent_path() ? out_path.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out: parent folder '", parent.string(), "' does not exist"));
  }
  absl::StatusOr<ChartList> charts = console_charts();
  if (!charts.ok()) return charts.status();
  return write_dir_atomic(out, [&](const std::string& tmp) -> absl::Status {
    std::vector<std::string> written;
    for (const ChartSpec& chart : charts->charts) {
      const std::string svg = render_chart_svg(chart, charts->palette, job.rows);
      if (svg.empty()) continue;
      if (absl::Status s = write_file_atomic(tmp + "/" + chart.id + ".svg", svg); !s.ok()) return s;
      written.push_back(chart.id);
    }
    return write_file_atomic(tmp + "/summary.md", render_summary(job, *charts, written));
  });
}

}  // namespace fp8rl::cli
