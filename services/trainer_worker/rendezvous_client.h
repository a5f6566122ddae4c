// The trainer's side of a group's rendezvous: train::RendezvousStore over the coordinator's
// fp8rl.v1.Rendezvous service (services/coordinator/rendezvous_service.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "fp8rl/v1/rendezvous.grpc.pb.h"
#include "train/collectives.h"

namespace fp8rl::trainer {

class GrpcRendezvousStore final : public train::RendezvousStore {
 public:
  explicit GrpcRendezvousStore(std::shared_ptr<grpc::Channel> channel);

  absl::Status set(const std::string& key, const std::string& value) override;
  // Waits in calls of at most 10 s until the key is set or `timeout` passed.
  absl::StatusOr<std::string> get(const std::string& key,
                                  std::chrono::milliseconds timeout) override;

 private:
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
};

}  // namespace fp8rl::trainer
