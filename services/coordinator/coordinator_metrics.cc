// Registration of the coordinator's metric families (see coordinator_metrics.h).
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> CoordinatorMetrics::create(
    service::MetricsRegistry* registry) {
  auto m = std::make_unique<CoordinatorMetrics>();
#define FP8RL_ASSIGN(field, expr)             \
  {                                           \
    auto result = (expr);                     \
    if (!result.ok()) return result.status(); \
    m->field = *result;                       \
  }
  FP8RL_ASSIGN(jobs, registry->add_gauge("fp8rl_coordinator_jobs", "Jobs in the store by state.",
                                         {"state"}));
  FP8RL_ASSIGN(job_step, registry->add_gauge("fp8rl_coordinator_job_step",
                                             "RL steps completed by the running job."));
  FP8RL_ASSIGN(reward_mean, registry->add_gauge("fp8rl_coordinator_reward_mean",
                                                "Mean reward of the latest RL step's samples."));
  FP8RL_ASSIGN(validation_accuracy,
               registry->add_gauge("fp8rl_coordinator_validation_accuracy",
                                   "Exact-match accuracy of the latest validation, in [0, 1]."));
  FP8RL_ASSIGN(live_workers,
               registry->add_gauge("fp8rl_coordinator_live_workers",
                                   "Registered workers with a recent heartbeat.", {"kind"}));
  FP8RL_ASSIGN(weight_version,
               registry->add_gauge("fp8rl_coordinator_weight_version",
                                   "Latest policy version published by the trainer."));
  FP8RL_ASSIGN(steps, registry->add_counter("fp8rl_coordinator_steps_total",
                                            "RL steps completed (all jobs)."));
  FP8RL_ASSIGN(samples, registry->add_counter("fp8rl_coordinator_samples_total",
                                              "Samples generated and scored (all jobs)."));
  FP8RL_ASSIGN(redispatched,
               registry->add_counter("fp8rl_coordinator_redispatched_samples_total",
                                     "Samples re-dispatched after a worker failed or timed out."));
  FP8RL_ASSIGN(phase_seconds,
               registry->add_histogram("fp8rl_coordinator_phase_seconds",
                                       "Wall time of each phase of an RL step.", {"phase"},
                                       service::default_seconds_buckets()));
#undef FP8RL_ASSIGN
  return m;
}

}  // namespace fp8rl::coordinator
