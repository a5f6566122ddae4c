// Registration of the weight-sync metrics (see weight_sync_metrics.h).
#include "services/weight_sync/weight_sync_metrics.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace fp8rl::weight_sync {

absl::StatusOr<std::unique_ptr<WeightSyncMetrics>> WeightSyncMetrics::create(
    service::MetricsRegistry* registry, const std::string& prefix, bool process_metrics) {
  auto m = std::make_unique<WeightSyncMetrics>();
  if (process_metrics) {
    FP8RL_RETURN_IF_ERROR(service::register_process_metrics(registry, "weight-sync"));
  }
  auto name = [&prefix](const char* suffix) { return absl::StrCat(prefix, suffix); };

  absl::Status status;
  // Keeps the first registration error; later calls are skipped once one failed.
  auto take = [&status](auto result, auto** field) {
    if (!status.ok()) return;
    if (!result.ok()) {
      status = result.status();
      return;
    }
    *field = *result;
  };
  take(registry->add_gauge(name("_latest_version"), "Newest complete weight version."),
       &m->latest_version);
  take(registry->add_counter(name("_uploads_total"), "Uploads received, by result.", {"result"}),
       &m->uploads);
  take(registry->add_counter(name("_received_bytes_total"),
                             "Payload bytes received from uploaders."),
       &m->received_bytes);
  take(registry->add_counter(name("_sent_bytes_total"), "Payload bytes streamed to workers."),
       &m->sent_bytes);
  take(registry->add_gauge(name("_subscribers"),
                           "Generation workers with an open Subscribe stream."),
       &m->subscribers);
  take(registry->add_gauge(name("_worker_version"), "Weight version each worker acknowledged.",
                           {"worker"}),
       &m->worker_version);
  take(registry->add_histogram(name("_push_seconds"),
                               "Time from a version's arrival to the last subscribed worker's ack.",
                               {}, service::default_seconds_buckets()),
       &m->push_seconds);
  take(registry->add_gauge(name("_version_bytes"), "Payload size of the latest version, by format.",
                           {"format"}),
       &m->version_bytes);
  take(registry->add_counter(name("_pushes_total"),
                             "Versions pushed to workers, by kind (full, delta or same_host).",
                             {"kind"}),
       &m->pushes);
  take(registry->add_counter(name("_pushed_bytes_total"),
                             "Payload bytes of the versions pushed to workers, by kind.", {"kind"}),
       &m->pushed_bytes);
  take(registry->add_gauge(name("_version_wire_bytes"),
                           "Bytes on the wire for the latest version: full payload, or its delta "
                           "against the previous version a worker held.",
                           {"kind"}),
       &m->version_wire_bytes);
  take(registry->add_gauge(name("_delta_compression_ratio"),
                           "Full bytes / delta bytes of the latest version's delta."),
       &m->delta_compression_ratio);
  take(registry->add_histogram(name("_delta_encode_seconds"),
                               "Time to encode one delta (XOR with the base, zstd).", {},
                               service::default_seconds_buckets()),
       &m->delta_encode_seconds);
  take(registry->add_gauge(name("_push_cost_seconds"),
                           "Seconds from the start of the last push of each kind to the worker's "
                           "ack, scaled to the latest version's full size; the cheaper kind is "
                           "pushed.",
                           {"kind"}),
       &m->push_cost_seconds);
  take(registry->add_counter(name("_push_probes_total"),
                             "Pushes of the kind that was not the cheaper one by the measurements, "
                             "sent to measure it (first delta, periodic re-probe).",
                             {"kind"}),
       &m->push_probes);
  if (!status.ok()) return status;
  // Both results exist from the start, so a scrape before the first upload shows them.
  m->uploads->with({"accepted"});
  m->uploads->with({"rejected"});
  for (const char* kind : {"full", "delta"}) {
    m->pushes->with({kind});
    m->pushed_bytes->with({kind});
    m->version_wire_bytes->with({kind});
    m->push_cost_seconds->with({kind});
    m->push_probes->with({kind});
  }
  m->delta_compression_ratio->get();
  m->subscribers->get();
  m->latest_version->get();
  return m;
}

}  // namespace fp8rl::weight_sync
