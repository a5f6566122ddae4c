// Generate and GetStatus over gRPC (see generation_service.h).
#include "services/generation_worker/generation_service.h"

#include <google/protobuf/io/coded_stream.h>

#include <chrono>
#include <utility>

#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "services/generation_worker/request_validation.h"

namespace fp8rl::generation {
namespace {

// How often a waiting handler checks for client cancellation.
constexpr std::chrono::milliseconds kPollInterval{20};

v1::FinishReason to_proto(model::FinishReason reason) {
  return reason == model::FinishReason::kStop ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH;
}

}  // namespace

std::vector<v1::GenerateResponse> result_messages(std::vector<SampleOutcome>& ready,
                                                  size_t max_bytes) {
  std::vector<v1::GenerateResponse> out;
  size_t bytes = 0;  // encoded size of out.back()
  for (SampleOutcome& outcome : ready) {
    v1::SampleResult r;
    r.set_sample_id(std::move(outcome.sample_id));
    r.mutable_tokens()->Add(outcome.tokens.begin(), outcome.tokens.end());
    r.mutable_logprobs()->Add(outcome.logprobs.begin(), outcome.logprobs.end());
    r.mutable_routed_experts()->Add(outcome.routing.begin(), outcome.routing.end());
    r.set_weight_version(outcome.weight_version);
    r.set_finish_reason(to_proto(outcome.reason));
    // A repeated message field costs its tag (1 byte), the length varint and the payload.
    const size_t size = r.ByteSizeLong();
    const size_t added = 1 + google::protobuf::io::CodedOutputStream::VarintSize64(size) + size;
    if (out.empty() || (bytes + added > max_bytes && bytes > 0)) {
      out.emplace_back();
      bytes = 0;
    }
    *out.back().add_results() = std::move(r);
    bytes += added;
  }
  return out;
}

GenerationServiceImpl::GenerationServiceImpl(Scheduler* scheduler, GenerationMetrics* metrics,
                                             int64_t max_samples_per_request,
                                             std::function<std::string()> worker_id)
    : scheduler_(scheduler),
      metrics_(metrics),
      max_samples_per_request_(max_samples_per_request),
      worker_id_(std::move(worker_id)) {}

grpc::Status GenerationServiceImpl::Generate(grpc::ServerContext* context,
                                             const v1::GenerateRequest* request,
                                             grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  const auto start = std::chrono::steady_clock::now();
  auto finish = [&](const grpc::Status& status) {
    if (metrics_) {
      // A call its client abandoned (cancelled, deadline passed) is not a worker error.
      const bool abandoned = status.error_code() == grpc::StatusCode::CANCELLED ||
                             status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      metrics_->requests->with({status.ok() ? "ok" : abandoned ? "cancelled" : "error"}).inc();
      if (status.ok()) {
        metrics_->request_seconds->get().observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
    if (!status.ok()) {
      service::log_debug(
          "generation-worker", "generate failed",
          {{"request_id", request->request_id()}, {"error", status.error_message()}});
    }
    return status;
  };

  std::shared_ptr<const model::Model> model = scheduler_->model();
  if (model == nullptr) {
    return finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no weights yet"));
  }
  absl::StatusOr<std::vector<SampleSpec>> samples =
      validate_generate_request(*request, *model, max_samples_per_request_);
  if (!samples.ok()) return finish(service::to_grpc_status(samples.status()));
  absl::StatusOr<std::shared_ptr<GenerationRequest>> pending =
      scheduler_->submit(std::move(*samples), request->min_weight_version());
  if (!pending.ok()) return finish(service::to_grpc_status(pending.status()));
  GenerationRequest& job = **pending;

  while (true) {
    // IsCancelled() is also true once the call's deadline has passed.
    if (context->IsCancelled()) {
      scheduler_->cancel(job);
      return finish(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled by the client"));
    }
    std::vector<SampleOutcome> ready = job.take(kPollInterval);
    for (const v1::GenerateResponse& response :
         result_messages(ready, service::kDataPathMessageBytes)) {
      if (!writer->Write(response)) {
        scheduler_->cancel(job);
        return finish(grpc::Status(grpc::StatusCode::CANCELLED, "client stream closed"));
      }
    }
    if (job.done()) break;
  }
  return finish(service::to_grpc_status(job.status()));
}

grpc::Status GenerationServiceImpl::GetStatus(grpc::ServerContext* context,
                                              const v1::GetGenerationStatusRequest*,
                                              v1::GenerationStatus* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  const Scheduler::Snapshot s = scheduler_->snapshot();
  response->set_worker_id(worker_id_ ? worker_id_() : std::string());
  response->set_weight_version(s.weight_version);
  response->set_weight_format(s.weight_format);
  response->set_queued_samples(static_cast<int32_t>(s.queued_samples));
  response->set_running_samples(static_cast<int32_t>(s.running_samples));
  response->set_kv_cache_usage(s.kv_cache_usage);
  response->set_generated_tokens_total(s.generated_tokens);
  response->set_ready(s.ready);
  return grpc::Status::OK;
}

}  // namespace fp8rl::generation
