// Registration of the generation worker's metrics (see generation_metrics.h).
#include "services/generation_worker/generation_metrics.h"

#include "common/status_macros.h"

namespace fp8rl::generation {

absl::StatusOr<std::unique_ptr<GenerationMetrics>> GenerationMetrics::create(
    service::MetricsRegistry* registry) {
  auto m = std::make_unique<GenerationMetrics>();
  FP8RL_RETURN_IF_ERROR(service::register_process_metrics(registry, "generation-worker"));

  absl::Status status;
  // Keeps the first registration error; later registrations are skipped once one failed.
  auto take = [&status](auto result, auto** field) {
    if (!status.ok()) return;
    if (!result.ok()) {
      status = result.status();
      return;
    }
    *field = *result;
  };
  take(registry->add_counter("fp8rl_generation_tokens_total",
                             "Tokens processed, by kind (prompt, generated).", {"kind"}),
       &m->tokens);
  take(registry->add_counter("fp8rl_generation_requests_total",
                             "Generate requests finished, by status (ok, error, cancelled: the "
                             "client went away or its deadline passed; its samples were dropped "
                             "from the batch).",
                             {"status"}),
       &m->requests);
  take(registry->add_gauge("fp8rl_generation_queue_depth", "Sequences waiting to join a batch."),
       &m->queue_depth);
  take(registry->add_gauge("fp8rl_generation_batch_size", "Sequences in the current decode batch."),
       &m->batch_size);
  take(registry->add_gauge("fp8rl_generation_kv_cache_usage_ratio",
                           "KV-cache slots reserved by running sequences over the slot budget."),
       &m->kv_cache_usage);
  take(registry->add_gauge("fp8rl_generation_kv_cache_bytes", "Bytes held by the KV cache."),
       &m->kv_cache_bytes);
  take(registry->add_gauge("fp8rl_generation_weight_version", "Weight version in use."),
       &m->weight_version);
  take(registry->add_counter("fp8rl_generation_weight_swaps_total", "Weight versions swapped in."),
       &m->weight_swaps);
  take(registry->add_histogram("fp8rl_generation_request_seconds",
                               "Time from a Generate request's arrival to its last token.", {},
                               service::default_seconds_buckets()),
       &m->request_seconds);
  take(registry->add_counter("fp8rl_generation_weight_installs_total",
                             "Weight versions written into a model, by mode (in_place: into the "
                             "idle slot's existing model; rebuilt: into a newly built one).",
                             {"mode"}),
       &m->weight_installs);
  take(registry->add_counter("fp8rl_generation_weight_delta_versions_total",
                             "Weight versions received as a delta and rebuilt from the base."),
       &m->weight_delta_versions);
  take(registry->add_counter("fp8rl_generation_weight_delta_fallbacks_total",
                             "Deltas that could not be applied (no base, bad CRC); the full "
                             "version was fetched instead."),
       &m->weight_delta_fallbacks);
  take(registry->add_counter("fp8rl_generation_weight_delta_received_bytes_total",
                             "Delta payload bytes received from weight sync."),
       &m->weight_delta_received_bytes);
  take(registry->add_histogram("fp8rl_generation_weight_delta_decode_seconds",
                               "Time to rebuild one version from its delta and base.", {},
                               service::default_seconds_buckets()),
       &m->weight_delta_decode_seconds);
  take(registry->add_histogram("fp8rl_generation_weight_install_seconds",
                               "Time to install one verified version into a model (before it "
                               "waits for the batch boundary).",
                               {}, service::default_seconds_buckets()),
       &m->weight_install_seconds);
  take(registry->add_gauge("fp8rl_generation_weight_receive_buffer_bytes",
                           "Bytes mapped for the two weight receive buffers."),
       &m->weight_receive_buffer_bytes);
  take(registry->add_counter("fp8rl_generation_weight_stream_reconnects_total",
                             "Subscribe streams to weight sync opened again after one broke, "
                             "stalled or ended (counted when the next version is installed)."),
       &m->weight_stream_reconnects);
  if (!status.ok()) return status;
  // Labelled series exist from the start, so a scrape before the first request shows them.
  m->tokens->with({"prompt"});
  m->tokens->with({"generated"});
  m->requests->with({"ok"});
  m->requests->with({"error"});
  m->requests->with({"cancelled"});
  m->weight_installs->with({"in_place"});
  m->weight_installs->with({"rebuilt"});
  return m;
}

void WeightPathRecorder::record(const WeightPathCounts& now) {
  std::lock_guard lock(mu_);
  // Growth of a running total since the last record (0 when it shrank: a new baseline).
  auto grown = [](auto current, auto previous) {
    return current > previous ? static_cast<double>(current - previous) : 0.0;
  };
  const int64_t rebuilt = now.installs - now.in_place_installs;
  const int64_t last_rebuilt = last_.installs - last_.in_place_installs;
  metrics_->weight_installs->with({"in_place"})
      .inc(grown(now.in_place_installs, last_.in_place_installs));
  metrics_->weight_installs->with({"rebuilt"}).inc(grown(rebuilt, last_rebuilt));
  const double new_deltas = grown(now.delta_versions, last_.delta_versions);
  metrics_->weight_delta_versions->get().inc(new_deltas);
  metrics_->weight_delta_fallbacks->get().inc(grown(now.delta_fallbacks, last_.delta_fallbacks));
  metrics_->weight_delta_received_bytes->get().inc(grown(now.delta_bytes, last_.delta_bytes));
  // The subscriber keeps only the newest delta's time; a record follows every delta version's
  // install, so at most one is new here.
  for (int i = 0; i < static_cast<int>(new_deltas); ++i) {
    metrics_->weight_delta_decode_seconds->get().observe(now.last_delta_seconds);
  }
  metrics_->weight_stream_reconnects->get().inc(
      grown(now.stream_reconnects, last_.stream_reconnects));
  metrics_->weight_receive_buffer_bytes->get().set(static_cast<double>(now.receive_buffer_bytes));
  last_ = now;
}

}  // namespace fp8rl::generation
