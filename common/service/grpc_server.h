// The gRPC side of every service: builds a server with the standard grpc.health.v1 service and
// server reflection enabled (so grpcurl and generic clients work), reports the bound port, and
// shuts down gracefully: health NOT_SERVING first, then in-flight calls get until a deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl::service {

// Caps gRPC's reconnect back-off (by default it grows to 2 minutes) so a client finds a restarted
// server at the same address within about `max_backoff`. Every long-lived channel between our
// services and from the CLI uses it.
void set_reconnect_backoff(grpc::ChannelArguments* args,
                           std::chrono::milliseconds initial = std::chrono::milliseconds(200),
                           std::chrono::milliseconds max_backoff = std::chrono::seconds(2));

// The per-message limit of the service-to-service data path (generation results to the
// coordinator, train batches to the trainer; docs/design/services.md "Message sizes"): the
// generation worker's and the trainer's servers and the coordinator's channels to them all use it,
// so a message one side may send the other may receive. gRPC's own default is 4 MB, which one long
// mixture-of-experts sample's routing record exceeds. Generation splits a response into messages
// under it; a train request over it fails before sending (FAILED_PRECONDITION).
inline constexpr int kDataPathMessageBytes = 256 << 20;

// Both directions of `args` to kDataPathMessageBytes.
void set_data_path_message_limits(grpc::ChannelArguments* args);

struct GrpcServerOptions {
  std::string address = "0.0.0.0:0";  // host:port; port 0 picks a free port
  // Receive and send limit per message; the data-path servers set kDataPathMessageBytes.
  int max_message_bytes = 64 << 20;
  // Null: plaintext. TLS (and mutual TLS) credentials come from grpc_server_credentials()
  // in security.h.
  std::shared_ptr<grpc::ServerCredentials> credentials = nullptr;
};

class GrpcServer {
 public:
  // Registers `services` (not owned; they must outlive the server) and starts serving.
  // `health_names`: the full names of the hosted services ("fp8rl.v1.JobService"); grpc.health.v1
  // answers SERVING for each, as for the whole server (""), until shutdown. FailedPrecondition
  // naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> start(
      const GrpcServerOptions& options, const std::vector<grpc::Service*>& services,
      const std::vector<std::string>& health_names = {});

  ~GrpcServer();
  int port() const { return port_; }
  grpc::Server* server() { return server_.get(); }

  // Marks the server NOT_SERVING, then shuts down: calls still running after `grace` are
  // cancelled. Idempotent; also run (with 1 s) by the destructor.
  void shutdown(std::chrono::milliseconds grace);

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port);
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

// absl::Status <-> grpc::Status with the same code and message (the codes share numbering).
grpc::Status to_grpc_status(const absl::Status& status);
absl::Status from_grpc_status(const grpc::Status& status);

}  // namespace fp8rl::service
