// The fp8rl.v1.GenerationService handlers: validate a Generate call, hand its samples to the
// shared scheduler (continuous batching with every other in-flight call), stream each sample's
// result as it finishes, and drop the call's samples when the client cancels or its deadline
// passes. GetStatus reports the held version, load and readiness.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/service/auth.h"
#include "fp8rl/v1/generation.grpc.pb.h"
#include "services/generation_worker/generation_metrics.h"
#include "services/generation_worker/scheduler.h"

namespace fp8rl::generation {

// Finished samples as Generate stream messages, in order, each message at most `max_bytes` when
// encoded (docs/design/services.md "Message sizes": long mixture-of-experts samples carry megabytes
// of routing record): as many samples per message as fit, one per message when a sample alone is
// larger (the channel limit then refuses it). The outcomes are moved from.
std::vector<v1::GenerateResponse> result_messages(std::vector<SampleOutcome>& ready,
                                                  size_t max_bytes);

class GenerationServiceImpl final : public v1::GenerationService::Service {
 public:
  // `scheduler` and `metrics` (nullable) must outlive the service. `worker_id` gives the registry
  // id for GetStatus ("" while unregistered).
  GenerationServiceImpl(Scheduler* scheduler, GenerationMetrics* metrics,
                        int64_t max_samples_per_request, std::function<std::string()> worker_id);
  // Every call then needs the cluster token (UNAUTHENTICATED otherwise). Before serving.
  void require_tokens(std::shared_ptr<const service::TokenSet> tokens) {
    auth_ = std::move(tokens);
  }

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
  std::shared_ptr<const service::TokenSet> auth_;  // null: open
};

}  // namespace fp8rl::generation
