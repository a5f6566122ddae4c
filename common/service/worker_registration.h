// Keeps one service process known to the coordinator's WorkerRegistry, the way every service
// (generation worker, trainer, weight sync) must: registers (retrying with capped exponential
// backoff while the coordinator is unreachable), heartbeats with the held weight version and queue
// depth, registers again when the coordinator says it does not know us (reregister answer,
// NOT_FOUND, a coordinator restart, or a silence longer than the expiry it announced), and
// deregisters on stop. Everything runs on one background thread; stop() is bounded.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/service/security.h"
#include "fp8rl/v1/worker_registry.grpc.pb.h"

namespace fp8rl::service {

// What a registration / heartbeat reports about the worker right now.
struct WorkerLoad {
  int64_t weight_version = 0;  // policy weight version held (0 when none)
  int32_t queue_depth = 0;     // requests queued or running (generation workers)
};

struct WorkerRegistrationOptions {
  std::string coordinator;  // host:port of the coordinator's WorkerRegistry; required
  v1::WorkerKind kind = v1::WORKER_KIND_UNSPECIFIED;  // required
  std::string name;             // stable worker name; empty: the coordinator assigns one
  std::string address;          // advertised gRPC host:port; required
  std::string metrics_address;  // advertised /metrics host:port
  // Sent with every registration (RegisterWorkerRequest.instance): tells the coordinator that a
  // registration after an expiry comes from the same process. Empty: a random one chosen when
  // the WorkerRegistration is made (once per process, as every service makes one).
  std::string instance;
  std::string log_component = "registration";  // component name in log lines
  // Each Register/Heartbeat call; Deregister in stop() gets the same bound.
  std::chrono::milliseconds rpc_timeout{2000};
  std::chrono::milliseconds retry_backoff{200};        // first retry delay after a failed register
  std::chrono::milliseconds max_backoff{2000};         // the delay doubles up to this
  std::chrono::milliseconds heartbeat_interval{1000};  // until the coordinator announces its own
  // Reported on register and every heartbeat; null reports zeros. Called on the background thread.
  std::function<WorkerLoad()> load;
  // TLS and the cluster token for the calls to the coordinator (security.h); plain by default.
  ClientSecurity security = {};
};

class WorkerRegistration {
 public:
  explicit WorkerRegistration(WorkerRegistrationOptions options);
  ~WorkerRegistration();  // stop(/*deregister=*/false)
  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;

  // Checks the options and starts the background thread. InvalidArgument naming the option
  // ("coordinator: must not be empty"); FailedPrecondition when started before.
  absl::Status start();

  // Cancels any call in flight, joins the thread and, with `deregister` and while registered,
  // calls Deregister bounded by rpc_timeout. Returns within about rpc_timeout even when the
  // coordinator is gone. Idempotent.
  void stop(bool deregister = true);

  // The id the coordinator assigned ("" while unregistered).
  std::string worker_id() const;
  // Waits until registered; false when `timeout` passes first.
  bool wait_registered(std::chrono::milliseconds timeout) const;

  struct Stats {
    int64_t registrations = 0;  // successful RegisterWorker calls
    int64_t heartbeats = 0;     // successful Heartbeat calls
    int64_t failed_calls = 0;   // registry calls that failed (coordinator unreachable, ...)
    bool deregistered = false;  // Deregister succeeded
  };
  Stats stats() const;

  const WorkerRegistrationOptions& options() const { return options_; }

 private:
  void run();
  bool register_once();
  // False when the worker must register again.
  bool heartbeat_once();
  // Runs one unary call with the deadline, cancellable by stop().
  template <typename Call>
  grpc::Status call(Call&& rpc);
  // Sleeps up to `d`; false when stop() was called.
  bool sleep_for(std::chrono::milliseconds d);

  const WorkerRegistrationOptions options_;
  std::unique_ptr<v1::WorkerRegistry::Stub> stub_;

  // Guards the members marked below. Taken after stop_mu_.
  mutable std::mutex mu_;
  // Waits for: stopping_ (sleep_for() between calls) or a non-empty worker_id_
  // (wait_registered()). Notified by stop() and by a successful registration.
  mutable std::condition_variable cv_;
  bool started_ = false;                      // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  grpc::ClientContext* in_flight_ = nullptr;  // guarded by mu_; cancelled by stop()
  std::string worker_id_;                     // guarded by mu_
  // Guarded by mu_ (from the last RegisterWorker answer).
  std::chrono::milliseconds heartbeat_interval_;
  std::chrono::milliseconds expiry_{0};  // guarded by mu_; 0: the coordinator announced none
  std::chrono::steady_clock::time_point last_ok_;  // guarded by mu_
  Stats stats_;                                    // guarded by mu_
  std::thread thread_;  // started by start(), joined by stop() under stop_mu_
  std::mutex stop_mu_;  // serializes stop(); taken before mu_
};

}  // namespace fp8rl::service
