// The coordinator's gRPC services on port 50051: fp8rl.v1.JobService (mirrors the REST API) and
// fp8rl.v1.WorkerRegistry (workers register and heartbeat). Failures map to status codes
// (INVALID_ARGUMENT naming the field, NOT_FOUND, FAILED_PRECONDITION); handlers never crash.
#pragma once

#include <memory>

#include "common/service/auth.h"
#include "fp8rl/v1/job_service.grpc.pb.h"
#include "fp8rl/v1/worker_registry.grpc.pb.h"
#include "services/coordinator/job_manager.h"
#include "services/coordinator/worker_registry.h"

namespace fp8rl::coordinator {

class JobServiceImpl final : public fp8rl::v1::JobService::Service {
 public:
  explicit JobServiceImpl(JobManager* jobs) : jobs_(jobs) {}
  // Every call then needs one of these bearer tokens (UNAUTHENTICATED otherwise). Before serving.
  void require_tokens(std::shared_ptr<const service::TokenSet> tokens) {
    auth_ = std::move(tokens);
  }
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*,
                         v1::CancelJobResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::JobEvent>*) override;
  grpc::Status GetJobMetrics(grpc::ServerContext*, const v1::GetJobMetricsRequest*,
                             v1::GetJobMetricsResponse*) override;
  grpc::Status GetJobEvents(grpc::ServerContext*, const v1::GetJobEventsRequest*,
                            v1::GetJobEventsResponse*) override;

 private:
  JobManager* jobs_;
  std::shared_ptr<const service::TokenSet> auth_;  // null: open
};

class WorkerRegistryImpl final : public fp8rl::v1::WorkerRegistry::Service {
 public:
  WorkerRegistryImpl(WorkerRegistry* registry, JobManager* jobs)
      : registry_(registry), jobs_(jobs) {}
  // Every call then needs the cluster token (UNAUTHENTICATED otherwise). Before serving.
  void require_tokens(std::shared_ptr<const service::TokenSet> tokens) {
    auth_ = std::move(tokens);
  }
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override;
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest*,
                          v1::DeregisterResponse*) override;

 private:
  WorkerRegistry* registry_;
  JobManager* jobs_;
  std::shared_ptr<const service::TokenSet> auth_;  // null: open
};

}  // namespace fp8rl::coordinator
