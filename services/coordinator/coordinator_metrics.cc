// Registration and updates of the coordinator's metric families (see coordinator_metrics.h;
// names, labels and meanings are the contract in docs/metrics.md).
#include "services/coordinator/coordinator_metrics.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> CoordinatorMetrics::create(
    service::MetricsRegistry* registry, rl::StepMetricSchema schema) {
  auto m = std::make_unique<CoordinatorMetrics>();
#define FP8RL_ASSIGN(field, expr)             \
  {                                           \
    auto result = (expr);                     \
    if (!result.ok()) return result.status(); \
    field = *result;                          \
  }
  if (absl::Status s = service::register_process_metrics(registry, "coordinator"); !s.ok()) {
    return s;
  }

  FP8RL_ASSIGN(m->jobs, registry->add_gauge("fp8rl_coordinator_jobs", "Jobs in the store by state.",
                                            {"state"}));
  FP8RL_ASSIGN(m->job_resumes,
               registry->add_counter("fp8rl_coordinator_job_resumes_total",
                                     "Jobs resumed from their last checkpoint (after a coordinator "
                                     "restart, or a lost trainer or weight version)."));
  FP8RL_ASSIGN(m->jobs_submitted, registry->add_counter("fp8rl_coordinator_jobs_submitted_total",
                                                        "Jobs accepted (REST and gRPC)."));
  FP8RL_ASSIGN(m->requests_rejected,
               registry->add_counter("fp8rl_coordinator_requests_rejected_total",
                                     "Job API requests rejected as invalid (HTTP 400 / "
                                     "INVALID_ARGUMENT), by API (rest, grpc).",
                                     {"api"}));
  FP8RL_ASSIGN(m->requests_refused,
               registry->add_counter("fp8rl_coordinator_requests_refused_total",
                                     "Job API requests refused by a configured limit, by reason "
                                     "(inflight, queue_full: HTTP 429 / RESOURCE_EXHAUSTED; "
                                     "token_quota: HTTP 400 / INVALID_ARGUMENT).",
                                     {"reason"}));
  FP8RL_ASSIGN(m->store_write_failures,
               registry->add_counter("fp8rl_coordinator_store_write_failures_total",
                                     "Writes of a running job's records that the job store "
                                     "refused (full or read-only disk, I/O error, lock), each "
                                     "try counted, by record (metrics_row, step, checkpoint, "
                                     "state).",
                                     {"write"}));
  FP8RL_ASSIGN(m->trainer_groups_reformed,
               registry->add_counter("fp8rl_coordinator_trainer_groups_reformed_total",
                                     "Trainer groups (trainer.data_parallel > 1) formed again to "
                                     "resume a job, after a rank was lost or a restart."));
  FP8RL_ASSIGN(m->checkpoint_fallbacks,
               registry->add_counter("fp8rl_coordinator_checkpoint_fallbacks_total",
                                     "Resumes whose checkpoint the trainer could not read, so "
                                     "the job went back to the checkpoint before it (or the "
                                     "start)."));
  FP8RL_ASSIGN(
      m->live_workers,
      registry->add_gauge("fp8rl_coordinator_live_workers",
                          "Registered workers with a fresh heartbeat, by kind.", {"kind"}));
  FP8RL_ASSIGN(m->workers_expired,
               registry->add_counter("fp8rl_coordinator_workers_expired_total",
                                     "Workers dropped from the registry because they sent no "
                                     "heartbeat within --worker-expiry-ms (killed, hung or cut "
                                     "off), by kind.",
                                     {"kind"}));
  FP8RL_ASSIGN(m->sync_lagging_workers,
               registry->add_counter("fp8rl_coordinator_sync_lagging_workers_total",
                                     "Live generation workers that did not hold a newly "
                                     "published weight version 5 s after the publish (weight "
                                     "sync cut off from them, or slow), counted once per "
                                     "version and worker."));
  FP8RL_ASSIGN(m->step, registry->add_gauge("fp8rl_rl_step",
                                            "RL steps completed by the running job (0 before "
                                            "the first update)."));
  FP8RL_ASSIGN(m->steps,
               registry->add_counter("fp8rl_rl_steps_total", "RL steps completed (all jobs)."));
  FP8RL_ASSIGN(m->reward_mean, registry->add_gauge("fp8rl_rl_reward_mean",
                                                   "Mean reward of the last RL step's samples."));
  FP8RL_ASSIGN(m->validation_accuracy,
               registry->add_gauge("fp8rl_rl_validation_accuracy",
                                   "Exact-match accuracy of the last validation, in [0, 1]."));
  FP8RL_ASSIGN(
      m->step_phase_seconds,
      registry->add_gauge("fp8rl_rl_step_phase_seconds",
                          "Time of each phase in the last RL step (0: not run).", {"phase"}));
  FP8RL_ASSIGN(m->phase_seconds_total,
               registry->add_counter("fp8rl_rl_phase_seconds_total",
                                     "Total time spent in each RL phase.", {"phase"}));
  FP8RL_ASSIGN(m->phase_seconds,
               registry->add_histogram("fp8rl_coordinator_phase_seconds",
                                       "Distribution of the time of each RL phase.", {"phase"},
                                       service::default_seconds_buckets()));
  FP8RL_ASSIGN(m->samples, registry->add_counter("fp8rl_rl_samples_total",
                                                 "Samples generated and scored (all jobs)."));
  FP8RL_ASSIGN(m->redispatched_requests,
               registry->add_counter("fp8rl_rl_redispatched_requests_total",
                                     "Generation calls that failed or timed out; their "
                                     "unfinished samples were re-sent."));
  FP8RL_ASSIGN(m->redispatched_samples,
               registry->add_counter("fp8rl_coordinator_redispatched_samples_total",
                                     "Samples re-dispatched after a worker failed or timed out."));
  FP8RL_ASSIGN(m->weight_version,
               registry->add_gauge("fp8rl_coordinator_weight_version",
                                   "Latest policy version published by the trainer."));
  for (const rl::StepMetricDef& def : schema) {
    if (!def.coordinator_gauge) continue;
    service::GaugeFamily* family = nullptr;
    FP8RL_ASSIGN(family, registry->add_gauge(absl::StrCat("fp8rl_rl_", std::string(def.name)),
                                             absl::StrCat("Last RL step's ", std::string(def.name),
                                                          " (docs/design/mismatch.md), from the "
                                                          "trainer.")));
    m->step_metrics.emplace(std::string(def.name), family);
  }
  FP8RL_ASSIGN(m->sample_staleness,
               registry->add_histogram("fp8rl_rl_sample_staleness",
                                       "Weight versions between a trained sample's generating "
                                       "version and the trained one (asynchronous RL).",
                                       {}, {0, 1, 2, 3, 4, 8, 16}));
  FP8RL_ASSIGN(m->stale_regenerated_samples,
               registry->add_counter("fp8rl_rl_stale_regenerated_samples_total",
                                     "Samples older than algorithm.max_staleness, generated again "
                                     "(asynchronous RL)."));
  FP8RL_ASSIGN(m->trainer_idle_seconds,
               registry->add_counter("fp8rl_rl_trainer_idle_seconds_total",
                                     "Time the RL loop waited for a step's rollout before "
                                     "training it (asynchronous RL)."));
  FP8RL_ASSIGN(m->generation_idle_seconds,
               registry->add_counter("fp8rl_rl_generation_idle_seconds_total",
                                     "Time the rollout producer waited for a weight version it "
                                     "may generate with (asynchronous RL)."));
#undef FP8RL_ASSIGN
  // Labelled series exist from the start, so a scrape before the first job shows them at 0.
  m->requests_rejected->with({"rest"});
  m->requests_rejected->with({"grpc"});
  for (const char* reason : {"inflight", "queue_full", "token_quota"}) {
    m->requests_refused->with({reason});
  }
  for (std::string_view phase : kRlPhases) {
    m->step_phase_seconds->with({std::string(phase)});
    m->phase_seconds_total->with({std::string(phase)});
  }
  return m;
}

void CoordinatorMetrics::record_phases(const std::map<std::string, double>& row) {
  for (std::string_view name : kRlPhases) {
    const std::string phase(name);
    auto it = row.find(absl::StrCat("time_", phase, "_seconds"));
    if (it == row.end()) {
      step_phase_seconds->with({phase}).set(0.0);
      continue;
    }
    step_phase_seconds->with({phase}).set(it->second);
    phase_seconds_total->with({phase}).inc(it->second);
    phase_seconds->with({phase}).observe(it->second);
  }
}

void CoordinatorMetrics::record_step_metrics(const std::map<std::string, double>& values) {
  for (const auto& [name, family] : step_metrics) {
    if (auto it = values.find(name); it != values.end()) family->get().set(it->second);
  }
}

void CoordinatorMetrics::record_staleness(const rl::StepMetrics::Async& step) {
  for (const auto& [staleness, n] : step.staleness_histogram) {
    for (int64_t i = 0; i < n; ++i) sample_staleness->get().observe(static_cast<double>(staleness));
  }
  stale_regenerated_samples->get().inc(static_cast<double>(step.regenerated_samples));
  trainer_idle_seconds->get().inc(step.trainer_idle_seconds);
  generation_idle_seconds->get().inc(step.generation_idle_seconds);
}

void CoordinatorMetrics::count_rejected(std::string_view api) {
  requests_rejected->with({std::string(api)}).inc();
}

}  // namespace fp8rl::coordinator
