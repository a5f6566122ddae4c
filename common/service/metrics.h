// Prometheus metrics for every fp8rl service, on prometheus-cpp (Debian prometheus-cpp-dev): its
// registry holds the series and its text serializer writes the exposition format 0.0.4 that
// /metrics serves (and `promtool check metrics` accepts). This header adds what prometheus-cpp
// leaves to its users: our naming rules, a fixed label-name list per metric (series are picked by
// label values in that order), and errors as absl::Status instead of exceptions.
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

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace fp8rl::service {

// One series of a counter. A handle: cheap to copy, valid as long as its registry.
class Counter {
 public:
  explicit Counter(prometheus::Counter* series) : series_(series) {}
  // Negative or non-finite increments are ignored (a counter only goes up).
  void inc(double amount = 1.0);
  double value() const;

 private:
  prometheus::Counter* series_;  // owned by the registry
};

// One series of a gauge (a handle, like Counter).
class Gauge {
 public:
  explicit Gauge(prometheus::Gauge* series) : series_(series) {}
  void set(double value);
  void add(double amount);
  double value() const;

 private:
  prometheus::Gauge* series_;  // owned by the registry
};

// One series of a histogram (a handle, like Counter). Buckets are upper-inclusive (le).
class Histogram {
 public:
  explicit Histogram(prometheus::Histogram* series) : series_(series) {}
  void observe(double value);  // NaN is ignored

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf last
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  prometheus::Histogram* series_;  // owned by the registry
};

// All series of one metric name; P is the prometheus-cpp metric type, T our handle.
template <typename P, typename T>
class MetricFamily {
 public:
  MetricFamily(prometheus::Family<P>* family, std::vector<std::string> label_names,
               std::vector<double> bounds = {})
      : family_(family), label_names_(std::move(label_names)), bounds_(std::move(bounds)) {}

  // The series with these label values (created at 0 on first use). Values are matched to
  // label_names() by position; a wrong count is a programming error and is padded with "" /
  // truncated rather than crashing a service. Thread-safe (prometheus-cpp locks the family).
  T with(const std::vector<std::string>& label_values);
  // The series of a metric without labels.
  T get() { return with({}); }

  const std::vector<std::string>& label_names() const { return label_names_; }

 private:
  prometheus::Family<P>* family_;  // owned by the registry
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
};

using CounterFamily = MetricFamily<prometheus::Counter, Counter>;
using GaugeFamily = MetricFamily<prometheus::Gauge, Gauge>;
using HistogramFamily = MetricFamily<prometheus::Histogram, Histogram>;

// Default latency buckets in seconds (1 ms .. 10 min).
std::vector<double> default_seconds_buckets();

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  absl::StatusOr<CounterFamily*> add_counter(std::string_view name, std::string_view help,
                                             std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> add_gauge(std::string_view name, std::string_view help,
                                         std::vector<std::string> label_names = {});
  // bounds: finite, strictly increasing upper bounds; +Inf is implicit.
  absl::StatusOr<HistogramFamily*> add_histogram(std::string_view name, std::string_view help,
                                                 std::vector<std::string> label_names,
                                                 std::vector<double> bounds);

  // Every family in prometheus-cpp's text exposition format 0.0.4 (counters, then gauges, then
  // histograms). A family without labels is exported from registration (at 0); a labelled one
  // appears once a series of it is used.
  std::string render() const;

  // The underlying prometheus-cpp registry (for prometheus-cpp collectors and exposers).
  prometheus::Registry& prometheus_registry() { return *registry_; }

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  absl::Status check_new_locked(std::string_view name, std::string_view help,
                                const std::vector<std::string>& label_names,
                                Kind kind) const;  // caller holds mu_

  const std::unique_ptr<prometheus::Registry> registry_;
  // std::mutex, not absl::Mutex: ThreadSanitizer sees a std::mutex (Debian's Abseil is not built
  // with it), so races on the families stay visible to it.
  mutable std::mutex mu_;  // guards every member below
  std::vector<std::unique_ptr<CounterFamily>> counters_;
  std::vector<std::unique_ptr<GaugeFamily>> gauges_;
  std::vector<std::unique_ptr<HistogramFamily>> histograms_;
  std::set<std::string, std::less<>> names_;
};

// The content type /metrics answers with.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Registers the metrics every service exports: fp8rl_build_info{service} (always 1) and
// fp8rl_process_start_time_seconds (set to now).
absl::Status register_process_metrics(MetricsRegistry* registry, std::string_view service);

}  // namespace fp8rl::service
