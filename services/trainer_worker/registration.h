// Keeps this worker registered with the coordinator: registers (retrying with backoff while the
// coordinator is unreachable), heartbeats at the interval the coordinator asks for, registers
// again when told to (coordinator restart, expiry), and deregisters on stop(). All on one
// background thread, so a slow or absent coordinator never blocks serving.
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
#include "fp8rl/v1/worker_registry.grpc.pb.h"

namespace fp8rl::trainer {

struct RegistrationOptions {
  std::string coordinator;  // host:port of the coordinator's WorkerRegistry
  v1::WorkerKind kind = v1::WORKER_KIND_TRAINER;
  std::string address;          // our gRPC host:port as others reach it
  std::string metrics_address;  // our /metrics host:port
  std::string name;             // stable name ("trainer"); empty: the coordinator picks one
  std::chrono::milliseconds rpc_timeout{2000};
  std::chrono::milliseconds retry_backoff{500};  // first retry delay; doubles up to 5 s
  // Weight version reported on register / heartbeat (optional).
  std::function<int64_t()> weight_version;
};

class WorkerRegistration {
 public:
  explicit WorkerRegistration(RegistrationOptions options);
  ~WorkerRegistration();  // stop()
  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;

  // Starts the background thread. InvalidArgument naming the option when coordinator or address
  // is empty.
  absl::Status start();
  // Deregisters (best effort, bounded by rpc_timeout) and joins the thread. Idempotent.
  void stop();

  // Id assigned by the coordinator ("" until registered).
  std::string worker_id() const;
  // Number of successful RegisterWorker calls.
  int64_t registrations() const;
  // Waits until registered; false when `timeout` passes first.
  bool wait_registered(std::chrono::milliseconds timeout) const;

 private:
  void run();
  bool register_once();
  // Sleeps up to `d`; false when stop() was called.
  bool sleep_for(std::chrono::milliseconds d);

  const RegistrationOptions options_;
  std::unique_ptr<v1::WorkerRegistry::Stub> stub_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool started_ = false;
  bool stopping_ = false;
  std::string worker_id_;
  int64_t registrations_ = 0;
  std::chrono::milliseconds heartbeat_interval_{1000};
  std::thread thread_;
};

}  // namespace fp8rl::trainer
