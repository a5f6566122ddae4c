// The fp8rl.v1.GenerationService handlers: validate a Generate call, hand its samples to the
// shared scheduler (continuous batching with every other in-flight call), stream each sample's
// result as it finishes, and drop the call's samples when the client cancels or its deadline
// passes. GetStatus reports the held version, load and readiness.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>

#include "fp8rl/v1/generation.grpc.pb.h"
#include "services/generation_worker/generation_metrics.h"
#include "services/generation_worker/scheduler.h"

namespace fp8rl::generation {

class GenerationServiceImpl final : public v1::GenerationService::Service {
 public:
  // `scheduler` and `metrics` (nullable) must outlive the service. `worker_id` gives the registry
  // id for GetStatus ("" while unregistered).
  GenerationServiceImpl(Scheduler* scheduler, GenerationMetrics* metrics,
                        int64_t max_samples_per_request, std::function<std::string()> worker_id);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetGenerationStatusRequest* request,
                         v1::GenerationStatus* response) override;

 private:
  Scheduler* scheduler_;
  GenerationMetrics* metrics_;
  const int64_t max_samples_per_request_;
  std::function<std::string()> worker_id_;
};

}  // namespace fp8rl::generation
