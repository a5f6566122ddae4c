// The fp8rl.v1.TrainerService gRPC implementation: a thin adapter that forwards each RPC to the
// Trainer and maps its absl::Status to the gRPC status with the same code and message. Handlers
// never take the process down; GetStatus answers while an update is running.
#pragma once

#include <grpcpp/grpcpp.h>

#include "common/service/auth.h"
#include "fp8rl/v1/trainer.grpc.pb.h"
#include "services/trainer_worker/trainer.h"

namespace fp8rl::trainer {

class TrainerServiceImpl final : public v1::TrainerService::Service {
 public:
  // `trainer` must outlive the service.
  explicit TrainerServiceImpl(Trainer* trainer) : trainer_(trainer) {}
  // Every call then needs the cluster token (UNAUTHENTICATED otherwise). Before serving.
  void require_tokens(std::shared_ptr<const service::TokenSet> tokens) {
    auth_ = std::move(tokens);
  }

  grpc::Status InitPolicy(grpc::ServerContext* context, const v1::InitPolicyRequest* request,
                          v1::InitPolicyResponse* response) override;
  grpc::Status ComputeLogprobs(grpc::ServerContext* context,
                               const v1::ComputeLogprobsRequest* request,
                               v1::ComputeLogprobsResponse* response) override;
  grpc::Status TrainStep(grpc::ServerContext* context, const v1::TrainStepRequest* request,
                         v1::TrainStepResponse* response) override;
  grpc::Status SftStep(grpc::ServerContext* context, const v1::SftStepRequest* request,
                       v1::SftStepResponse* response) override;
  grpc::Status Publish(grpc::ServerContext* context, const v1::PublishRequest* request,
                       v1::PublishResponse* response) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* context,
                              const v1::SaveCheckpointRequest* request,
                              v1::SaveCheckpointResponse* response) override;
  grpc::Status LoadCheckpoint(grpc::ServerContext* context,
                              const v1::LoadCheckpointRequest* request,
                              v1::LoadCheckpointResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetTrainerStatusRequest* request,
                         v1::TrainerStatus* response) override;
  grpc::Status JoinGroup(grpc::ServerContext* context, const v1::JoinGroupRequest* request,
                         v1::JoinGroupResponse* response) override;

 private:
  Trainer* trainer_;
  std::shared_ptr<const service::TokenSet> auth_;  // null: open
};

}  // namespace fp8rl::trainer
