// The CLI's side of the coordinator's gRPC JobService: a small client (submit, get, list, cancel,
// watch, metrics) whose errors read well on a terminal, job-config preparation (validate locally,
// resolve relative paths) and the text views shared by `fp8rl run/submit/status/list/watch`:
// progress lines and the end-of-job summary. In the CLI only with FP8RL_HAVE_SERVICES (it needs
// the generated JobService stubs).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/service/security.h"
#include "fp8rl/v1/job_service.grpc.pb.h"
#include "tools/fp8rl/args.h"

namespace fp8rl::cli {

inline constexpr char kDefaultCoordinator[] = "localhost:50051";

// The flags every command that talks to the coordinator takes besides --coordinator.
inline constexpr const char* kSecurityFlags[] = {"token-file", "tls-ca", "tls-cert", "tls-key"};

// What the CLI sends: the token of --token-file, else $FP8RL_TOKEN (none when neither); TLS when
// --tls-ca/--tls-cert/--tls-key or $FP8RL_TLS_CA/$FP8RL_TLS_CERT/$FP8RL_TLS_KEY are set (CA to
// verify the coordinator; cert+key when it requires client certificates). `args` null: only the
// environment. Errors name the flag or variable.
absl::StatusOr<service::ClientSecurity> cli_security(const Args* args);

// How JobClient retries a call the coordinator refused for load (RESOURCE_EXHAUSTED, its answer
// beyond --max-inflight-requests or --max-queued-jobs) or could not take (UNAVAILABLE): after a
// jittered, exponentially growing wait that is never shorter than the server's hint
// (grpc-retry-pushback-ms), until a try limit or the time budget is reached. SubmitJob is not
// retried on UNAVAILABLE: the API has no request id, so a submission the coordinator stored
// before the connection broke would run twice.
struct RetryPolicy {
  int max_tries = 8;              // RESOURCE_EXHAUSTED: tries in all, the first included
  int max_unavailable_tries = 3;  // UNAVAILABLE (every call but SubmitJob)
  std::chrono::milliseconds initial_backoff{250};
  std::chrono::milliseconds max_backoff{8000};
  std::chrono::milliseconds budget{60'000};  // no retry starts after this much time in the call
};

// The wait before retry number `retry` (1 = the second try): uniform in [b/2, b] with
// b = min(initial_backoff * 2^(retry-1), max_backoff), drawn by `u` in [0, 1), and at least
// `hint` (the server's push-back) when given.
std::chrono::milliseconds retry_delay(const RetryPolicy& policy, int retry,
                                      std::optional<std::chrono::milliseconds> hint, double u);

class JobClient {
 public:
  // Connects to "host:port" and waits up to `timeout` for the channel to be ready. Unavailable
  // "cannot reach the coordinator at ADDR (...)" when nothing answers.
  // `security`: the bearer token and TLS settings sent (cli_security()); plain by default.
  static absl::StatusOr<std::unique_ptr<JobClient>> connect(
      const std::string& address, std::chrono::milliseconds timeout = std::chrono::seconds(5),
      const service::ClientSecurity& security = {});

  const std::string& address() const { return address_; }
  void set_retry_policy(const RetryPolicy& policy) { retry_ = policy; }

  // `config` is YAML or JSON. INVALID_ARGUMENT keeps the server's message (it names the field).
  absl::StatusOr<v1::Job> submit(const std::string& config);
  absl::StatusOr<v1::Job> get(const std::string& id);
  absl::StatusOr<std::vector<v1::Job>> list(v1::JobState state = v1::JOB_STATE_UNSPECIFIED,
                                            int limit = 0);
  absl::StatusOr<v1::Job> cancel(const std::string& id);
  absl::StatusOr<std::vector<v1::StepMetrics>> metrics(const std::string& id);
  // The faults the coordinator handled for the job (GetJobEvents), in the order recorded.
  absl::StatusOr<std::vector<v1::JobFaultEvent>> events(const std::string& id);
  // Streams WatchJob: `on_event` gets the current job, then every change; returns when the job
  // reaches a terminal state (OK), when `on_event` returns false (OK), when stop_watch() is
  // called (Cancelled) or on an RPC error. A stream refused for load (RESOURCE_EXHAUSTED) or
  // broken (UNAVAILABLE, or ended by the server before the job ended) is opened again under the
  // retry policy, with the tries and the budget counted from the last event received; the new
  // stream starts with the job as it is then, so `on_event` may see one state twice.
  absl::Status watch(const std::string& id, const std::function<bool(const v1::Job&)>& on_event);
  // Ends a watch() running on another thread. Safe to call at any time.
  void stop_watch();

 private:
  JobClient(std::string address, std::shared_ptr<grpc::Channel> channel);
  absl::Status to_status(const grpc::Status& status, const std::string& what) const;
  // Runs `call` (a unary RPC on the fresh context it is given) under retry_, printing one line
  // to stderr per retry; the last status gets "; gave up after N tries in S s" when retries ran
  // out. `idempotent`: UNAVAILABLE is retried too.
  grpc::Status with_retries(const char* what, bool idempotent,
                            const std::function<grpc::Status(grpc::ClientContext&)>& call);
  RetryPolicy retry_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  // std::mutex, not absl::Mutex: visible to ThreadSanitizer (Debian's Abseil is not built with it).
  std::mutex watch_mu_;  // guards the two members below
  // The running watch()'s stream, for stop_watch() (from a signal-watching thread) to cancel.
  grpc::ClientContext* watch_context_ = nullptr;
  bool watch_stopped_ = false;
};

// Prints a job's progress: one line per recorded metrics row (row 0 included), each once, and
// before row 0 / while the trainer is lost, a line per phase change (SFT: every tenth of its
// steps, see format_progress_line). update() fetches the metrics only when the job's step,
// latest row or state changed.
class ProgressPrinter {
 public:
  ProgressPrinter(JobClient* client, std::FILE* out) : client_(client), out_(out) {}
  absl::Status update(const v1::Job& job);
  // Fetches and prints whatever is left (call once the job ended); keeps the rows for a summary.
  absl::Status finish(const std::string& job_id, int64_t total_steps);
  const std::vector<v1::StepMetrics>& rows() const { return rows_; }

 private:
  absl::Status fetch_and_print(const std::string& job_id, int64_t total_steps);
  JobClient* client_;
  std::FILE* out_;
  void print_progress(const v1::JobProgress& progress);
  std::vector<v1::StepMetrics> rows_;
  int64_t printed_through_ = -1;
  std::string last_key_;
  std::string last_phase_;
  int64_t last_sft_printed_ = -1;
};

// Reads a job config file, validates it (errors start with the path and name the field), makes
// relative paths absolute and returns it as JSON text for SubmitJob. Relative input paths
// (model.checkpoint, model.init.config, task.params.train_path/val_path) are looked up in
// `working_dir` first, then in the config file's folder; checkpoint.dir (an output) is resolved
// against `working_dir`.
absl::StatusOr<std::string> prepare_job_config(const std::string& path,
                                               const std::string& working_dir);

std::string job_state_name(v1::JobState state);  // "RUNNING"
bool is_terminal(v1::JobState state);
// Parses "running", "RUNNING" or "JOB_STATE_RUNNING" (for `fp8rl list --state`).
absl::StatusOr<v1::JobState> parse_job_state(const std::string& text);

// `fp8rl status ID`: several lines (id, state, step, error, latest metrics).
std::string format_job_details(const v1::Job& job);
// "events:" and one line per event ("  <time>  <kind>: <message>"); "" when there are none.
std::string format_job_events(const std::vector<v1::JobFaultEvent>& events);
// `fp8rl list`: a header line and one row per job.
std::string format_job_table(const std::vector<v1::Job>& jobs);
// One line for a job's current phase, or "" for phases the step lines already show ("rl"):
// "sft   12/120  loss 2.3412", "waiting for a trainer", "trainer lost: <why>", ...
std::string format_progress_line(const v1::JobProgress& progress);
// One progress line per recorded step: step/total, reward, validation accuracy when evaluated,
// token_mult_prob_error, sampling_importance_ratio and the seconds of each phase.
std::string format_step_line(const v1::StepMetrics& row, int64_t total_steps);
// The end-of-job summary: final state, accuracy before and after RL and the best, mean mismatch
// metrics over the RL steps, the time split by phase and the total.
std::string format_summary(const v1::Job& job, const std::vector<v1::StepMetrics>& rows,
                           double wall_seconds);

}  // namespace fp8rl::cli
