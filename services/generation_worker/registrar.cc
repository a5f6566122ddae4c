// Registration and heartbeats of a generation worker (see registrar.h).
#include "services/generation_worker/registrar.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/service/log.h"

namespace fp8rl::generation {
namespace {

constexpr char kComponent[] = "generation-worker";
constexpr std::chrono::milliseconds kMinHeartbeat{20};
constexpr std::chrono::milliseconds kMaxHeartbeat{60000};

}  // namespace

Registrar::Registrar(std::shared_ptr<grpc::ChannelInterface> channel, RegistrarOptions options,
                     std::function<WorkerLoad()> load)
    : stub_(v1::WorkerRegistry::NewStub(channel)),
      options_(std::move(options)),
      load_(std::move(load)),
      heartbeat_interval_(options_.default_heartbeat_interval) {}

Registrar::~Registrar() { stop(false); }

absl::Status Registrar::start() {
  if (options_.name.empty()) return absl::InvalidArgumentError("worker_id: must not be empty");
  if (options_.address.empty()) return absl::InvalidArgumentError("address: must not be empty");
  if (options_.retry_interval.count() <= 0 || options_.rpc_timeout.count() <= 0 ||
      options_.default_heartbeat_interval.count() <= 0) {
    return absl::InvalidArgumentError(
        "retry_interval/rpc_timeout/default_heartbeat_interval: must be > 0");
  }
  std::lock_guard lock(mu_);
  if (started_) return absl::FailedPreconditionError("registrar already started");
  started_ = true;
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

void Registrar::stop(bool deregister) {
  std::lock_guard stop_lock(stop_mu_);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::string id;
  {
    std::lock_guard lock(mu_);
    id.swap(worker_id_);
  }
  if (!deregister || id.empty()) return;
  grpc::ClientContext context;
  set_deadline(&context);
  v1::DeregisterRequest request;
  request.set_worker_id(id);
  v1::DeregisterResponse response;
  const grpc::Status status = stub_->Deregister(&context, request, &response);
  std::lock_guard lock(mu_);
  if (status.ok()) {
    stats_.deregistered = true;
    service::log_info(kComponent, "deregistered", {{"worker_id", id}});
  } else {
    ++stats_.failed_calls;
    service::log_warn(kComponent, "deregister failed",
                      {{"worker_id", id}, {"error", status.error_message()}});
  }
}

std::string Registrar::worker_id() const {
  std::lock_guard lock(mu_);
  return worker_id_;
}

Registrar::Stats Registrar::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Registrar::set_deadline(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
}

bool Registrar::register_once() {
  v1::RegisterWorkerRequest request;
  request.set_kind(v1::WORKER_KIND_GENERATION);
  request.set_address(options_.address);
  request.set_metrics_address(options_.metrics_address);
  request.set_name(options_.name);
  request.set_weight_version(load_ ? load_().weight_version : 0);
  v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  std::lock_guard lock(mu_);
  if (!status.ok() || response.worker_id().empty()) {
    // Logged on the first failure and then every 30th, so a missing coordinator is visible
    // without flooding the log.
    if (stats_.failed_calls++ % 30 == 0) {
      service::log_warn(
          kComponent, "register failed; retrying",
          {{"coordinator_error", status.ok() ? "empty worker_id" : status.error_message()}});
    }
    return false;
  }
  worker_id_ = response.worker_id();
  if (response.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ = std::clamp(std::chrono::milliseconds(response.heartbeat_interval_ms()),
                                     kMinHeartbeat, kMaxHeartbeat);
  }
  ++stats_.registrations;
  service::log_info(
      kComponent, "registered",
      {{"worker_id", worker_id_}, {"heartbeat_ms", absl::StrCat(heartbeat_interval_.count())}});
  return true;
}

void Registrar::heartbeat_once() {
  v1::HeartbeatRequest request;
  {
    std::lock_guard lock(mu_);
    request.set_worker_id(worker_id_);
  }
  const WorkerLoad load = load_ ? load_() : WorkerLoad{};
  request.set_weight_version(load.weight_version);
  request.set_queue_depth(load.queue_depth);
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  std::lock_guard lock(mu_);
  if (!status.ok()) {
    // The coordinator may be restarting; once back it answers reregister for our old id.
    ++stats_.failed_calls;
    return;
  }
  ++stats_.heartbeats;
  if (response.reregister()) {
    service::log_info(kComponent, "coordinator asked to register again",
                      {{"worker_id", worker_id_}});
    worker_id_.clear();
  }
}

void Registrar::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (worker_id_.empty()) {
      lock.unlock();
      const bool ok = register_once();
      lock.lock();
      if (!ok) cv_.wait_for(lock, options_.retry_interval, [&] { return stopping_; });
      continue;
    }
    cv_.wait_for(lock, heartbeat_interval_, [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    heartbeat_once();
    lock.lock();
  }
}

}  // namespace fp8rl::generation
