// Prometheus metrics for every fp8rl service: counters, gauges and histograms with a small fixed
// set of label names per metric, rendered in the text exposition format 0.0.4 that /metrics
// serves (and `promtool check metrics` accepts). prometheus-cpp is not packaged in Debian 12, so
// this is our own small implementation.
//
//   MetricsRegistry registry;
//   auto* jobs = registry.add_gauge("fp8rl_coordinator_jobs", "Jobs by state.", {"state"}).value();
//   jobs->with({"running"}).set(1);
//
// Naming rules enforced at registration (InvalidArgument naming the metric): names match
// fp8rl_[a-z0-9_]+, counters end in _total and nothing else does, histograms do not end in
// _bucket/_count/_sum, label names match [a-z_][a-z0-9_]* (no leading "__", no "le"), base units
// belong in the name (_seconds, _bytes). Names are unique within a registry.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace fp8rl::service {

class Counter {
 public:
  // Negative or non-finite increments are ignored (a counter only goes up).
  void inc(double amount = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void observe(double value);  // NaN is ignored

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf last
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double>* bounds_;  // owned by the family
  mutable absl::Mutex mu_;
  // Per bucket (non-cumulative), +Inf bucket last.
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0.0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

enum class MetricType { kCounter, kGauge, kHistogram };

// All series of one metric name, keyed by label values.
template <typename T>
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, std::vector<std::string> label_names,
               MetricType type, std::vector<double> bounds = {})
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        type_(type),
        bounds_(std::move(bounds)) {}

  // The series with these label values (created at 0 on first use; references stay valid for
  // the registry's lifetime). Values are matched to label_names() by position; a wrong count is
  // a programming error and is padded with "" / truncated rather than crashing a service.
  T& with(const std::vector<std::string>& label_values);
  // The series of a metric without labels.
  T& get() { return with({}); }

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  MetricType type() const { return type_; }
  const std::vector<double>& bounds() const { return bounds_; }

  // Copies (label values, series pointer) under the lock, sorted by label values.
  std::vector<std::pair<std::vector<std::string>, const T*>> series() const;

 private:
  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
  MetricType type_;
  std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  // Series are created under mu_ and never removed, so a returned pointer stays valid.
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

// Default latency buckets in seconds (1 ms .. 10 min).
std::vector<double> default_seconds_buckets();

class MetricsRegistry {
 public:
  absl::StatusOr<CounterFamily*> add_counter(std::string_view name, std::string_view help,
                                             std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> add_gauge(std::string_view name, std::string_view help,
                                         std::vector<std::string> label_names = {});
  // bounds: finite, strictly increasing upper bounds; +Inf is implicit.
  absl::StatusOr<HistogramFamily*> add_histogram(std::string_view name, std::string_view help,
                                                 std::vector<std::string> label_names,
                                                 std::vector<double> bounds);

  // Every family in registration order, text exposition format 0.0.4. A family without labels
  // is exported from registration (at 0); a labelled one never used has HELP and TYPE only.
  std::string render() const;

 private:
  absl::Status check_new_locked(std::string_view name, std::string_view help,
                                const std::vector<std::string>& label_names, MetricType type) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<CounterFamily>> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<GaugeFamily>> gauges_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<HistogramFamily>> histograms_ ABSL_GUARDED_BY(mu_);
  // Registration order: (type, index into the vector of that type).
  std::vector<std::pair<MetricType, size_t>> order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, MetricType, std::less<>> names_ ABSL_GUARDED_BY(mu_);
};

// The content type /metrics answers with.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Formats a sample value the way Prometheus parses it (+Inf, -Inf, NaN, shortest round-trip).
std::string format_metric_value(double value);

// Registers the metrics every service exports: fp8rl_build_info{service} (always 1) and
// fp8rl_process_start_time_seconds (set to now).
absl::Status register_process_metrics(MetricsRegistry* registry, std::string_view service);

}  // namespace fp8rl::service
