// Prints a registry exercising every metric kind (labels with escapes, histograms, special
// values) plus the coordinator's real metric families; ctest pipes it to `promtool check metrics`.
#include <cstdio>

#include "common/service/metrics.h"
#include "services/coordinator/coordinator_metrics.h"

int main() {
  fp8rl::service::MetricsRegistry r;
  auto coordinator = fp8rl::coordinator::CoordinatorMetrics::create(&r);
  if (!coordinator.ok()) {
    std::fprintf(stderr, "%s\n", coordinator.status().ToString().c_str());
    return 1;
  }
  (*coordinator)->jobs->with({"running"}).set(1);
  (*coordinator)->jobs->with({"queued"}).set(2);
  (*coordinator)->live_workers->with({"generation"}).set(2);
  (*coordinator)->reward_mean->get().set(0.375);
  (*coordinator)->steps->get().inc(3);
  (*coordinator)->count_rejected("rest");
  (*coordinator)->record_phases({{"time_generate_seconds", 0.42}, {"time_train_seconds", 1.7}});
  (*coordinator)->record_step_metrics({{"token_mult_prob_error", 1.013}, {"gen_kl_error", 2.5e-4}});
  auto* c =
      r.add_counter("fp8rl_dump_bytes_total", "Bytes with \"quotes\" in help.", {"kind"}).value();
  c->with({"a\\b\"c\nd"}).inc(1e20);
  auto* g = r.add_gauge("fp8rl_dump_ratio", "A gauge with special values.", {"which"}).value();
  g->with({"inf"}).set(1.0 / 0.0);
  g->with({"small"}).set(1.5e-9);
  auto* h =
      r.add_histogram("fp8rl_dump_size_bytes", "A histogram.", {}, {1, 1024, 1048576}).value();
  h->get().observe(10);
  h->get().observe(5e6);
  std::fputs(r.render().c_str(), stdout);
  return 0;
}
