// Our metric handles and registry on top of prometheus-cpp (see metrics.h).
#include "common/service/metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

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

// prometheus-cpp labels (a name -> value map) from our positional values.
std::map<std::string, std::string> labels_of(const std::vector<std::string>& names,
                                             const std::vector<std::string>& values) {
  std::map<std::string, std::string> labels;
  for (size_t i = 0; i < names.size(); ++i) labels[names[i]] = i < values.size() ? values[i] : "";
  return labels;
}

}  // namespace

void Counter::inc(double amount) {
  if (!(amount >= 0.0) || !std::isfinite(amount)) return;
  series_->Increment(amount);
}

double Counter::value() const { return series_->Value(); }

void Gauge::set(double value) { series_->Set(value); }

void Gauge::add(double amount) { series_->Increment(amount); }

double Gauge::value() const { return series_->Value(); }

void Histogram::observe(double value) {
  if (std::isnan(value)) return;
  series_->Observe(value);
}

Histogram::Snapshot Histogram::snapshot() const {
  const prometheus::ClientMetric metric = series_->Collect();
  Snapshot snap;
  for (const prometheus::ClientMetric::Bucket& bucket : metric.histogram.bucket) {
    snap.cumulative.push_back(bucket.cumulative_count);
  }
  snap.sum = metric.histogram.sample_sum;
  snap.count = metric.histogram.sample_count;
  return snap;
}

template <typename P, typename T>
T MetricFamily<P, T>::with(const std::vector<std::string>& label_values) {
  if constexpr (std::is_same_v<P, prometheus::Histogram>) {
    return T(&family_->Add(labels_of(label_names_, label_values), bounds_));
  } else {
    return T(&family_->Add(labels_of(label_names_, label_values)));
  }
}

template class MetricFamily<prometheus::Counter, Counter>;
template class MetricFamily<prometheus::Gauge, Gauge>;
template class MetricFamily<prometheus::Histogram, Histogram>;

std::vector<double> default_seconds_buckets() {
  return {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

MetricsRegistry::MetricsRegistry()
    : registry_(
          std::make_unique<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw)) {}

MetricsRegistry::~MetricsRegistry() = default;

absl::Status MetricsRegistry::check_new_locked(std::string_view name, std::string_view help,
                                               const std::vector<std::string>& label_names,
                                               Kind kind) const {
  if (!is_metric_name(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': name must match fp8rl_[a-z0-9_]+"));
  }
  const bool total = name.ends_with("_total");
  if (kind == Kind::kCounter && !total) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': counter names must end in _total"));
  }
  if (kind != Kind::kCounter && total) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': only counter names may end in _total"));
  }
  if (kind == Kind::kHistogram &&
      (name.ends_with("_bucket") || name.ends_with("_count") || name.ends_with("_sum"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric '", std::string(name), "': histogram names must not end in _bucket/_count/_sum"));
  }
  if (help.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", std::string(name), "': help text is empty"));
  }
  // prometheus-cpp 1.0.1 writes HELP text unescaped, so a newline or backslash would break the
  // exposition: refuse them here.
  if (help.find_first_of("\\\n") != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric '", std::string(name), "': help text must not contain a newline or backslash"));
  }
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!is_label_name(label) || (kind == Kind::kHistogram && label == "le")) {
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
  std::lock_guard<std::mutex> lock(mu_);
  FP8RL_RETURN_IF_ERROR(check_new_locked(name, help, label_names, Kind::kCounter));
  auto& family = prometheus::BuildCounter()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(*registry_);
  counters_.push_back(std::make_unique<CounterFamily>(&family, std::move(label_names)));
  names_.emplace(name);
  if (counters_.back()->label_names().empty()) counters_.back()->get();  // exported at 0
  return counters_.back().get();
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::add_gauge(std::string_view name,
                                                        std::string_view help,
                                                        std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  FP8RL_RETURN_IF_ERROR(check_new_locked(name, help, label_names, Kind::kGauge));
  auto& family =
      prometheus::BuildGauge().Name(std::string(name)).Help(std::string(help)).Register(*registry_);
  gauges_.push_back(std::make_unique<GaugeFamily>(&family, std::move(label_names)));
  names_.emplace(name);
  if (gauges_.back()->label_names().empty()) gauges_.back()->get();  // exported at 0
  return gauges_.back().get();
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::add_histogram(
    std::string_view name, std::string_view help, std::vector<std::string> label_names,
    std::vector<double> bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  FP8RL_RETURN_IF_ERROR(check_new_locked(name, help, label_names, Kind::kHistogram));
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
  auto& family = prometheus::BuildHistogram()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(*registry_);
  histograms_.push_back(
      std::make_unique<HistogramFamily>(&family, std::move(label_names), std::move(bounds)));
  names_.emplace(name);
  if (histograms_.back()->label_names().empty()) histograms_.back()->get();  // exported empty
  return histograms_.back().get();
}

std::string MetricsRegistry::render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
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
