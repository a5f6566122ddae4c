// fp8rl-trainer-worker: wires the Trainer, its gRPC service (health + reflection), the /metrics
// HTTP endpoint, coordinator registration and graceful SIGTERM handling together. Logic lives in
// the fp8rl_trainer_worker library.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/service/auth.h"
#include "common/service/grpc_server.h"
#include "common/service/http_server.h"
#include "common/service/log.h"
#include "common/service/metrics.h"
#include "common/service/security.h"
#include "common/service/shutdown.h"
#include "common/service/worker_registration.h"
#include "services/trainer_worker/trainer.h"
#include "services/trainer_worker/trainer_config.h"
#include "services/trainer_worker/trainer_metrics.h"
#include "services/trainer_worker/trainer_service.h"
#include "services/trainer_worker/weight_publisher.h"

namespace {

using namespace fp8rl;  // NOLINT: main() only

constexpr std::chrono::minutes kPublishTimeout{10};

int fail(const absl::Status& status) {
  std::fprintf(stderr, "fp8rl-trainer-worker: %s\n", std::string(status.message()).c_str());
  return 1;
}

int run(const std::vector<std::string>& args) {
  if (flags::wants_help(args)) {
    std::cout << trainer::trainer_usage();
    return 0;
  }
  absl::StatusOr<trainer::TrainerConfig> config = trainer::parse_trainer_config(args);
  if (!config.ok()) {
    std::fprintf(stderr, "fp8rl-trainer-worker: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  for (const std::string& w : config->warnings) {
    std::fprintf(stderr, "fp8rl-trainer-worker: %s\n", w.c_str());
  }
  absl::StatusOr<service::LogLevel> level = service::parse_log_level(config->service.log_level);
  if (!level.ok()) return fail(level.status());
  service::set_log_level(*level);
  std::error_code ec;
  std::filesystem::create_directories(config->service.data_dir, ec);
  if (ec) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "--data-dir: cannot create '", config->service.data_dir, "': ", ec.message())));
  }
  if (absl::Status s = service::install_shutdown_handlers(); !s.ok()) return fail(s);

  // TLS and the cluster token (security.h): every call to this service then needs the token, and
  // calls to the coordinator and weight sync carry it. SIGHUP re-reads the token file.
  absl::StatusOr<service::ServiceSecurity> security =
      service::load_service_security(config->service);
  if (!security.ok()) return fail(security.status());
  if (absl::Status s = service::install_reload_handler(); !s.ok()) return fail(s);
  service::TokenReloader reloader({security->cluster_tokens});

  service::MetricsRegistry registry;
  absl::StatusOr<std::unique_ptr<trainer::TrainerMetrics>> metrics =
      trainer::TrainerMetrics::create(&registry);
  if (!metrics.ok()) return fail(metrics.status());
  std::unique_ptr<trainer::WeightPublisher> publisher = trainer::make_grpc_weight_publisher(
      kPublishTimeout, security->client, static_cast<uint32_t>(config->upload_streams),
      config->weight_same_host);
  trainer::TrainerOptions options;
  options.worker_id = config->worker_id;
  options.default_weight_sync_address = config->weight_sync;
  options.data_dir = config->service.data_dir;
  options.logprob_log_dir = config->logprob_log_dir;
  options.data_root = config->data_root;
  options.models_root = config->models_root;
  for (auto [flag, root] : {std::pair{"--data-root", &options.data_root},
                            std::pair{"--models-root", &options.models_root}}) {
    if (root->empty()) continue;
    const std::filesystem::path dir = std::filesystem::canonical(*root, ec);
    if (ec || !std::filesystem::is_directory(dir)) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", *root, "' is not an existing folder")));
    }
    *root = dir.string();
  }
  options.allreduce_bucket_bytes = config->allreduce_bucket_bytes;
  options.shard = config->shard;
  // --device: cuda when an sm_90 device is visible and this build trains on it (auto), else cpu;
  // `cuda` without one is a one-line error (exit 2), never a silent CPU fallback.
  absl::StatusOr<model::DeviceSelection> device =
      model::select_device(config->device, trainer::trainer_device_probe);
  if (!device.ok()) {
    std::fprintf(stderr, "fp8rl-trainer-worker: %s\n",
                 std::string(device.status().message()).c_str());
    return 2;
  }
  service::log_info("trainer", device->description);
  trainer::apply_device(*device, *config, &options.device, &options.gpu_memory_budget_bytes);
  options.recompute = config->recompute;
  options.max_step_tokens = config->max_step_tokens;
  options.coordinator_address = config->service.coordinator;
  options.rendezvous_security = security->client;
  // Trainer-group peers reach this trainer's collectives on the host it advertises.
  const std::string advertised = service::advertise_address(config->service, 0);
  options.group_host = advertised.substr(0, advertised.rfind(':'));
  trainer::Trainer trainer(options, publisher.get(), metrics->get());
  trainer::TrainerServiceImpl service_impl(&trainer);
  service_impl.require_tokens(security->cluster_tokens);

  service::GrpcServerOptions grpc_options;
  grpc_options.max_message_bytes = service::kDataPathMessageBytes;
  grpc_options.address = service::listen_address(config->service, config->service.grpc_port);
  grpc_options.credentials = security->grpc_credentials;
  absl::StatusOr<std::unique_ptr<service::GrpcServer>> grpc = service::GrpcServer::start(
      grpc_options, {&service_impl}, {v1::TrainerService::service_full_name()});
  if (!grpc.ok()) return fail(grpc.status());

  service::HttpServerOptions http_options;
  http_options.host = config->service.listen_host;
  http_options.port = config->metrics_port;
  http_options.max_body_bytes = config->service.max_body_bytes;
  if (security->tls.enabled()) {
    http_options.tls_cert = security->tls.cert;
    http_options.tls_key = security->tls.key;
  }
  service::HttpServer http(http_options, &registry, [] { return !service::shutdown_requested(); });
  absl::StatusOr<int> http_port = http.start();
  if (!http_port.ok()) {
    (*grpc)->shutdown(std::chrono::milliseconds(0));
    return fail(http_port.status());
  }

  std::unique_ptr<service::WorkerRegistration> registration;
  if (!config->service.coordinator.empty()) {
    service::WorkerRegistrationOptions reg;
    reg.coordinator = config->service.coordinator;
    reg.kind = v1::WORKER_KIND_TRAINER;
    reg.address = service::advertise_address(config->service, (*grpc)->port());
    reg.metrics_address = service::advertise_address(config->service, *http_port);
    reg.name = config->worker_id;
    reg.log_component = "trainer";
    reg.security = security->client;
    reg.load = [&trainer] { return service::WorkerLoad{trainer.status().published_version(), 0}; };
    registration = std::make_unique<service::WorkerRegistration>(std::move(reg));
    if (absl::Status s = registration->start(); !s.ok()) {
      (*grpc)->shutdown(std::chrono::milliseconds(0));
      http.stop();
      return fail(s);
    }
  }
  service::log_info("trainer", "serving",
                    {{"grpc_port", absl::StrCat((*grpc)->port())},
                     {"metrics_port", absl::StrCat(*http_port)},
                     {"coordinator", config->service.coordinator},
                     {"weight_sync", config->weight_sync},
                     {"data_dir", config->service.data_dir}});

  service::wait_for_shutdown();
  service::log_info("trainer", "shutting down");
  const auto grace = std::chrono::milliseconds(
      static_cast<int64_t>(config->service.shutdown_grace_seconds * 1000.0));
  if (registration) registration->stop(/*deregister=*/true);
  // The in-flight call gets `grace` to finish; past that, a running update stops at its next
  // minibatch boundary (UNAVAILABLE) so the gRPC drain below ends in bounded time.
  std::promise<void> drained;
  std::future<void> drained_future = drained.get_future();
  std::thread watchdog([&] {
    if (drained_future.wait_for(grace) != std::future_status::ready) trainer.begin_shutdown();
  });
  (*grpc)->shutdown(grace);
  drained.set_value();
  watchdog.join();
  http.stop();
  service::log_info("trainer", "stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(std::vector<std::string>(argv + 1, argv + argc)); }
