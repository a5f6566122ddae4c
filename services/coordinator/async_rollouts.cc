// The rollout producer of asynchronous RL (see async_rollouts.h).
#include "services/coordinator/async_rollouts.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rl/staleness.h"

namespace fp8rl::coordinator {

RolloutQueue::RolloutQueue(Options options, Produce produce)
    : options_(options), produce_(std::move(produce)) {
  published_[options_.first_step - 1] = options_.first_version;
}

RolloutQueue::~RolloutQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RolloutQueue::start() {
  thread_ = std::thread([this] { run(); });
}

void RolloutQueue::published(int64_t step, int64_t version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    published_[step] = version;
  }
  cv_.notify_all();
}

std::optional<int64_t> RolloutQueue::gate_version_locked(int64_t step) const {
  // Steps before the run's first step generate with its first version.
  const int64_t gate =
      std::max(rl::staleness_gate_step(step, options_.max_staleness), options_.first_step - 1);
  auto it = published_.find(gate);
  if (it == published_.end()) return std::nullopt;
  return it->second;
}

void RolloutQueue::run() {
  using Clock = std::chrono::steady_clock;
  const size_t capacity = static_cast<size_t>(options_.max_staleness);
  for (int64_t step = options_.first_step; step <= options_.last_step; ++step) {
    int64_t min_version = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait_start = Clock::now();
      // The gate alone keeps ready_ within capacity; the size check states the bound.
      cv_.wait(lock, [&] {
        return stopping_ || (gate_version_locked(step).has_value() && ready_.size() < capacity);
      });
      idle_seconds_ += std::chrono::duration<double>(Clock::now() - wait_start).count();
      if (stopping_) break;
      min_version = *gate_version_locked(step);
    }
    absl::StatusOr<StepRollout> rollout = produce_(step, min_version);
    std::lock_guard<std::mutex> lock(mu_);
    if (!rollout.ok()) {
      error_ = rollout.status();
      break;
    }
    ready_.push_back(*std::move(rollout));
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  producer_done_ = true;
  cv_.notify_all();
}

absl::StatusOr<StepRollout> RolloutQueue::take(
    int64_t step, const std::function<absl::Status()>& check_cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!ready_.empty()) {
      StepRollout out = std::move(ready_.front());
      ready_.pop_front();
      cv_.notify_all();  // room in the queue
      if (out.step != step) {
        return absl::InternalError(
            absl::StrCat("async rollouts: expected step ", step, ", the queue had ", out.step));
      }
      return out;
    }
    if (!error_.ok()) return error_;
    if (producer_done_) {
      return absl::InternalError(
          absl::StrCat("async rollouts: the producer ended before step ", step));
    }
    lock.unlock();
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    lock.lock();
    cv_.wait_for(lock, options_.poll_interval);
  }
}

double RolloutQueue::take_generation_idle_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(idle_seconds_, 0.0);
}

size_t RolloutQueue::ready_size() {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_.size();
}

}  // namespace fp8rl::coordinator
