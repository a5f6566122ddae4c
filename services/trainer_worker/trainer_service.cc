// TrainerService handlers: call the Trainer, log the outcome, map the status.
#include "services/trainer_worker/trainer_service.h"

#include <exception>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"

namespace fp8rl::trainer {
namespace {

constexpr char kLog[] = "trainer";

// Runs `call` unless the client already gave up; moves the result into `response`. A thrown
// exception (e.g. std::bad_alloc on a huge batch) becomes INTERNAL instead of ending the process.
template <typename Response, typename Call>
grpc::Status serve(const char* rpc, grpc::ServerContext* context, Response* response, Call call) {
  if (context->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled by the client");
  }
  absl::Status status;
  try {
    absl::StatusOr<Response> result = call();
    if (result.ok()) {
      *response = std::move(*result);
      return grpc::Status::OK;
    }
    status = result.status();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat(rpc, ": ", e.what()));
  }
  service::log_warn(kLog, "request failed",
                    {{"rpc", rpc},
                     {"code", absl::StatusCodeToString(status.code())},
                     {"error", std::string(status.message())}});
  return service::to_grpc_status(status);
}

}  // namespace

grpc::Status TrainerServiceImpl::InitPolicy(grpc::ServerContext* context,
                                            const v1::InitPolicyRequest* request,
                                            v1::InitPolicyResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("InitPolicy", context, response, [&] {
    absl::StatusOr<v1::InitPolicyResponse> r = trainer_->init_policy(*request);
    if (r.ok()) {
      service::log_info(kLog, "policy initialized",
                        {{"job", request->job_id()},
                         {"version", absl::StrCat(r->version())},
                         {"parameters", absl::StrCat(r->num_parameters())}});
    }
    return r;
  });
}

grpc::Status TrainerServiceImpl::ComputeLogprobs(grpc::ServerContext* context,
                                                 const v1::ComputeLogprobsRequest* request,
                                                 v1::ComputeLogprobsResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("ComputeLogprobs", context, response,
               [&] { return trainer_->compute_logprobs(*request); });
}

grpc::Status TrainerServiceImpl::TrainStep(grpc::ServerContext* context,
                                           const v1::TrainStepRequest* request,
                                           v1::TrainStepResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("TrainStep", context, response, [&] {
    absl::StatusOr<v1::TrainStepResponse> r = trainer_->train_step(*request);
    if (r.ok()) {
      service::log_info(
          kLog, "train step",
          {{"job", request->job_id()},
           {"step", absl::StrCat(request->step())},
           {"loss", absl::StrCat(r->loss())},
           {"grad_norm", absl::StrCat(r->grad_norm())},
           {"tokens", absl::StrCat(r->tokens())},
           {"token_mult_prob_error", absl::StrCat(r->mismatch().token_mult_prob_error())}});
    }
    return r;
  });
}

grpc::Status TrainerServiceImpl::SftStep(grpc::ServerContext* context,
                                         const v1::SftStepRequest* request,
                                         v1::SftStepResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("SftStep", context, response, [&] { return trainer_->sft_step(*request); });
}

grpc::Status TrainerServiceImpl::Publish(grpc::ServerContext* context,
                                         const v1::PublishRequest* request,
                                         v1::PublishResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("Publish", context, response, [&] {
    absl::StatusOr<v1::PublishResponse> r = trainer_->publish(*request);
    if (r.ok()) {
      service::log_info(kLog, "published",
                        {{"version", absl::StrCat(r->version())},
                         {"bytes", absl::StrCat(r->bytes())},
                         {"quantize_seconds", absl::StrCat(r->quantize_seconds())},
                         {"calibrate_seconds", absl::StrCat(r->calibrate_seconds())},
                         {"upload_seconds", absl::StrCat(r->upload_seconds())}});
    }
    return r;
  });
}

grpc::Status TrainerServiceImpl::SaveCheckpoint(grpc::ServerContext* context,
                                                const v1::SaveCheckpointRequest* request,
                                                v1::SaveCheckpointResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("SaveCheckpoint", context, response, [&] {
    absl::StatusOr<v1::SaveCheckpointResponse> r = trainer_->save_checkpoint(*request);
    if (r.ok()) {
      service::log_info(kLog, "checkpoint saved",
                        {{"path", r->path()}, {"version", absl::StrCat(r->version())}});
    }
    return r;
  });
}

grpc::Status TrainerServiceImpl::LoadCheckpoint(grpc::ServerContext* context,
                                                const v1::LoadCheckpointRequest* request,
                                                v1::LoadCheckpointResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("LoadCheckpoint", context, response, [&] {
    absl::StatusOr<v1::LoadCheckpointResponse> r = trainer_->load_checkpoint(*request);
    if (r.ok()) {
      service::log_info(kLog, "checkpoint loaded",
                        {{"path", request->path()}, {"version", absl::StrCat(r->version())}});
    }
    return r;
  });
}

grpc::Status TrainerServiceImpl::GetStatus(grpc::ServerContext* context,
                                           const v1::GetTrainerStatusRequest* request,
                                           v1::TrainerStatus* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  *response = trainer_->status();
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::JoinGroup(grpc::ServerContext* context,
                                           const v1::JoinGroupRequest* request,
                                           v1::JoinGroupResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  return serve("JoinGroup", context, response, [&] { return trainer_->join_group(*request); });
}

}  // namespace fp8rl::trainer
