// The real cluster behind RlLoop: workers found in the WorkerRegistry, reached through gRPC
// clients of fp8rl.v1.GenerationService and fp8rl.v1.TrainerService (channels cached per address).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/service/security.h"
#include "services/coordinator/rl_loop.h"
#include "services/coordinator/worker_registry.h"

namespace fp8rl::coordinator {

class GrpcCluster final : public Cluster {
 public:
  // rpc_timeout bounds every unary trainer call (a training step on CPU can take minutes);
  // group_timeout bounds forming a trainer group and each of its collectives.
  GrpcCluster(WorkerRegistry* registry, std::chrono::milliseconds rpc_timeout,
              std::chrono::milliseconds group_timeout = std::chrono::seconds(60));

  std::vector<WorkerRef> live_generation_workers() override;
  bool is_live(const std::string& worker_id) override;
  std::shared_ptr<GenerationClient> generation_client(const WorkerRef& worker) override;
  absl::StatusOr<std::shared_ptr<TrainerClient>> trainer() override;
  // The first `size` live trainers by name (rank = position), joined into a new group.
  absl::StatusOr<std::shared_ptr<TrainerClient>> trainer_group(int size,
                                                               const std::string& shard) override;

  // Called with a group id and a reason when a rank could not join that group, so the ranks
  // that did stop waiting for it (RendezvousImpl::abandon). Before the first call; optional.
  void set_on_join_failed(std::function<void(const std::string&, const std::string&)> f) {
    on_join_failed_ = std::move(f);
  }

  // TLS and the cluster token for calls to workers (security.h). Before the first call.
  void set_client_security(service::ClientSecurity security) { security_ = std::move(security); }

 private:
  std::shared_ptr<grpc::Channel> channel(const std::string& address);

  WorkerRegistry* registry_;
  std::chrono::milliseconds rpc_timeout_;
  service::ClientSecurity security_;  // set before serving, read-only after
  std::mutex mu_;                     // guards channels_ (held only to look up or insert a channel)
  std::chrono::milliseconds group_timeout_;
  std::function<void(const std::string&, const std::string&)> on_join_failed_;  // read-only
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // guarded by mu_; by address
};

}  // namespace fp8rl::coordinator
