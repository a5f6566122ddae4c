// fp8rl-coordinator: wires the job store, worker registry, RL loop runner, REST (8080) and gRPC
// (50051) front ends together, and shuts them down gracefully on SIGTERM/SIGINT.
#include <cstdio>
#include <filesystem>
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
#include "services/coordinator/console/console_routes.h"
#include "services/coordinator/coordinator_config.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/grpc_api.h"
#include "services/coordinator/grpc_cluster.h"
#include "services/coordinator/job_manager.h"
#include "services/coordinator/job_store.h"
#include "services/coordinator/rendezvous_service.h"
#include "services/coordinator/rest_api.h"
#include "services/coordinator/worker_registry.h"

namespace {

using namespace fp8rl;  // NOLINT: main only wires parts

int fail(const std::string& message) {
  std::fprintf(stderr, "fp8rl-coordinator: %s\n", message.c_str());
  return 1;
}

int run(const std::vector<std::string>& args) {
  if (flags::wants_help(args)) {
    std::fputs(coordinator::coordinator_usage().c_str(), stdout);
    return 0;
  }
  absl::StatusOr<coordinator::CoordinatorConfig> config =
      coordinator::parse_coordinator_config(args);
  if (!config.ok()) {
    fail(std::string(config.status().message()));
    return 2;  // a flag error, as on every service
  }
  for (const std::string& w : config->warnings)
    std::fprintf(stderr, "fp8rl-coordinator: %s\n", w.c_str());
  const service::ServiceOptions* options = &config->service;
  service::set_log_level(service::parse_log_level(options->log_level).value());
  const coordinator::AdmissionLimits& limits = config->limits;
  if (absl::Status s = service::install_shutdown_handlers(); !s.ok()) {
    return fail(std::string(s.message()));
  }
  absl::StatusOr<service::ServiceSecurity> security = service::load_service_security(*options);
  if (!security.ok()) return fail(std::string(security.status().message()));
  std::shared_ptr<service::TokenSet> api_tokens;
  if (const std::string& file = config->auth_token_file; !file.empty()) {
    absl::StatusOr<std::shared_ptr<service::TokenSet>> tokens =
        service::TokenSet::load(file, "--auth-token-file");
    if (!tokens.ok()) return fail(std::string(tokens.status().message()));
    api_tokens = *tokens;
  }
  if (absl::Status s = service::install_reload_handler(); !s.ok()) {
    return fail(std::string(s.message()));
  }
  service::TokenReloader reloader({api_tokens, security->cluster_tokens});

  std::string db_path = config->job_store;
  if (db_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options->data_dir, ec);
    if (ec) return fail(absl::StrCat("--data-dir: cannot create '", options->data_dir, "'"));
    db_path = (std::filesystem::path(options->data_dir) / "jobs.db").string();
  }
  absl::StatusOr<std::unique_ptr<coordinator::JobStore>> store =
      coordinator::JobStore::open(db_path);
  if (!store.ok()) return fail(std::string(store.status().message()));

  service::MetricsRegistry registry;
  auto metrics = coordinator::CoordinatorMetrics::create(&registry);
  if (!metrics.ok()) return fail(std::string(metrics.status().message()));
  coordinator::WorkerRegistry workers{config->worker_expiry, config->heartbeat_interval};
  workers.set_on_expired([m = metrics->get()](coordinator::WorkerKind kind) {
    m->workers_expired->with({std::string(coordinator::worker_kind_name(kind))}).inc();
  });
  // Trainer groups meet here; declared before the cluster, which abandons groups in it.
  coordinator::RendezvousImpl rendezvous_service;
  coordinator::GrpcCluster cluster(&workers, config->trainer_timeout);
  cluster.set_client_security(security->client);
  cluster.set_on_join_failed(
      [&rendezvous_service](const std::string& group, const std::string& why) {
        rendezvous_service.abandon(group, why);
      });
  coordinator::RlLoopOptions loop_options;
  loop_options.generate_deadline = config->generate_deadline;
  loop_options.worker_wait = config->worker_wait;
  loop_options.trainer_resume_wait = config->trainer_resume;
  loop_options.store_retry_wait = config->store_retry;
  loop_options.sync_wait = config->sync_wait;
  coordinator::JobManager jobs(store->get(), &cluster, &workers, metrics->get(), loop_options);
  rl::JobPathRoots roots{config->data_root, config->models_root, config->datasets_root};
  for (auto [flag, root] :
       {std::pair{"--data-root", &roots.data_root}, std::pair{"--models-root", &roots.models_root},
        std::pair{"--datasets-root", &roots.datasets_root}}) {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::canonical(
        root->empty() ? std::filesystem::current_path() : std::filesystem::path(*root), ec);
    if (ec || !std::filesystem::is_directory(dir)) {
      return fail(absl::StrCat(flag, ": '", *root, "' is not an existing folder"));
    }
    *root = dir.string();
  }
  jobs.set_path_roots(roots);
  jobs.set_admission_limits(limits);

  service::HttpServerOptions http_options;
  http_options.host = options->listen_host;
  http_options.port = options->http_port;
  http_options.max_body_bytes = options->max_body_bytes;
  if (security->tls.enabled()) {
    http_options.tls_cert = security->tls.cert;
    http_options.tls_key = security->tls.key;
  }
  // Threads beyond the admitted calls, so calls over the limit are answered 429 at once instead
  // of waiting for a thread (and /healthz, /metrics and the console stay served).
  http_options.threads = static_cast<int>(std::min<int64_t>(
      limits.max_inflight_requests == 0 ? 64 : limits.max_inflight_requests + 8, 256));
  service::HttpServer http(http_options, &registry);
  // The job API under /v1/ needs a token when configured; /healthz, /metrics and anything else
  // (console assets) stay open.
  http.set_guard(service::bearer_guard(api_tokens, "/v1/"));
  coordinator::add_rest_routes(http, jobs);
  console::add_console_routes(http);
  absl::StatusOr<int> http_port = http.start();
  if (!http_port.ok()) return fail(absl::StrCat("--http-port: ", http_port.status().message()));

  coordinator::JobServiceImpl job_service(&jobs);
  coordinator::WorkerRegistryImpl registry_service(&workers, &jobs);
  job_service.require_tokens(api_tokens);
  registry_service.require_tokens(security->cluster_tokens);
  service::GrpcServerOptions grpc_options;
  grpc_options.address = service::listen_address(*options, options->grpc_port);
  grpc_options.credentials = security->grpc_credentials;
  rendezvous_service.require_tokens(security->cluster_tokens);
  auto grpc = service::GrpcServer::start(
      grpc_options, {&job_service, &registry_service, &rendezvous_service},
      {v1::JobService::service_full_name(), v1::WorkerRegistry::service_full_name(),
       v1::Rendezvous::service_full_name()});
  if (!grpc.ok()) return fail(absl::StrCat("--grpc-port: ", grpc.status().message()));

  jobs.refresh_gauges();
  jobs.start();
  service::log_info("coordinator", "serving",
                    {{"grpc_port", absl::StrCat((*grpc)->port())},
                     {"http_port", absl::StrCat(*http_port)},
                     {"job_store", db_path},
                     {"data_root", roots.data_root},
                     {"models_root", roots.models_root},
                     {"datasets_root", roots.datasets_root},
                     {"job_api_auth", api_tokens ? "bearer" : "off"},
                     {"cluster_auth", security->cluster_tokens ? "bearer" : "off"},
                     {"tls", !security->tls.enabled()   ? "off"
                             : security->tls.ca.empty() ? "server"
                                                        : "mutual"}});
  service::wait_for_shutdown();
  service::log_info("coordinator", "shutting down");
  const auto grace =
      std::chrono::milliseconds(static_cast<int64_t>(options->shutdown_grace_seconds * 1000));
  jobs.stop();
  (*grpc)->shutdown(grace);
  http.stop();
  service::log_info("coordinator", "stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(std::vector<std::string>(argv + 1, argv + argc)); }
