// Assembly, swap path and ordered shutdown of a generation worker (see generation_worker.h).
#include "services/generation_worker/generation_worker.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "common/service/security.h"
#include "common/status_macros.h"
#include "model/precision.h"

namespace fp8rl::generation {
namespace {

constexpr char kComponent[] = "generation-worker";

std::shared_ptr<grpc::Channel> channel_to(const std::string& address,
                                          const service::ClientSecurity& security) {
  grpc::ChannelArguments args;
  service::set_reconnect_backoff(&args);  // a restarted weight sync / coordinator is found soon
  return service::make_channel(address, args, security);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GenerationWorker>> GenerationWorker::start(
    const GenerationWorkerConfig& config) {
  FP8RL_RETURN_IF_ERROR(validate_scheduler_options(config.scheduler));
  std::unique_ptr<GenerationWorker> w(new GenerationWorker(config));
  absl::StatusOr<std::unique_ptr<GenerationMetrics>> metrics =
      GenerationMetrics::create(&w->registry_);
  if (!metrics.ok()) return metrics.status();
  w->metrics_ = std::move(*metrics);
  w->weight_recorder_ = std::make_unique<WeightPathRecorder>(w->metrics_.get());
  w->scheduler_ = std::make_unique<Scheduler>(config.scheduler, w->metrics_.get());
  w->weights_ = std::make_unique<WeightDoubleBuffer>(config.precision);
  GenerationWorker* self = w.get();
  w->service_ = std::make_unique<GenerationServiceImpl>(
      w->scheduler_.get(), w->metrics_.get(), config.max_samples_per_request, [self] {
        service::WorkerRegistration* registration = self->registration_ptr_.load();
        return registration != nullptr ? registration->worker_id() : std::string();
      });

  // TLS and the cluster token (security.h): Generate and GetStatus then need the token, and the
  // calls to weight sync and the coordinator carry it.
  absl::StatusOr<service::ServiceSecurity> security =
      service::load_service_security(config.service);
  if (!security.ok()) return security.status();
  if (security->cluster_tokens != nullptr) {
    w->service_->require_tokens(security->cluster_tokens);
    w->reloader_ = std::make_unique<service::TokenReloader>(
        std::vector<std::shared_ptr<service::TokenSet>>{security->cluster_tokens});
  }

  service::GrpcServerOptions grpc_options;
  grpc_options.max_message_bytes = service::kDataPathMessageBytes;
  grpc_options.address = service::listen_address(config.service, config.service.grpc_port);
  grpc_options.credentials = security->grpc_credentials;
  std::vector<grpc::Service*> services = {w->service_.get()};
  std::vector<std::string> service_names = {v1::GenerationService::service_full_name()};
  if (config.weight_relay) {
    w->relay_ =
        std::make_unique<weight_sync::WeightRelay>(weight_sync::relay_options(), &w->registry_);
    if (security->cluster_tokens != nullptr) {
      w->relay_->service().require_tokens(security->cluster_tokens);
    }
    services.push_back(&w->relay_->service());
    service_names.push_back(v1::WeightSyncService::service_full_name());
  }
  absl::StatusOr<std::unique_ptr<service::GrpcServer>> grpc =
      service::GrpcServer::start(grpc_options, services, service_names);
  if (!grpc.ok()) return grpc.status();
  w->grpc_ = std::move(*grpc);

  service::HttpServerOptions http_options;
  http_options.host = config.service.listen_host;
  http_options.port = config.metrics_port;
  http_options.max_body_bytes = config.service.max_body_bytes;
  if (security->tls.enabled()) {
    http_options.tls_cert = security->tls.cert;
    http_options.tls_key = security->tls.key;
  }
  w->http_ = std::make_unique<service::HttpServer>(http_options, &w->registry_,
                                                   [self] { return !self->shut_down_.load(); });
  absl::StatusOr<int> http_port = w->http_->start();
  if (!http_port.ok()) return http_port.status();  // the destructor stops the gRPC server
  w->http_port_ = *http_port;

  const std::string address = service::advertise_address(config.service, w->grpc_->port());
  w->name_ = config.worker_id.empty() ? address : config.worker_id;

  weight_sync::SubscriberOptions sub_options;
  sub_options.worker_id = w->name_;
  sub_options.same_host = config.weight_same_host == weight_sync::SameHostMode::kAuto;
  if (w->relay_ != nullptr) {
    sub_options.relay_address = address;
    sub_options.relay_stall_timeout = std::chrono::milliseconds(config.relay_stall_ms);
    sub_options.tap = w->relay_.get();
    sub_options.connect = [client = security->client](const std::string& upstream) {
      return channel_to(upstream, client);
    };
  }
  weight_sync::InPlaceReceiver receiver;
  receiver.target = [self](const v1::VersionManifest& manifest) {
    return self->weights_->receive_target(manifest.total_bytes());
  };
  receiver.install = [self](const v1::VersionManifest& manifest, std::span<const char> payload) {
    absl::StatusOr<model::WeightView> view = weight_sync::to_weight_view(manifest, payload);
    if (!view.ok()) return view.status();
    return self->install_view(*view);
  };
  receiver.base = [self](int64_t version) { return self->weights_->payload_of(version); };
  w->subscriber_ = std::make_unique<weight_sync::WeightSubscriber>(
      channel_to(config.weight_sync, security->client), sub_options, std::move(receiver));
  FP8RL_RETURN_IF_ERROR(w->subscriber_->start());

  service::WorkerRegistrationOptions reg_options;
  reg_options.coordinator = config.service.coordinator;
  reg_options.kind = v1::WORKER_KIND_GENERATION;
  reg_options.name = w->name_;
  reg_options.address = address;
  reg_options.metrics_address = service::advertise_address(config.service, w->http_port_);
  reg_options.log_component = kComponent;
  reg_options.security = security->client;
  reg_options.load = [self] {
    const Scheduler::Snapshot s = self->scheduler_->snapshot();
    return service::WorkerLoad{s.weight_version,
                               static_cast<int32_t>(s.queued_samples + s.running_samples)};
  };
  w->registration_ = std::make_unique<service::WorkerRegistration>(std::move(reg_options));
  FP8RL_RETURN_IF_ERROR(w->registration_->start());
  w->registration_ptr_.store(w->registration_.get());

  service::log_info(kComponent, "serving",
                    {{"name", w->name_},
                     {"grpc_port", absl::StrCat(w->grpc_->port())},
                     {"metrics_port", absl::StrCat(w->http_port_)},
                     {"coordinator", config.service.coordinator},
                     {"weight_sync", config.weight_sync}});
  return w;
}

GenerationWorker::~GenerationWorker() { shutdown(std::chrono::milliseconds(0)); }

absl::Status GenerationWorker::install_weights(model::WeightSet set) {
  FP8RL_RETURN_IF_ERROR(model::validate_weight_set(set));
  absl::StatusOr<model::WeightView> view = model::view_of(set);
  if (!view.ok()) return view.status();
  return install_view(*view);
}

absl::Status GenerationWorker::install_view(const model::WeightView& view) {
  const int64_t version = view.version;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<LoadedWeights> loaded = weights_->install(view);
  const double install_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  record_weight_path();
  if (!loaded.ok()) {
    service::log_warn(
        kComponent, "weight version rejected",
        {{"version", absl::StrCat(version)}, {"error", std::string(loaded.status().message())}});
    return loaded.status();
  }
  metrics_->weight_install_seconds->get().observe(install_seconds);
  const model::PrecisionPolicy policy = loaded->policy;
  const model::Model* served = loaded->model.get();
  FP8RL_RETURN_IF_ERROR(scheduler_->install(std::move(*loaded)));
  weights_->served(served);
  service::log_info(kComponent, "weights swapped in",
                    {{"version", absl::StrCat(version)},
                     {"linear", std::string(model::precision_name(policy.linear))},
                     {"kv_cache", std::string(model::kv_cache_dtype_name(policy.kv_cache))},
                     {"pow2_scales", policy.pow2_scales ? "true" : "false"},
                     {"bf16_first_layers", absl::StrCat(policy.bf16_first_layers)},
                     {"bf16_last_layers", absl::StrCat(policy.bf16_last_layers)}});
  return absl::OkStatus();
}

void GenerationWorker::record_weight_path() {
  std::lock_guard lock(weight_path_mu_);
  const WeightDoubleBuffer::Stats buffer = weights_->stats();
  WeightPathCounts counts;
  counts.installs = buffer.installs;
  counts.in_place_installs = buffer.in_place_installs;
  counts.receive_buffer_bytes = buffer.buffer_bytes;
  if (subscriber_) {
    const weight_sync::WeightSubscriber::Stats sub = subscriber_->stats();
    counts.delta_versions = sub.versions_from_delta;
    counts.delta_fallbacks = sub.delta_fallbacks;
    counts.delta_bytes = sub.delta_bytes_received;
    counts.last_delta_seconds = sub.delta_decode_seconds;
    counts.stream_reconnects = std::max<int64_t>(0, sub.streams_opened - 1);
  }
  weight_recorder_->record(counts);
}

void GenerationWorker::shutdown(std::chrono::milliseconds grace) {
  std::lock_guard lock(shutdown_mu_);
  if (shut_down_.exchange(true)) return;
  // 1. Stop admitting; running and queued samples get `grace` to finish (their callers get the
  //    results), the rest fail with UNAVAILABLE so the coordinator re-dispatches them.
  if (scheduler_) scheduler_->shutdown(grace);
  // 2. No more weight versions (an install waiting for the drain has returned by now); the
  //    workers behind this one's relay go back to weight sync.
  if (relay_) relay_->begin_shutdown();
  if (subscriber_) subscriber_->stop();
  // 3. Leave the registry so no new work is sent here.
  if (registration_) registration_->stop(/*deregister=*/true);
  // 4. The handlers have their final status; close the servers.
  if (grpc_) grpc_->shutdown(std::chrono::milliseconds(1000));
  if (http_) http_->stop();
  service::log_info(kComponent, "stopped", {{"name", name_}});
}

}  // namespace fp8rl::generation
