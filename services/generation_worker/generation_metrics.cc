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
  if (!status.ok()) return status;
  // Labelled series exist from the start, so a scrape before the first request shows them.
  m->tokens->with({"prompt"});
  m->tokens->with({"generated"});
  m->requests->with({"ok"});
  m->requests->with({"error"});
  m->requests->with({"cancelled"});
  return m;
}

}  // namespace fp8rl::generation
