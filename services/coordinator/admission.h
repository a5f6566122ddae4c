// Back-pressure for the job API: a request beyond the configured concurrency, or a submission
// beyond the configured queue length, is refused at once with a retry hint (REST 429 with
// Retry-After, gRPC RESOURCE_EXHAUSTED with grpc-retry-pushback-ms) instead of waiting behind
// the others; a job whose rollouts may generate more tokens than the per-job cap is refused as
// invalid, naming the fields. docs/design/faults.md has the limits and why.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "rl/job_config.h"

namespace fp8rl::coordinator {

class CoordinatorMetrics;

struct AdmissionLimits {
  // Job API calls served at once, REST and unary gRPC together (WatchJob streams are checked on
  // arrival but not held); a call beyond it is refused. 0: no limit.
  int64_t max_inflight_requests = 16;
  // QUEUED jobs; a submission beyond it is refused. 0: no limit.
  int64_t max_queued_jobs = 256;
  // Per-job cap on the tokens its RL rollouts may generate (rollout_token_bound); 0: no cap.
  int64_t max_job_tokens = 0;
  // The wait a refused client is told to take before trying again.
  std::chrono::milliseconds retry_after = std::chrono::seconds(1);
};

// The most tokens a job's RL rollouts can generate: algorithm.steps x prompts_per_step x
// samples_per_prompt x max_new_tokens (validation and regenerated stale samples not counted).
// Saturates at INT64_MAX instead of overflowing.
int64_t rollout_token_bound(const rl::JobConfig& config);

// InvalidArgument naming the fields when the job's rollout_token_bound exceeds `cap` (> 0); OK
// otherwise and when cap <= 0.
absl::Status check_token_cap(const rl::JobConfig& config, int64_t cap);

// ResourceExhausted carrying a retry hint (read back with retry_after_of).
absl::Status overloaded_error(std::string_view message, std::chrono::milliseconds retry_after);
// The hint overloaded_error attached; nullopt for any other status.
std::optional<std::chrono::milliseconds> retry_after_of(const absl::Status& status);

// Counts the job API calls in progress and refuses those beyond the limits. Thread-safe.
class AdmissionControl {
 public:
  // `metrics` may be null (tests).
  explicit AdmissionControl(AdmissionLimits limits = {}, CoordinatorMetrics* metrics = nullptr)
      : limits_(limits), metrics_(metrics) {}
  AdmissionControl(const AdmissionControl&) = delete;
  AdmissionControl& operator=(const AdmissionControl&) = delete;

  // Holds one slot of max_inflight_requests while alive.
  class Ticket {
   public:
    Ticket() = default;
    explicit Ticket(AdmissionControl* owner) : owner_(owner) {}
    Ticket(Ticket&& other) noexcept : owner_(other.owner_) { other.owner_ = nullptr; }
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { release(); }
    void release();

   private:
    AdmissionControl* owner_ = nullptr;
  };

  // A slot for one call of `api` ("rest" or "grpc", for the log), or ResourceExhausted with a
  // retry hint (counted in fp8rl_coordinator_requests_refused_total{reason="inflight"}, logged).
  absl::Status enter(std::string_view api, Ticket* ticket);
  // OK while fewer than max_queued_jobs are queued; else ResourceExhausted with a retry hint
  // (reason "queue_full").
  absl::Status check_queue(int64_t queued);
  // OK when the job's rollout_token_bound is within max_job_tokens; else InvalidArgument naming
  // the fields (reason "token_quota").
  absl::Status check_tokens(const rl::JobConfig& config);

  const AdmissionLimits& limits() const { return limits_; }
  int64_t inflight() const;

 private:
  // Counts every refusal (fp8rl_coordinator_requests_refused_total{reason}) and logs at most one
  // line per reason per kRefusalLogInterval, with how many it left out since the last one: a
  // burst of clients that ignore Retry-After is refused thousands of times a second.
  void refused(std::string_view reason, std::string_view message);
  static constexpr std::chrono::seconds kRefusalLogInterval{1};
  struct RefusalLog {
    std::chrono::steady_clock::time_point last;
    int64_t left_out = 0;
  };
  const AdmissionLimits limits_;
  CoordinatorMetrics* const metrics_;
  mutable std::mutex mu_;
  int64_t inflight_ = 0;  // guarded by mu_
  std::mutex log_mu_;
  std::map<std::string, RefusalLog, std::less<>> refusal_log_;  // guarded by log_mu_
};

}  // namespace fp8rl::coordinator
