// The registration loop shared by every service (see worker_registration.h).
#include "common/service/worker_registration.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"

namespace fp8rl::service {
namespace {

constexpr std::chrono::milliseconds kMinHeartbeat{20};
constexpr std::chrono::milliseconds kMaxHeartbeat{60000};
// Failures are logged on the first one and then every kLogEvery-th, so a missing coordinator is
// visible without flooding the log.
constexpr int64_t kLogEvery = 30;

WorkerRegistrationOptions with_instance(WorkerRegistrationOptions options) {
  if (options.instance.empty()) {
    std::random_device device;
    const uint64_t bits = (static_cast<uint64_t>(device()) << 32) | device();
    options.instance = absl::StrCat(absl::Hex(bits, absl::kZeroPad16));
  }
  return options;
}

}  // namespace

WorkerRegistration::WorkerRegistration(WorkerRegistrationOptions options)
    : options_(with_instance(std::move(options))),
      heartbeat_interval_(options_.heartbeat_interval) {}

WorkerRegistration::~WorkerRegistration() { stop(/*deregister=*/false); }

absl::Status WorkerRegistration::start() {
  if (options_.coordinator.empty()) {
    return absl::InvalidArgumentError("coordinator: must not be empty");
  }
  if (options_.kind == v1::WORKER_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError("kind: must be GENERATION, TRAINER or WEIGHT_SYNC");
  }
  if (options_.address.empty()) return absl::InvalidArgumentError("address: must not be empty");
  const std::pair<const char*, std::chrono::milliseconds> durations[] = {
      {"rpc_timeout", options_.rpc_timeout},
      {"retry_backoff", options_.retry_backoff},
      {"max_backoff", options_.max_backoff},
      {"heartbeat_interval", options_.heartbeat_interval}};
  for (const auto& [field, value] : durations) {
    if (value.count() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be > 0 ms, got ", value.count()));
    }
  }
  if (options_.max_backoff < options_.retry_backoff) {
    return absl::InvalidArgumentError(absl::StrCat("max_backoff: must be >= retry_backoff (",
                                                   options_.retry_backoff.count(), " ms), got ",
                                                   options_.max_backoff.count()));
  }
  std::lock_guard lock(mu_);
  if (started_) return absl::FailedPreconditionError("worker registration already started");
  // gRPC's own reconnect backoff grows to minutes; cap it at ours so a restarted coordinator is
  // found again within max_backoff.
  grpc::ChannelArguments args;
  set_reconnect_backoff(&args, options_.retry_backoff, options_.max_backoff);
  stub_ = v1::WorkerRegistry::NewStub(make_channel(options_.coordinator, args, options_.security));
  started_ = true;
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

void WorkerRegistration::stop(bool deregister) {
  std::lock_guard stop_lock(stop_mu_);
  {
    std::lock_guard lock(mu_);
    if (!started_) return;
    stopping_ = true;
    if (in_flight_ != nullptr) in_flight_->TryCancel();
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
  context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  v1::DeregisterRequest request;
  request.set_worker_id(id);
  v1::DeregisterResponse response;
  const grpc::Status status = stub_->Deregister(&context, request, &response);
  std::lock_guard lock(mu_);
  if (status.ok()) {
    stats_.deregistered = true;
    log_info(options_.log_component, "deregistered", {{"worker_id", id}});
  } else {
    ++stats_.failed_calls;
    log_warn(options_.log_component, "deregister failed",
             {{"worker_id", id}, {"error", status.error_message()}});
  }
}

std::string WorkerRegistration::worker_id() const {
  std::lock_guard lock(mu_);
  return worker_id_;
}

bool WorkerRegistration::wait_registered(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return !worker_id_.empty(); });
}

WorkerRegistration::Stats WorkerRegistration::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

template <typename Call>
grpc::Status WorkerRegistration::call(Call&& rpc) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
    in_flight_ = &context;
  }
  const grpc::Status status = rpc(&context);
  std::lock_guard lock(mu_);
  in_flight_ = nullptr;
  return status;
}

bool WorkerRegistration::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

bool WorkerRegistration::register_once() {
  v1::RegisterWorkerRequest request;
  request.set_kind(options_.kind);
  request.set_address(options_.address);
  request.set_metrics_address(options_.metrics_address);
  request.set_name(options_.name);
  request.set_instance(options_.instance);
  request.set_weight_version(options_.load ? options_.load().weight_version : 0);
  v1::RegisterWorkerResponse response;
  const grpc::Status status = call([&](grpc::ClientContext* context) {
    return stub_->RegisterWorker(context, request, &response);
  });
  {
    std::lock_guard lock(mu_);
    if (!status.ok() || response.worker_id().empty()) {
      if (stats_.failed_calls++ % kLogEvery == 0 && !stopping_) {
        log_warn(options_.log_component, "register failed; retrying",
                 {{"coordinator", options_.coordinator},
                  {"error", status.ok() ? "empty worker_id" : status.error_message()}});
      }
      return false;
    }
    worker_id_ = response.worker_id();
    ++stats_.registrations;
    if (response.heartbeat_interval_ms() > 0) {
      heartbeat_interval_ = std::clamp(std::chrono::milliseconds(response.heartbeat_interval_ms()),
                                       kMinHeartbeat, kMaxHeartbeat);
    }
    expiry_ = std::chrono::milliseconds(std::max<int64_t>(response.expiry_ms(), 0));
    last_ok_ = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
  log_info(options_.log_component, "registered",
           {{"coordinator", options_.coordinator},
            {"kind", v1::WorkerKind_Name(options_.kind)},
            {"worker_id", response.worker_id()},
            {"address", options_.address},
            {"heartbeat_ms", absl::StrCat(heartbeat_interval_.count())}});
  return true;
}

bool WorkerRegistration::heartbeat_once() {
  v1::HeartbeatRequest request;
  {
    std::lock_guard lock(mu_);
    request.set_worker_id(worker_id_);
  }
  const WorkerLoad load = options_.load ? options_.load() : WorkerLoad{};
  request.set_weight_version(load.weight_version);
  request.set_queue_depth(load.queue_depth);
  v1::HeartbeatResponse response;
  const grpc::Status status = call(
      [&](grpc::ClientContext* context) { return stub_->Heartbeat(context, request, &response); });
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (status.ok() && !response.reregister()) {
    ++stats_.heartbeats;
    last_ok_ = now;
    return true;
  }
  std::string reason;
  if (status.ok()) {
    ++stats_.heartbeats;
    reason = "coordinator asked to register again";
  } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    ++stats_.failed_calls;
    reason = "coordinator does not know this worker";
  } else {
    // Unreachable or restarting: keep the id while the coordinator could still know it; once
    // silent past its expiry the entry is gone there, so register again (same name replaces it).
    ++stats_.failed_calls;
    if (stopping_ || expiry_.count() == 0 || now - last_ok_ <= expiry_) return true;
    reason = "no heartbeat accepted within the expiry";
  }
  log_info(options_.log_component, "registering again",
           {{"worker_id", worker_id_}, {"reason", reason}});
  worker_id_.clear();
  return false;
}

void WorkerRegistration::run() {
  std::chrono::milliseconds backoff = options_.retry_backoff;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
    }
    if (worker_id().empty()) {
      if (register_once()) {
        backoff = options_.retry_backoff;
        continue;
      }
      if (!sleep_for(backoff)) return;
      backoff = std::min(backoff * 2, options_.max_backoff);
      continue;
    }
    std::chrono::milliseconds interval;
    {
      std::lock_guard lock(mu_);
      interval = heartbeat_interval_;
    }
    if (!sleep_for(interval)) return;
    // A reregister answer is acted on at once (no wait), so the coordinator sees us again quickly.
    heartbeat_once();
  }
}

}  // namespace fp8rl::service
