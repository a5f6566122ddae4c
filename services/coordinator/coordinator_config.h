// Command-line and YAML configuration of fp8rl-coordinator, one typed flag table
// (common/flags.h): the common service options (common/service/options.h: --grpc-port,
// --http-port, --data-dir, ...) plus the job store, the worker and loop timeouts, the path roots
// of submitted jobs, the job API's token file and its back-pressure limits.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/options.h"
#include "services/coordinator/admission.h"

namespace fp8rl::coordinator {

inline constexpr int kDefaultGrpcPort = 50051;
inline constexpr int kDefaultHttpPort = 8080;

struct CoordinatorConfig {
  service::ServiceOptions service;  // common flags; --http-port serves REST, console, /metrics
  std::string job_store;            // --job-store: SQLite file; empty: <data-dir>/jobs.db
  std::chrono::milliseconds heartbeat_interval{1000};  // --heartbeat-interval-ms
  std::chrono::milliseconds worker_expiry{5000};       // --worker-expiry-ms
  std::chrono::seconds generate_deadline{120};         // --generate-deadline-seconds
  std::chrono::seconds worker_wait{120};               // --worker-wait-seconds
  std::chrono::seconds trainer_timeout{3600};          // --trainer-timeout-seconds
  // --trainer-resume-seconds: after losing the trainer, resume the job from its last checkpoint
  // when a trainer is back within this time; 0 fails the job at once.
  std::chrono::seconds trainer_resume{120};
  // --store-retry-seconds: a running job's write the job store refuses (a metrics row, its state)
  // is retried this long before the job fails naming it (store_retry.h).
  std::chrono::seconds store_retry{10};
  // --sync-wait-seconds: how long every live generation worker gets to load a new version before
  // the loop goes on (laggards refuse work); none holding it makes it resume.
  std::chrono::seconds sync_wait{60};
  // --data-root, --models-root, --datasets-root: folders the paths of submitted job configs must
  // lie in (rl/job_paths.h). Empty: the working directory.
  std::string data_root;
  std::string models_root;
  std::string datasets_root;
  // --auth-token-file: bearer tokens the job API (REST /v1/*, gRPC JobService) requires, one per
  // line (common/service/auth.h); reloaded on SIGHUP. Empty: the API is open.
  std::string auth_token_file;
  // --max-inflight-requests, --max-queued-jobs, --retry-after-ms, --max-job-tokens (admission.h).
  AdmissionLimits limits;
  // One line per deprecated flag name used ("--metrics-port is deprecated; use --http-port").
  std::vector<std::string> warnings;
};

// Parses the arguments after the program name (--config FILE first, flags override). Errors name
// the flag as given: "--worker-expiry-ms: must be in [1, 3600000], got 0".
absl::StatusOr<CoordinatorConfig> parse_coordinator_config(const std::vector<std::string>& args);

// The --help text, generated from the flag table.
std::string coordinator_usage();

}  // namespace fp8rl::coordinator
