// The coordinator registration loop (see registration.h).
#include "services/trainer_worker/registration.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/service/log.h"

namespace fp8rl::trainer {
namespace {

constexpr char kLog[] = "registration";
constexpr std::chrono::milliseconds kMaxBackoff{5000};

}  // namespace

WorkerRegistration::WorkerRegistration(RegistrationOptions options)
    : options_(std::move(options)) {}

WorkerRegistration::~WorkerRegistration() { stop(); }

absl::Status WorkerRegistration::start() {
  if (options_.coordinator.empty()) {
    return absl::InvalidArgumentError("coordinator: address required");
  }
  if (options_.address.empty()) return absl::InvalidArgumentError("address: required");
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return absl::FailedPreconditionError("registration already started");
  stub_ = v1::WorkerRegistry::NewStub(
      grpc::CreateChannel(options_.coordinator, grpc::InsecureChannelCredentials()));
  started_ = true;
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

void WorkerRegistration::stop() {
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    id = worker_id_;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = worker_id_;
  }
  if (id.empty()) return;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  v1::DeregisterRequest request;
  request.set_worker_id(id);
  v1::DeregisterResponse response;
  grpc::Status s = stub_->Deregister(&context, request, &response);
  if (!s.ok()) service::log_warn(kLog, "deregister failed", {{"error", s.error_message()}});
}

std::string WorkerRegistration::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

int64_t WorkerRegistration::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

bool WorkerRegistration::wait_registered(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return !worker_id_.empty(); });
}

bool WorkerRegistration::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

bool WorkerRegistration::register_once() {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  v1::RegisterWorkerRequest request;
  request.set_kind(options_.kind);
  request.set_address(options_.address);
  request.set_metrics_address(options_.metrics_address);
  request.set_name(options_.name);
  if (options_.weight_version) request.set_weight_version(options_.weight_version());
  v1::RegisterWorkerResponse response;
  grpc::Status s = stub_->RegisterWorker(&context, request, &response);
  if (!s.ok()) {
    service::log_debug(kLog, "register failed",
                       {{"coordinator", options_.coordinator}, {"error", s.error_message()}});
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    worker_id_ = response.worker_id();
    ++registrations_;
    if (response.heartbeat_interval_ms() > 0) {
      heartbeat_interval_ = std::chrono::milliseconds(response.heartbeat_interval_ms());
    }
  }
  cv_.notify_all();
  service::log_info(kLog, "registered with the coordinator",
                    {{"coordinator", options_.coordinator},
                     {"worker_id", response.worker_id()},
                     {"address", options_.address}});
  return true;
}

void WorkerRegistration::run() {
  std::chrono::milliseconds backoff = options_.retry_backoff;
  bool registered = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    if (!registered) {
      registered = register_once();
      if (!registered) {
        if (!sleep_for(backoff)) return;
        backoff = std::min(backoff * 2, kMaxBackoff);
        continue;
      }
      backoff = options_.retry_backoff;
    }
    std::chrono::milliseconds interval;
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      interval = heartbeat_interval_;
      id = worker_id_;
    }
    if (!sleep_for(interval)) return;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
    v1::HeartbeatRequest request;
    request.set_worker_id(id);
    if (options_.weight_version) request.set_weight_version(options_.weight_version());
    v1::HeartbeatResponse response;
    grpc::Status s = stub_->Heartbeat(&context, request, &response);
    if (!s.ok()) {
      service::log_debug(kLog, "heartbeat failed", {{"error", s.error_message()}});
      continue;  // keep the id; the coordinator says when to register again
    }
    if (response.reregister()) {
      service::log_info(kLog, "coordinator asked to register again", {{"worker_id", id}});
      registered = false;
    }
  }
}

}  // namespace fp8rl::trainer
