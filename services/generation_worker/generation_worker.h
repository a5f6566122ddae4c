// One generation worker, assembled: the scheduler, the GenerationService on a gRPC server (with
// health and reflection), /metrics over HTTP, the weight-sync subscriber whose verified versions
// are swapped in through install_weights(), and the coordinator registration. main.cc only parses
// flags and waits for SIGTERM; tests run the same object in-process.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/service/grpc_server.h"
#include "common/service/http_server.h"
#include "common/service/metrics.h"
#include "common/service/security.h"
#include "common/service/worker_registration.h"
#include "model/weight_set.h"
#include "model/weight_view.h"
#include "services/generation_worker/generation_metrics.h"
#include "services/generation_worker/generation_service.h"
#include "services/generation_worker/scheduler.h"
#include "services/generation_worker/weight_double_buffer.h"
#include "services/generation_worker/worker_config.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/relay.h"

namespace fp8rl::generation {

class GenerationWorker {
 public:
  // Binds the gRPC and HTTP ports (0 picks free ones), then starts subscribing to weight sync and
  // registering with the coordinator in the background (both retry until reachable).
  // FailedPrecondition naming the address when a port cannot be bound.
  static absl::StatusOr<std::unique_ptr<GenerationWorker>> start(
      const GenerationWorkerConfig& config);
  ~GenerationWorker();  // shutdown(0)
  GenerationWorker(const GenerationWorker&) = delete;
  GenerationWorker& operator=(const GenerationWorker&) = delete;

  int grpc_port() const { return grpc_->port(); }
  int metrics_port() const { return http_port_; }
  // The worker's stable name (--worker-id, or advertise-host:grpc-port).
  const std::string& name() const { return name_; }

  // The swap path for one verified version: resolves the precision policy, builds the model and
  // swaps it in at the next batch boundary; returns once it is served. The weight-sync subscriber
  // calls it (and acks with its result); tests may call it directly.
  absl::Status install_weights(model::WeightSet set);
  // install_weights() of a version given as views (a payload received in place, or a set). The
  // version is written into the idle slot of the worker's double buffer
  // (weight_double_buffer.h) and served from the next batch boundary on.
  absl::Status install_view(const model::WeightView& view);

  // Stops admitting requests, lets in-flight samples finish for up to `grace` (then cancels
  // them), stops the subscriber, deregisters, and stops both servers. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

  Scheduler& scheduler() { return *scheduler_; }
  service::WorkerRegistration& registration() { return *registration_; }
  weight_sync::WeightSubscriber& subscriber() { return *subscriber_; }
  // nullptr without --weight-relay on.
  weight_sync::WeightRelay* relay() { return relay_.get(); }
  const WeightDoubleBuffer& weight_buffer() const { return *weights_; }
  service::MetricsRegistry& metrics_registry() { return registry_; }
  GenerationMetrics& metrics() { return *metrics_; }

 private:
  explicit GenerationWorker(const GenerationWorkerConfig& config) : config_(config) {}
  // Brings the weight metrics up to the double buffer's and the subscriber's counts; called after
  // every install attempt (a delta's counts are taken before its version is installed).
  void record_weight_path();

  const GenerationWorkerConfig config_;
  std::string name_;
  service::MetricsRegistry registry_;
  std::unique_ptr<GenerationMetrics> metrics_;
  // Held by record_weight_path() from taking the totals to recording them, so concurrent installs
  // record their snapshots in order.
  std::mutex weight_path_mu_;
  std::unique_ptr<WeightPathRecorder> weight_recorder_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<WeightDoubleBuffer> weights_;
  std::unique_ptr<GenerationServiceImpl> service_;
  // With --weight-relay on: versions passed on to the workers behind this one (on grpc_'s port).
  std::unique_ptr<weight_sync::WeightRelay> relay_;
  std::unique_ptr<service::GrpcServer> grpc_;
  std::unique_ptr<service::HttpServer> http_;
  int http_port_ = 0;
  std::unique_ptr<weight_sync::WeightSubscriber> subscriber_;
  std::unique_ptr<service::WorkerRegistration> registration_;
  std::unique_ptr<service::TokenReloader> reloader_;  // SIGHUP reloads of the cluster token
  // For GetStatus, which may run during start.
  std::atomic<service::WorkerRegistration*> registration_ptr_{nullptr};
  std::mutex shutdown_mu_;  // serializes shutdown(); guards nothing else
  std::atomic<bool> shut_down_{false};
};

}  // namespace fp8rl::generation
