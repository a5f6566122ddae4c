// Counters, gauges and histograms and their Prometheus text exposition (see metrics.h).
#include "common/service/metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace fp8rl::service {
namespace {

bool is_metric_name(std::string_view name) {
  if (!name.starts_with("fp8rl_") || name.size() <= 6) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool is_label_name(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  if (!((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string escape_help(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escape_label_value(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} plus an optional extra pair (histogram "le"); empty string when no labels.
std::string label_block(const std::vector<std::string>& names,
                        const std::vector<std::string>& values, std::string_view extra_name = {},
                        std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", escape_label_value(values[i]), "\"");
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    absl::StrAppend(&out, std::string(extra_name), "=\"", std::string(extra_value), "\"");
  }
  out += '}';
  return out;
}

std::string_view type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

template <typename T>
void render_header(const MetricFamily<T>& family, std::string& out) {
  absl::StrAppend(&out, "# HELP ", family.name(), " ", escape_help(family.help()), "\n");
  absl::StrAppend(&out, "# TYPE ", family.name(), " ", std::string(type_name(family.type())), "\n");
}

template <typename T>
void render_scalar(const MetricFamily<T>& family, std::string& out) {
  render_header(family, out);
  for (const auto& [values, series] : family.series()) {
    absl::StrAppend(&out, family.name(), label_block(family.label_names(), values), " ",
                    format_metric_value(series->value()), "\n");
  }
}

void render_histogram(const HistogramFamily& family, std::string& out) {
  render_header(family, out);
  const auto& bounds = family.bounds();
  for (const auto& [values, series] : family.series()) {
    const Histogram::Snapshot snap = series->snapshot();
    for (size_t b = 0; b <= bounds.size(); ++b) {
      const std::string le = b < bounds.size() ? format_metric_value(bounds[b]) : "+Inf";
      absl::StrAppend(&out, family.name(), "_bucket",
                      label_block(family.label_names(), values, "le", le), " ", snap.cumulative[b],
                      "\n");
    }
    const std::string labels = label_block(family.label_names(), values);
    absl::StrAppend(&out, family.name(), "_sum", labels, " ", format_metric_value(snap.sum), "\n");
    absl::StrAppend(&out, family.name(), "_count", labels, " ", snap.count, "\n");
  }
}

}  // namespace

void Counter::inc(double amount) {
  if (!(amount >= 0.0) || !std::isfinite(amount)) return;
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(bounds->size() + 1, 0) {}

void Histogram::observe(double value) {
  if (std::isnan(value)) return;
  const size_t bucket =
      std::lower_bound(bounds_->begin(), bounds_->end(), value) - bounds_->begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  absl::MutexLock lock(&mu_);
  Snapshot snap;
  snap.cumulative.resize(counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    running += counts_[i];
    snap.cumulative[i] = running;
  }
  snap.sum = sum_;
  snap.count = count_;
  return snap;
}

template <typename T>
T& MetricFamily<T>::with(const std::vector<std::string>& label_values) {
  std::vector<std::string> key = label_values;
  key.resize(label_names_.size());
  absl::MutexLock lock(&mu_);
  auto it = series_.find(key);
  if (it == series_.end()) {
    std::unique_ptr<T> series;
    if constexpr (std::is_same_v<T, Histogram>) {
      series = std::make_unique<Histogram>(&bounds_);
    } else {
      series = std::make_unique<T>();
    }
    it = series_.emplace(std::move(key), std::move(series)).first;
  }
  return *it->second;
}

template <typename T>
std::vector<std::pair<std::vector<std::string>, const T*>> MetricFamily<T>::series() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::vector<std::string>, const T*>> out;
  out.reserve(series_.size());
  for (const auto& [key, series] : series_) out.emplace_back(key, series.get());
  return out;
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

std::vector<double> default_seconds_buckets() {
  return {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

absl::Status MetricsRegistry::check_new_locked(std::string_view name, std::string_view help,
                                               const std::vector<std::string>& label_names,
                                               MetricType type) const {
  if (!is_metric_name(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': name must match fp8rl_[a-z0-9_]+"));
  }
  const bool total = name.ends_with("_total");
  if (type == MetricType::kCounter && !total) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': counter names must end in _total"));
  }
  if (type != MetricType::kCounter && total) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': only counter names may end in _total"));
  }
  if (type == MetricType::kHistogram &&
      (name.ends_with("_bucket") || name.ends_with("_count") || name.ends_with("_sum"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric '", std::string(name), "': histogram names must not end in _bucket/_count/_sum"));
  }
  if (help.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': help text is empty"));
  }
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!is_label_name(label) || (type == MetricType::kHistogram && label == "le")) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric '", std::string(name), "': bad label name '", label, "'"));
    }
    if (std::find(label_names.begin(), label_names.begin() + i, label) != label_names.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric '", std::string(name), "': duplicate label name '", label, "'"));
    }
  }
  if (names_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric '", std::string(name), "': already registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CounterFamily*> MetricsRegistry::add_counter(std::string_view name,
                                                            std::string_view help,
                                                            std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  FP8RL_RETURN_IF_ERROR(check_new_locked(name, help, label_names, MetricType::kCounter));
  counters_.push_back(std::make_unique<CounterFamily>(
      std::string(name), std::string(help), std::move(label_names), MetricType::kCounter));
  order_.emplace_back(MetricType::kCounter, counters_.size() - 1);
  names_.emplace(std::string(name), MetricType::kCounter);
  if (counters_.back()->label_names().empty()) counters_.back()->get();  // exported at 0
  return counters_.back().get();
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::add_gauge(std::string_view name,
                                                        std::string_view help,
                                                        std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  FP8RL_RETURN_IF_ERROR(check_new_locked(name, help, label_names, MetricType::kGauge));
  gauges_.push_back(std::make_unique<GaugeFamily>(std::string(name), std::string(help),
                                                  std::move(label_names), MetricType::kGauge));
  order_.emplace_back(MetricType::kGauge, gauges_.size() - 1);
  names_.emplace(std::string(name), MetricType::kGauge);
  if (gauges_.back()->label_names().empty()) gauges_.back()->get();  // exported at 0
  return gauges_.back().get();
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::add_histogram(
    std::string_view name, std::string_view help, std::vector<std::string> label_names,
    std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  FP8RL_RETURN_IF_ERROR(check_new_locked(name, help, label_names, MetricType::kHistogram));
  if (bounds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': no bucket bounds"));
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric '", std::string(name),
                       "': bucket bounds must be finite and strictly increasing"));
    }
  }
  histograms_.push_back(std::make_unique<HistogramFamily>(
      std::string(name), std::string(help), std::move(label_names), MetricType::kHistogram,
      std::move(bounds)));
  order_.emplace_back(MetricType::kHistogram, histograms_.size() - 1);
  names_.emplace(std::string(name), MetricType::kHistogram);
  if (histograms_.back()->label_names().empty()) histograms_.back()->get();  // exported empty
  return histograms_.back().get();
}

std::string MetricsRegistry::render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [type, index] : order_) {
    switch (type) {
      case MetricType::kCounter:
        render_scalar(*counters_[index], out);
        break;
      case MetricType::kGauge:
        render_scalar(*gauges_[index], out);
        break;
      case MetricType::kHistogram:
        render_histogram(*histograms_[index], out);
        break;
    }
  }
  return out;
}

std::string format_metric_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buffer[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

absl::Status register_process_metrics(MetricsRegistry* registry, std::string_view service) {
  absl::StatusOr<GaugeFamily*> build_info =
      registry->add_gauge("fp8rl_build_info", "Always 1; labels identify the binary.", {"service"});
  if (!build_info.ok()) return build_info.status();
  (*build_info)->with({std::string(service)}).set(1);
  absl::StatusOr<GaugeFamily*> start_time = registry->add_gauge(
      "fp8rl_process_start_time_seconds", "Start time of the process, Unix seconds.");
  if (!start_time.ok()) return start_time.status();
  (*start_time)
      ->get()
      .set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
               .count());
  return absl::OkStatus();
}

}  // namespace fp8rl::service
