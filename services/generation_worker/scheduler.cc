// The scheduler thread of the generation worker: admission, batched steps, result hand-off and
// between-batch weight swaps (see scheduler.h).
#include "services/generation_worker/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fp8rl::generation {

using Clock = std::chrono::steady_clock;
using model::BackendGenerator, model::StepGenerator;

absl::Status validate_scheduler_options(const SchedulerOptions& o) {
  if (o.max_batch_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_tokens: must be >= 1, got ", o.max_batch_tokens));
  }
  if (o.kv_cache_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_tokens: must be >= 1, got ", o.kv_cache_tokens));
  }
  if (o.kv_block_size < 1 || o.kv_block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_block_size: must be in [1, 1024], got ", o.kv_block_size));
  }
  if (o.kv_cache_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_blocks: must be >= 0, got ", o.kv_cache_blocks));
  }
  if (kv_budget_blocks(o) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_tokens: must hold at least one block of kv_block_size ",
                     o.kv_block_size, " tokens, got ", o.kv_cache_tokens));
  }
  if (o.device == model::Device::kCuda && o.gpu_memory_budget_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_memory_budget_bytes: must be >= 1 on cuda, got ", o.gpu_memory_budget_bytes));
  }
  if (o.gpu_weight_slots != 1 && o.gpu_weight_slots != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_weight_slots: must be 1 or 2, got ", o.gpu_weight_slots));
  }
  if (o.max_queued_samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_samples: must be >= 1, got ", o.max_queued_samples));
  }
  if (o.batch_wait.count() < 0 || o.batch_wait > std::chrono::seconds(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_wait: must be in [0, 10000] ms, got ", o.batch_wait.count()));
  }
  return absl::OkStatus();
}

int64_t kv_budget_blocks(const SchedulerOptions& o) {
  if (o.kv_cache_blocks > 0) return o.kv_cache_blocks;
  return o.kv_block_size < 1 ? 0 : o.kv_cache_tokens / o.kv_block_size;
}

std::vector<SampleOutcome> GenerationRequest::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !ready_.empty() || remaining_ == 0 || !error_.ok(); });
  std::vector<SampleOutcome> out;
  out.swap(ready_);
  return out;
}

bool GenerationRequest::done() const {
  std::lock_guard lock(mu_);
  return !error_.ok() || (remaining_ == 0 && ready_.empty());
}

absl::Status GenerationRequest::status() const {
  std::lock_guard lock(mu_);
  return error_;
}

void GenerationRequest::deliver(SampleOutcome outcome) {
  std::lock_guard lock(mu_);
  if (!error_.ok() || remaining_ == 0) return;
  ready_.push_back(std::move(outcome));
  --remaining_;
  cv_.notify_all();
}

void GenerationRequest::fail(absl::Status error) {
  std::lock_guard lock(mu_);
  if (error_.ok()) error_ = std::move(error);
  cancelled_.store(true);
  cv_.notify_all();
}

void GenerationRequest::cancel() {
  std::lock_guard lock(mu_);
  if (error_.ok() && remaining_ > 0) error_ = absl::CancelledError("request cancelled");
  cancelled_.store(true);
  cv_.notify_all();
}

Scheduler::Scheduler(SchedulerOptions options, GenerationMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      kv_blocks_(options_.kv_block_size, kv_budget_blocks(options_)) {
  stats_.kv_blocks_total = kv_blocks_.total_blocks();
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

absl::StatusOr<std::shared_ptr<GenerationRequest>> Scheduler::submit(
    std::vector<SampleSpec> samples, int64_t min_weight_version) {
  std::lock_guard lock(mu_);
  if (stopping_) return absl::UnavailableError("worker shutting down");
  if (current_.model == nullptr) return absl::UnavailableError("no weights yet");
  if (min_weight_version > current_.version) {
    return absl::FailedPreconditionError(
        absl::StrCat("min_weight_version: worker holds version ", current_.version,
                     ", the request needs >= ", min_weight_version));
  }
  const int64_t queued = static_cast<int64_t>(queue_.size());
  if (queued + static_cast<int64_t>(samples.size()) > options_.max_queued_samples) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue full: ", queued, " samples waiting, ", samples.size(),
                     " more would exceed max_queued_samples ", options_.max_queued_samples));
  }
  // A sample that needs more blocks than the whole budget would wait forever: refuse it now.
  for (const SampleSpec& s : samples) {
    const int64_t tokens = static_cast<int64_t>(s.prompt.size()) + s.params.max_new_tokens;
    const int64_t blocks = kv_blocks_.blocks_for(tokens);
    if (blocks > kv_blocks_.total_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample '", s.sample_id, "': prompt (", s.prompt.size(), " tokens) + max_new_tokens (",
          s.params.max_new_tokens, ") needs ", blocks, " KV blocks of ", kv_blocks_.block_size(),
          " tokens; this worker's KV budget is ", kv_blocks_.total_blocks(), " blocks"));
    }
  }
  auto request = std::make_shared<GenerationRequest>(samples.size());
  const Clock::time_point now = Clock::now();
  for (SampleSpec& s : samples) queue_.push_back({request, std::move(s), now});
  stats_.queued_samples = static_cast<int64_t>(queue_.size());
  if (metrics_) metrics_->queue_depth->get().set(static_cast<double>(queue_.size()));
  cv_.notify_all();
  return request;
}

absl::Status Scheduler::install(LoadedWeights weights) {
  std::lock_guard install_lock(install_mu_);
  std::unique_lock lock(mu_);
  if (stopping_) return absl::UnavailableError("worker shutting down");
  if (weights.model == nullptr) return absl::InvalidArgumentError("weights: no model");
  if (weights.version <= current_.version) {
    return absl::FailedPreconditionError(absl::StrCat("weight version ", weights.version,
                                                      " is not newer than the held version ",
                                                      current_.version));
  }
  const int64_t version = weights.version;
  pending_ = std::move(weights);
  pending_prepared_ = false;
  cv_.notify_all();
  install_error_ = absl::OkStatus();
  swapped_cv_.wait(
      lock, [&] { return current_.version >= version || thread_done_ || !install_error_.ok(); });
  if (!install_error_.ok()) return install_error_;
  if (current_.version < version) {
    pending_.reset();
    return absl::UnavailableError(
        absl::StrCat("worker shut down before weight version ", version, " was swapped in"));
  }
  return absl::OkStatus();
}

void Scheduler::cancel(GenerationRequest& request) {
  request.cancel();
  std::lock_guard lock(mu_);
  // Queued samples go now, so the queue depth is right before the scheduler thread wakes; running
  // ones are taken out of the generator by that thread (it alone touches the generator).
  const size_t before = queue_.size();
  std::erase_if(queue_, [&](const Queued& q) { return q.request.get() == &request; });
  stats_.cancelled_samples += static_cast<int64_t>(before - queue_.size());
  stats_.queued_samples = static_cast<int64_t>(queue_.size());
  if (metrics_) metrics_->queue_depth->get().set(static_cast<double>(queue_.size()));
  cv_.notify_all();
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(mu_);
    const Clock::time_point deadline = Clock::now() + grace;
    if (!stopping_) {
      stopping_ = true;
      drain_deadline_ = deadline;
    } else {
      drain_deadline_ = std::min(drain_deadline_, deadline);
    }
    stats_.ready = false;
    cv_.notify_all();
  }
  std::lock_guard join_lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const model::Model> Scheduler::model() const {
  std::lock_guard lock(mu_);
  return current_.model;
}

Scheduler::Snapshot Scheduler::snapshot() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Scheduler::apply_pending_locked() {
  if (!pending_.has_value()) return;
  if (generator_ != nullptr && !generator_->idle()) return;
  LoadedWeights next = std::move(*pending_);
  pending_.reset();
  if (generator_ == nullptr || !generator_->set_model(next.model).ok()) {
    std::swap(current_, next);
    generator_.reset();
    absl::StatusOr<std::unique_ptr<StepGenerator>> made = make_generator_locked();
    if (!made.ok()) {
      // The version cannot be served here (e.g. the CUDA backend refused it): keep serving the
      // previous one, whose generator is gone, so make a new one for it.
      std::swap(current_, next);
      install_error_ = absl::Status(
          made.status().code(),
          absl::StrCat("weight version ", next.version, ": ", made.status().message()));
      if (current_.model != nullptr) {
        absl::StatusOr<std::unique_ptr<StepGenerator>> back = make_generator_locked();
        if (back.ok()) generator_ = std::move(*back);
      }
      swapped_cv_.notify_all();
      return;
    }
    generator_ = std::move(*made);
  } else {
    current_ = std::move(next);
  }
  stats_.weight_version = current_.version;
  stats_.weight_format = current_.format;
  stats_.swaps += 1;
  stats_.ready = !stopping_;
  if (metrics_) {
    metrics_->weight_version->get().set(static_cast<double>(current_.version));
    metrics_->weight_swaps->get().inc();
  }
  swapped_cv_.notify_all();
}

void Scheduler::drop_cancelled_locked() {
  const size_t before = queue_.size();
  std::erase_if(queue_, [](const Queued& q) { return q.request->cancelled(); });
  stats_.cancelled_samples += static_cast<int64_t>(before - queue_.size());
  if (generator_ == nullptr) return;
  for (auto it = running_.begin(); it != running_.end();) {
    if (!it->second.request->cancelled()) {
      ++it;
      continue;
    }
    // Every running_ entry is unfinished in the generator (finished ones are erased right after
    // the step that finished them), so cancel() only fails if the two went out of sync.
    absl::StatusOr<model::GenerationResult> partial = generator_->cancel(it->first);
    if (partial.ok()) {
      stats_.generated_tokens += partial->tokens.size();
      if (metrics_) {
        metrics_->tokens->with({"generated"}).inc(static_cast<double>(partial->tokens.size()));
      }
    }
    kv_blocks_.release(it->second.kv_blocks);
    stats_.cancelled_samples += 1;
    it = running_.erase(it);
  }
}

void Scheduler::admit_locked() {
  while (!queue_.empty()) {
    Queued& q = queue_.front();
    if (q.request->cancelled()) {
      queue_.pop_front();
      stats_.cancelled_samples += 1;
      continue;
    }
    const int64_t prompt_tokens = static_cast<int64_t>(q.spec.prompt.size());
    const int64_t blocks = kv_blocks_.blocks_for(prompt_tokens + q.spec.params.max_new_tokens);
    // submit() refused samples larger than the whole budget, so this one fits once the batch has
    // drained far enough.
    if (!kv_blocks_.try_reserve(blocks)) break;
    absl::StatusOr<int64_t> id = generator_->add(std::move(q.spec.prompt), q.spec.params, 0);
    if (!id.ok()) {
      kv_blocks_.release(blocks);
      q.request->fail(absl::Status(id.status().code(), absl::StrCat("sample '", q.spec.sample_id,
                                                                    "': ", id.status().message())));
      queue_.pop_front();
      continue;
    }
    running_[*id] = {q.request, std::move(q.spec.sample_id), current_.version, blocks};
    if (metrics_) metrics_->tokens->with({"prompt"}).inc(static_cast<double>(prompt_tokens));
    queue_.pop_front();
  }
}

void Scheduler::reset_generator_locked(const absl::Status& error) {
  for (auto& [id, r] : running_) {
    if (!r.request->cancelled()) r.request->fail(error);
  }
  running_.clear();
  kv_blocks_.release_all();
  generator_.reset();
  if (current_.model != nullptr) {
    absl::StatusOr<std::unique_ptr<StepGenerator>> made = make_generator_locked();
    if (made.ok()) generator_ = std::move(*made);
  }
}

absl::StatusOr<std::unique_ptr<StepGenerator>> Scheduler::make_generator_locked() {
  model::BackendOptions bo;
  if (options_.device != model::Device::kCuda) {
    // The CPU backend's pool holds the scheduler's budget exactly (kv_budget_blocks blocks): its
    // host memory grows to the most blocks held at once, up to kv_blocks_total x kv_block_bytes.
    bo.kv_block_tokens = options_.kv_block_size;
    bo.max_step_tokens = options_.max_batch_tokens;
    bo.memory_budget_bytes =
        kv_budget_blocks(options_) * model::kv_block_bytes(current_.model->config(),
                                                           current_.model->policy().kv_cache,
                                                           options_.kv_block_size);
    absl::StatusOr<std::unique_ptr<model::InferenceBackend>> backend =
        model::make_cpu_backend(current_.model, bo);
    if (!backend.ok()) return backend.status();
    return std::make_unique<BackendGenerator>(std::move(*backend), options_.max_batch_tokens);
  }
  bo.memory_budget_bytes = options_.gpu_memory_budget_bytes;
  bo.kv_block_tokens = options_.kv_block_size;
  bo.max_step_tokens = options_.max_batch_tokens;
  bo.weight_slots = options_.gpu_weight_slots;
  absl::StatusOr<std::unique_ptr<model::InferenceBackend>> backend =
      model::make_cuda_backend(current_.model, bo);
  if (!backend.ok()) return backend.status();
  const int64_t blocks = (*backend)->memory().kv_blocks_total;
  if (blocks < 1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CUDA backend: no KV blocks left in the --gpu-memory-fraction budget of ",
                     options_.gpu_memory_budget_bytes, " bytes"));
  }
  // No sequence runs while a generator is made, so the budget can change size.
  kv_blocks_ = KvBlockBudget(options_.kv_block_size, blocks);
  stats_.kv_blocks_total = blocks;
  return std::make_unique<BackendGenerator>(std::move(*backend), options_.max_batch_tokens);
}

void Scheduler::publish_gauges_locked() {
  stats_.queued_samples = static_cast<int64_t>(queue_.size());
  stats_.running_samples = static_cast<int64_t>(running_.size());
  stats_.kv_cache_usage = kv_blocks_.usage();
  stats_.kv_blocks_used = kv_blocks_.used_blocks();
  stats_.kv_blocks_total = kv_blocks_.total_blocks();
  stats_.kv_cache_bytes = generator_ ? generator_->kv_cache_bytes() : 0;
  if (metrics_) {
    metrics_->queue_depth->get().set(static_cast<double>(stats_.queued_samples));
    metrics_->batch_size->get().set(static_cast<double>(stats_.running_samples));
    metrics_->kv_cache_usage->get().set(stats_.kv_cache_usage);
    metrics_->kv_cache_bytes->get().set(static_cast<double>(stats_.kv_cache_bytes));
  }
}

void Scheduler::run() {
  std::unique_lock lock(mu_);
  while (true) {
    drop_cancelled_locked();
    const bool busy = generator_ != nullptr && !generator_->idle();
    if (stopping_) {
      if (!busy && queue_.empty()) break;
      if (Clock::now() >= drain_deadline_) {
        const absl::Status error =
            absl::UnavailableError("worker shut down before the sample finished");
        for (Queued& q : queue_) {
          if (!q.request->cancelled()) q.request->fail(error);
        }
        queue_.clear();
        reset_generator_locked(error);
        break;
      }
    }
    apply_pending_locked();
    // A new batch waits briefly so that requests arriving together are admitted together.
    if (!busy && !pending_.has_value() && !queue_.empty() && !stopping_) {
      const Clock::time_point start = queue_.front().enqueued + options_.batch_wait;
      if (Clock::now() < start) {
        cv_.wait_until(lock, start);
        continue;
      }
    }
    // No admission while a newer version waits: the running batch drains, then it is swapped in.
    if (!pending_.has_value() && generator_ != nullptr) admit_locked();
    publish_gauges_locked();
    if (generator_ == nullptr || generator_->idle()) {
      if (stopping_) {
        cv_.wait_until(lock, drain_deadline_);
      } else {
        cv_.wait(lock);
      }
      continue;
    }

    // One batched forward, outside the lock (only this thread touches the generator).
    stats_.peak_batch_size =
        std::max<int64_t>(stats_.peak_batch_size, static_cast<int64_t>(running_.size()));
    StepGenerator* generator = generator_.get();
    // A version waiting for the batch to drain is announced once, so the generator can start
    // moving it (the CUDA backend copies it into its idle weight slot during the next steps).
    std::shared_ptr<const model::Model> announce;
    if (pending_.has_value() && !pending_prepared_) {
      announce = pending_->model;
      pending_prepared_ = true;
    }
    lock.unlock();
    const bool prepared = announce != nullptr && generator->prepare_model(announce).ok();
    const absl::Status step = generator->step();
    std::vector<model::GenerationResult> finished;
    if (step.ok()) finished = generator->take_finished();
    lock.lock();
    stats_.steps += 1;
    if (prepared) stats_.prepared_swaps += 1;
    if (!step.ok()) {
      reset_generator_locked(
          absl::InternalError(absl::StrCat("generation step failed: ", step.message())));
      continue;
    }
    for (model::GenerationResult& r : finished) {
      auto it = running_.find(r.id);
      if (it == running_.end()) continue;
      Running& run = it->second;
      kv_blocks_.release(run.kv_blocks);
      stats_.generated_tokens += r.tokens.size();
      if (metrics_) {
        metrics_->tokens->with({"generated"}).inc(static_cast<double>(r.tokens.size()));
      }
      if (!run.request->cancelled()) {
        SampleOutcome outcome;
        outcome.sample_id = std::move(run.sample_id);
        outcome.tokens = std::move(r.tokens);
        outcome.logprobs = std::move(r.logprobs);
        outcome.routing = std::move(r.routing);
        outcome.weight_version = run.weight_version;
        outcome.reason = r.reason;
        run.request->deliver(std::move(outcome));
      }
      running_.erase(it);
    }
  }
  publish_gauges_locked();
  thread_done_ = true;
  stats_.ready = false;
  swapped_cv_.notify_all();
}

}  // namespace fp8rl::generation
