// gRPC client of the coordinator's rendezvous store (see rendezvous_client.h).
#include "services/trainer_worker/rendezvous_client.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"

namespace fp8rl::trainer {

GrpcRendezvousStore::GrpcRendezvousStore(std::shared_ptr<grpc::Channel> channel)
    : stub_(v1::Rendezvous::NewStub(channel)) {}

absl::Status GrpcRendezvousStore::set(const std::string& key, const std::string& value) {
  v1::RendezvousSetRequest request;
  request.set_key(key);
  request.set_value(value);
  v1::RendezvousSetResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return service::from_grpc_status(stub_->Set(&context, request, &response));
}

absl::StatusOr<std::string> GrpcRendezvousStore::get(const std::string& key,
                                                     std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const auto wait =
        std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(10000));
    v1::RendezvousGetRequest request;
    request.set_key(key);
    request.set_wait_ms(wait.count());
    v1::RendezvousGetResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(5));
    const grpc::Status s = stub_->Get(&context, request, &response);
    if (s.ok()) return response.value();
    const bool retry = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                       s.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!retry || Clock::now() >= deadline) {
      return absl::Status(service::from_grpc_status(s).code(),
                          absl::StrCat("rendezvous key '", key, "': ", s.error_message()));
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

}  // namespace fp8rl::trainer
