// fp8rl-weight-sync: wires the weight-sync service, its gRPC server (health + reflection), the
// /metrics HTTP endpoint, registration with the coordinator (kind WEIGHT_SYNC, so the coordinator
// can find it) and graceful SIGTERM handling together. Logic lives in the libraries.
#include <grpc/grpc.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
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
#include "services/weight_sync/weight_sync_config.h"
#include "services/weight_sync/weight_sync_metrics.h"
#include "services/weight_sync/weight_sync_service.h"

namespace {

namespace service = fp8rl::service;
namespace weight_sync = fp8rl::weight_sync;

int fail(const absl::Status& status) {
  std::fprintf(stderr, "fp8rl-weight-sync: %s\n", std::string(status.message()).c_str());
  return 1;
}

int run(const std::vector<std::string>& args) {
  if (fp8rl::flags::wants_help(args)) {
    std::cout << weight_sync::weight_sync_usage();
    return 0;
  }
  absl::StatusOr<weight_sync::WeightSyncConfig> config =
      weight_sync::parse_weight_sync_config(args);
  if (!config.ok()) {
    std::fprintf(stderr, "fp8rl-weight-sync: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  for (const std::string& w : config->warnings) {
    std::fprintf(stderr, "fp8rl-weight-sync: %s\n", w.c_str());
  }
  // Held for the life of the process (never released): the last release runs grpc_shutdown(),
  // which can wait up to 10 s for gRPC's executor thread and would stretch the bounded shutdown.
  grpc_init();
  absl::StatusOr<service::LogLevel> level = service::parse_log_level(config->service.log_level);
  if (!level.ok()) return fail(level.status());
  service::set_log_level(*level);
  if (absl::Status s = service::install_shutdown_handlers(); !s.ok()) return fail(s);

  // TLS and the cluster token (security.h): every call to this service then needs the token, and
  // calls to the coordinator and weight sync carry it. SIGHUP re-reads the token file.
  absl::StatusOr<service::ServiceSecurity> security =
      service::load_service_security(config->service);
  if (!security.ok()) return fail(security.status());
  if (absl::Status s = service::install_reload_handler(); !s.ok()) return fail(s);
  service::TokenReloader reloader({security->cluster_tokens});

  service::MetricsRegistry registry;
  absl::StatusOr<std::unique_ptr<weight_sync::WeightSyncMetrics>> metrics =
      weight_sync::WeightSyncMetrics::create(&registry);
  if (!metrics.ok()) return fail(metrics.status());
  weight_sync::WeightSyncServiceImpl sync(config->sync, metrics->get());
  sync.require_tokens(security->cluster_tokens);

  service::GrpcServerOptions grpc_options;
  grpc_options.address = service::listen_address(config->service, config->service.grpc_port);
  grpc_options.credentials = security->grpc_credentials;
  absl::StatusOr<std::unique_ptr<service::GrpcServer>> grpc = service::GrpcServer::start(
      grpc_options, {&sync}, {fp8rl::v1::WeightSyncService::service_full_name()});
  if (!grpc.ok()) return fail(grpc.status());

  service::HttpServerOptions http_options;
  http_options.host = config->service.listen_host;
  http_options.port = config->metrics_port;
  http_options.max_body_bytes = config->service.max_body_bytes;
  if (security->tls.enabled()) {
    http_options.tls_cert = security->tls.cert;
    http_options.tls_key = security->tls.key;
  }
  service::HttpServer http(http_options, &registry, [&sync] { return !sync.store().closed(); });
  absl::StatusOr<int> http_port = http.start();
  if (!http_port.ok()) {
    (*grpc)->shutdown(std::chrono::milliseconds(0));
    return fail(http_port.status());
  }
  std::unique_ptr<service::WorkerRegistration> registration;
  if (config->registers()) {
    service::WorkerRegistrationOptions reg;
    reg.coordinator = config->service.coordinator;
    reg.kind = fp8rl::v1::WORKER_KIND_WEIGHT_SYNC;
    reg.name = config->service.name;
    reg.address = service::advertise_address(config->service, (*grpc)->port());
    reg.metrics_address = service::advertise_address(config->service, *http_port);
    reg.log_component = "weight-sync";
    reg.security = security->client;
    reg.load = [&sync] { return service::WorkerLoad{sync.store().latest_version(), 0}; };
    registration = std::make_unique<service::WorkerRegistration>(std::move(reg));
    if (absl::Status s = registration->start(); !s.ok()) {
      (*grpc)->shutdown(std::chrono::milliseconds(0));
      http.stop();
      return fail(s);
    }
  }
  service::log_info("weight-sync", "serving",
                    {{"grpc_port", absl::StrCat((*grpc)->port())},
                     {"metrics_port", absl::StrCat(*http_port)},
                     {"coordinator", config->registers() ? config->service.coordinator : "(none)"},
                     {"keep_versions", absl::StrCat(config->sync.keep_versions)},
                     {"deltas", !config->sync.deltas ? "off"
                                : config->sync.delta_choice ==
                                        weight_sync::WeightSyncOptions::DeltaChoice::kAlways
                                    ? "always"
                                    : "on"},
                     {"delta_max_fraction", absl::StrCat(config->sync.delta_max_fraction)},
                     {"delta_zstd_level", absl::StrCat(config->sync.delta_zstd_level)},
                     {"fanout", weight_sync::fanout_name(config->sync.fanout)}});

  service::wait_for_shutdown();
  service::log_info("weight-sync", "shutting down");
  // Leave the registry first so the coordinator stops routing to us (bounded by its rpc timeout).
  if (registration) registration->stop(/*deregister=*/true);
  const auto grace = std::chrono::milliseconds(
      static_cast<int64_t>(config->service.shutdown_grace_seconds * 1000.0));
  sync.begin_shutdown();  // ends Subscribe streams so the gRPC drain is not held open by them
  (*grpc)->shutdown(grace);
  http.stop();
  service::log_info("weight-sync", "stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(std::vector<std::string>(argv + 1, argv + argc)); }
