// Flag and YAML parsing for fp8rl-coordinator (see coordinator_config.h).
#include "services/coordinator/coordinator_config.h"

#include <limits>

#include "common/flags.h"

namespace fp8rl::coordinator {
namespace {

constexpr int64_t kHourMs = 3600 * 1000;
constexpr int64_t kWeekSeconds = 7 * 24 * 3600;

// The flag table of fp8rl-coordinator bound to `config` (whose values are the defaults).
void add_flags(flags::FlagTable& table, CoordinatorConfig* c) {
  using flags::DurationUnit;
  service::add_service_flags(table, &c->service);
  table
      .add_string("job-store", &c->job_store, "SQLite file of the jobs (empty: <data-dir>/jobs.db)",
                  /*allow_empty=*/true)
      .add_duration("heartbeat-interval-ms", &c->heartbeat_interval, DurationUnit::kMilliseconds, 1,
                    kHourMs, "heartbeat interval the workers are told to keep")
      .add_duration("worker-expiry-ms", &c->worker_expiry, DurationUnit::kMilliseconds, 1, kHourMs,
                    "a worker silent this long is dropped from the registry")
      .add_duration("generate-deadline-seconds", &c->generate_deadline, DurationUnit::kSeconds, 1,
                    kWeekSeconds, "deadline of one Generate call")
      .add_duration("worker-wait-seconds", &c->worker_wait, DurationUnit::kSeconds, 1, kWeekSeconds,
                    "how long a job waits for its workers")
      .add_duration("trainer-timeout-seconds", &c->trainer_timeout, DurationUnit::kSeconds, 1,
                    kWeekSeconds, "deadline of one call to the trainer")
      .add_duration("trainer-resume-seconds", &c->trainer_resume, DurationUnit::kSeconds, 0,
                    kWeekSeconds,
                    "after losing the trainer, resume from the last checkpoint when one is back "
                    "within this time (0: fail the job)")
      .add_duration("store-retry-seconds", &c->store_retry, DurationUnit::kSeconds, 0, 24 * 3600,
                    "a running job's write the job store refuses (full or read-only disk) is "
                    "retried this long before the job fails naming it")
      .add_duration("sync-wait-seconds", &c->sync_wait, DurationUnit::kSeconds, 1, 24 * 3600,
                    "how long the live generation workers get to load a new version")
      .add_string("data-root", &c->data_root,
                  "checkpoint.dir of submitted jobs must lie here (empty: working directory)", true)
      .add_string("models-root", &c->models_root,
                  "model paths of submitted jobs must lie here (empty: working directory)", true)
      .add_string("datasets-root", &c->datasets_root,
                  "task.params.*_path of submitted jobs must lie here (empty: working directory)",
                  true)
      .add_string("auth-token-file", &c->auth_token_file,
                  "bearer tokens the job API requires, one per line (empty: open)", true)
      .add_int("max-inflight-requests", &c->limits.max_inflight_requests, 0, int64_t{1} << 20,
               "job API calls served at once; more are answered 429 (0: no limit)")
      .add_int("max-queued-jobs", &c->limits.max_queued_jobs, 0, int64_t{1} << 30,
               "QUEUED jobs; more submissions are answered 429 (0: no limit)")
      .add_duration("retry-after-ms", &c->limits.retry_after, DurationUnit::kMilliseconds, 1,
                    kHourMs, "the wait a refused client is told to take")
      .add_int("max-job-tokens", &c->limits.max_job_tokens, 0, std::numeric_limits<int64_t>::max(),
               "cap on the tokens a job's rollouts may generate (0: no cap)");
}

CoordinatorConfig defaults() {
  CoordinatorConfig config;
  config.service.name = "coordinator";
  config.service.grpc_port = kDefaultGrpcPort;
  config.service.http_port = kDefaultHttpPort;
  config.service.data_dir = "/tmp/fp8rl/coordinator";
  return config;
}

}  // namespace

absl::StatusOr<CoordinatorConfig> parse_coordinator_config(const std::vector<std::string>& args) {
  CoordinatorConfig config = defaults();
  flags::FlagTable table("fp8rl-coordinator");
  add_flags(table, &config);
  absl::StatusOr<flags::ParseResult> parsed = table.parse(args);
  if (!parsed.ok()) return parsed.status();
  config.warnings = parsed->warnings;
  return config;
}

std::string coordinator_usage() {
  CoordinatorConfig config = defaults();
  flags::FlagTable table("fp8rl-coordinator");
  add_flags(table, &config);
  return table.usage();
}

}  // namespace fp8rl::coordinator
