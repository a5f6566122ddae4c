// Prints the generation worker's metric families after a worker-like sequence of updates (a
// request, three weight versions of which two arrived as deltas, one delta fallback); ctest pipes
// it to `promtool check metrics`, so the names, help texts and histograms stay promtool-clean.
#include <cstdio>

#include "common/service/metrics.h"
#include "services/generation_worker/generation_metrics.h"

int main() {
  fp8rl::service::MetricsRegistry r;
  auto metrics = fp8rl::generation::GenerationMetrics::create(&r);
  if (!metrics.ok()) {
    std::fprintf(stderr, "%s\n", metrics.status().ToString().c_str());
    return 1;
  }
  fp8rl::generation::GenerationMetrics& m = **metrics;
  m.tokens->with({"prompt"}).inc(12);
  m.tokens->with({"generated"}).inc(40);
  m.requests->with({"ok"}).inc();
  m.request_seconds->get().observe(0.8);
  m.weight_version->get().set(3);
  m.weight_swaps->get().inc(3);
  fp8rl::generation::WeightPathRecorder recorder(&m);
  fp8rl::generation::WeightPathCounts c;
  c.installs = 3;
  c.in_place_installs = 1;
  c.delta_versions = 2;
  c.delta_fallbacks = 1;
  c.delta_bytes = 123456;
  c.last_delta_seconds = 0.004;
  c.receive_buffer_bytes = 2 << 20;
  recorder.record(c);
  m.weight_install_seconds->get().observe(0.02);
  std::fputs(r.render().c_str(), stdout);
  return 0;
}
