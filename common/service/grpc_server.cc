// gRPC server construction with health and reflection (see grpc_server.h).
#include "common/service/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

namespace fp8rl::service {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::start(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services,
    const std::vector<std::string>& health_names) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC sets SO_REUSEADDR on its listeners (a restarted server re-binds at once despite
  // TIME_WAIT sockets) and, by default, SO_REUSEPORT, which would let a second server bind the
  // same port and take part of its connections: turned off, so a port in use is an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(
      options.address,
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials(),
      &port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::FailedPreconditionError(absl::StrCat("grpc: cannot listen on ", options.address));
  }
  if (auto* health = server->GetHealthCheckService()) {
    for (const std::string& name : health_names) health->SetServingStatus(name, true);
    health->SetServingStatus(true);  // the whole server, and every name set above
  }
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), port));
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, int port)
    : server_(std::move(server)), port_(port) {}

GrpcServer::~GrpcServer() { shutdown(std::chrono::seconds(1)); }

void GrpcServer::shutdown(std::chrono::milliseconds grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
}

void set_reconnect_backoff(grpc::ChannelArguments* args, std::chrono::milliseconds initial,
                           std::chrono::milliseconds max_backoff) {
  args->SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(initial.count()));
  args->SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(initial.count()));
  args->SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(max_backoff.count()));
}

void set_data_path_message_limits(grpc::ChannelArguments* args) {
  args->SetMaxReceiveMessageSize(kDataPathMessageBytes);
  args->SetMaxSendMessageSize(kDataPathMessageBytes);
}

grpc::Status to_grpc_status(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status from_grpc_status(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace fp8rl::service
