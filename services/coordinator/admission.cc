// Job API back-pressure and per-job token caps (see admission.h).
#include "services/coordinator/admission.h"

#include <limits>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/service/log.h"
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {
namespace {

constexpr char kLog[] = "admission";
// The absl::Status payload that carries a retry hint in milliseconds, as decimal text.
constexpr char kRetryAfterPayload[] = "type.fp8rl.dev/retry-after-ms";

// a * b, or INT64_MAX when it would not fit (both >= 0).
int64_t saturating_mul(int64_t a, int64_t b) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) {
    return std::numeric_limits<int64_t>::max();
  }
  return a * b;
}

}  // namespace

int64_t rollout_token_bound(const rl::JobConfig& config) {
  const rl::AlgorithmConfig& a = config.algorithm;
  return saturating_mul(
      saturating_mul(saturating_mul(a.steps, a.prompts_per_step), a.samples_per_prompt),
      a.max_new_tokens);
}

absl::Status check_token_cap(const rl::JobConfig& config, int64_t cap) {
  const int64_t bound = rollout_token_bound(config);
  if (cap <= 0 || bound <= cap) return absl::OkStatus();
  const rl::AlgorithmConfig& a = config.algorithm;
  return absl::InvalidArgumentError(absl::StrCat(
      "algorithm.steps x prompts_per_step x samples_per_prompt x max_new_tokens: the job's "
      "rollouts may generate ",
      a.steps, " x ", a.prompts_per_step, " x ", a.samples_per_prompt, " x ", a.max_new_tokens,
      " = ", bound, " tokens, over the per-job cap of ", cap, " (--max-job-tokens)"));
}

absl::Status overloaded_error(std::string_view message, std::chrono::milliseconds retry_after) {
  absl::Status status = absl::ResourceExhaustedError(std::string(message));
  status.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(retry_after.count())));
  return status;
}

std::optional<std::chrono::milliseconds> retry_after_of(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return std::nullopt;
  const auto payload = status.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(ms);
}

AdmissionControl::Ticket& AdmissionControl::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = other.owner_;
    other.owner_ = nullptr;
  }
  return *this;
}

void AdmissionControl::Ticket::release() {
  if (owner_ == nullptr) return;
  std::lock_guard<std::mutex> lock(owner_->mu_);
  --owner_->inflight_;
  owner_ = nullptr;
}

int64_t AdmissionControl::inflight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_;
}

absl::Status AdmissionControl::enter(std::string_view api, Ticket* ticket) {
  int64_t now_inflight = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (limits_.max_inflight_requests <= 0 || inflight_ < limits_.max_inflight_requests) {
      ++inflight_;
      *ticket = Ticket(this);
      return absl::OkStatus();
    }
    now_inflight = inflight_;
  }
  const std::string message =
      absl::StrCat("overloaded: ", now_inflight, " job API requests in progress (limit ",
                   limits_.max_inflight_requests, ", --max-inflight-requests); retry after ",
                   limits_.retry_after.count(), " ms");
  refused("inflight", absl::StrCat(std::string(api), ": ", message));
  return overloaded_error(message, limits_.retry_after);
}

absl::Status AdmissionControl::check_queue(int64_t queued) {
  if (limits_.max_queued_jobs <= 0 || queued < limits_.max_queued_jobs) return absl::OkStatus();
  const std::string message =
      absl::StrCat("overloaded: ", queued, " jobs queued (limit ", limits_.max_queued_jobs,
                   ", --max-queued-jobs); retry after ", limits_.retry_after.count(), " ms");
  refused("queue_full", message);
  return overloaded_error(message, limits_.retry_after);
}

absl::Status AdmissionControl::check_tokens(const rl::JobConfig& config) {
  absl::Status status = check_token_cap(config, limits_.max_job_tokens);
  if (!status.ok()) refused("token_quota", std::string(status.message()));
  return status;
}

void AdmissionControl::refused(std::string_view reason, std::string_view message) {
  if (metrics_ != nullptr) metrics_->requests_refused->with({std::string(reason)}).inc();
  int64_t left_out = 0;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    const auto now = std::chrono::steady_clock::now();
    auto it = refusal_log_.find(reason);
    if (it == refusal_log_.end()) {
      it = refusal_log_.emplace(std::string(reason), RefusalLog{}).first;
    } else if (now - it->second.last < kRefusalLogInterval) {
      ++it->second.left_out;
      return;
    }
    it->second.last = now;
    left_out = std::exchange(it->second.left_out, 0);
  }
  service::log_warn(kLog, "request refused",
                    {{"reason", std::string(reason)},
                     {"error", std::string(message)},
                     {"refusals_not_logged_since_last_line", absl::StrCat(left_out)}});
}

}  // namespace fp8rl::coordinator
