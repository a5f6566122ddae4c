// Keeps a generation worker known to the coordinator's WorkerRegistry: registers (retrying while
// the coordinator is unreachable), heartbeats with the held weight version and queue depth,
// registers again when the coordinator says it does not know the worker (it expired or the
// coordinator restarted), and deregisters on shutdown.
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

namespace fp8rl::generation {

struct RegistrarOptions {
  std::string name;                                // stable worker name (--worker-id); required
  std::string address;                             // advertised gRPC host:port; required
  std::string metrics_address;                     // advertised /metrics host:port
  std::chrono::milliseconds retry_interval{1000};  // between failed RegisterWorker attempts
  std::chrono::milliseconds rpc_timeout{3000};     // deadline of each registry call
  // Used until the coordinator answers with its own interval.
  std::chrono::milliseconds default_heartbeat_interval{2000};
};

// What a heartbeat reports.
struct WorkerLoad {
  int64_t weight_version = 0;
  int32_t queue_depth = 0;
};

class Registrar {
 public:
  Registrar(std::shared_ptr<grpc::ChannelInterface> channel, RegistrarOptions options,
            std::function<WorkerLoad()> load);
  ~Registrar();  // stop(false)
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // Starts the background thread. InvalidArgument naming the option for an empty name or
  // address or a non-positive interval; FailedPrecondition when already started.
  absl::Status start();
  // Stops the thread; with `deregister`, a registered worker then calls Deregister (bounded by
  // rpc_timeout). Idempotent.
  void stop(bool deregister);

  // The registry id given by the coordinator ("" while unregistered).
  std::string worker_id() const;

  struct Stats {
    int64_t registrations = 0;  // successful RegisterWorker calls
    int64_t heartbeats = 0;     // successful Heartbeat calls
    int64_t failed_calls = 0;   // registry calls that failed (coordinator unreachable, ...)
    bool deregistered = false;  // Deregister succeeded
  };
  Stats stats() const;

 private:
  void run();
  bool register_once();
  void heartbeat_once();
  void set_deadline(grpc::ClientContext* context) const;

  std::unique_ptr<v1::WorkerRegistry::Stub> stub_;
  const RegistrarOptions options_;
  std::function<WorkerLoad()> load_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stopping_ = false;
  std::string worker_id_;
  std::chrono::milliseconds heartbeat_interval_;
  Stats stats_;
  std::thread thread_;
  std::mutex stop_mu_;
};

}  // namespace fp8rl::generation
