// gRPC JobService and WorkerRegistry handlers over JobManager / WorkerRegistry (see grpc_api.h).
#include "services/coordinator/grpc_api.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {
namespace {

// gRPC's trailing-metadata key for server push-back (gRPC retry design A6), in milliseconds.
constexpr char kRetryPushbackKey[] = "grpc-retry-pushback-ms";

v1::JobState to_proto(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return v1::JOB_STATE_QUEUED;
    case JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case JobState::kSucceeded:
      return v1::JOB_STATE_SUCCEEDED;
    case JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

void fill_metrics(const MetricsRow& row, v1::StepMetrics* out) {
  out->set_step(row.step);
  out->set_recorded_unix_ms(row.recorded_ms);
  for (const auto& [key, value] : row.values) (*out->mutable_values())[key] = value;
}

void fill_job(JobManager& jobs, const JobRecord& job, bool with_config, v1::Job* out) {
  out->set_id(job.id);
  out->set_state(to_proto(job.state));
  out->set_step(job.step);
  out->set_total_steps(job.total_steps);
  out->set_error(job.error);
  out->set_created_unix_ms(job.created_ms);
  out->set_updated_unix_ms(job.updated_ms);
  if (with_config) out->set_config_json(job.config_json);
  if (!job.progress.phase.empty()) {
    v1::JobProgress* p = out->mutable_progress();
    p->set_phase(job.progress.phase);
    p->set_done(job.progress.done);
    p->set_total(job.progress.total);
    p->set_detail(job.progress.detail);
    p->set_updated_unix_ms(job.progress.updated_ms);
  }
  if (auto latest = jobs.latest_metrics(job.id); latest.ok() && latest->has_value()) {
    fill_metrics(**latest, out->mutable_latest_metrics());
  }
}

grpc::Status bad_id(const std::string& id) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "id: must not be empty");
}

// Counts an INVALID_ARGUMENT answer as a rejected request
// (fp8rl_coordinator_requests_rejected_total{api="grpc"}) and passes it on.
grpc::Status counted(JobManager* jobs, grpc::Status status) {
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
      jobs->coordinator_metrics() != nullptr) {
    jobs->coordinator_metrics()->count_rejected("grpc");
  }
  return status;
}

// The gRPC status for a JobManager error; a retry hint (admission.h) also goes out as the
// trailing metadata gRPC clients read for server push-back, grpc-retry-pushback-ms.
grpc::Status to_grpc(grpc::ServerContext* context, const absl::Status& status) {
  if (std::optional<std::chrono::milliseconds> wait = retry_after_of(status)) {
    context->AddTrailingMetadata(kRetryPushbackKey, absl::StrCat(wait->count()));
  }
  return service::to_grpc_status(status);
}

// A slot for one job API call (released with `ticket`), or RESOURCE_EXHAUSTED with a retry hint.
grpc::Status admit(JobManager* jobs, grpc::ServerContext* context,
                   AdmissionControl::Ticket* ticket) {
  if (absl::Status s = jobs->admission().enter("grpc", ticket); !s.ok()) return to_grpc(context, s);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  AdmissionControl::Ticket ticket;
  if (grpc::Status admitted = admit(jobs_, context, &ticket); !admitted.ok()) return admitted;
  if (req->config().empty()) {
    return counted(jobs_, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       "config: empty; expected a job config"));
  }
  absl::StatusOr<JobRecord> job = jobs_->submit_text(req->config());
  if (!job.ok()) return counted(jobs_, to_grpc(context, job.status()));
  fill_job(*jobs_, *job, true, resp->mutable_job());
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* req,
                                    v1::Job* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  AdmissionControl::Ticket ticket;
  if (grpc::Status admitted = admit(jobs_, context, &ticket); !admitted.ok()) return admitted;
  if (req->id().empty()) return counted(jobs_, bad_id(req->id()));
  absl::StatusOr<JobRecord> job = jobs_->get(req->id());
  if (!job.ok()) return counted(jobs_, service::to_grpc_status(job.status()));
  fill_job(*jobs_, *job, true, resp);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  AdmissionControl::Ticket ticket;
  if (grpc::Status admitted = admit(jobs_, context, &ticket); !admitted.ok()) return admitted;
  std::optional<JobState> state;
  switch (req->state()) {
    case v1::JOB_STATE_UNSPECIFIED:
      break;
    case v1::JOB_STATE_QUEUED:
      state = JobState::kQueued;
      break;
    case v1::JOB_STATE_RUNNING:
      state = JobState::kRunning;
      break;
    case v1::JOB_STATE_SUCCEEDED:
      state = JobState::kSucceeded;
      break;
    case v1::JOB_STATE_FAILED:
      state = JobState::kFailed;
      break;
    case v1::JOB_STATE_CANCELLED:
      state = JobState::kCancelled;
      break;
    default:
      return counted(jobs_, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                         absl::StrCat("state: unknown value ", req->state())));
  }
  if (req->limit() < 0) {
    return counted(jobs_, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "limit: must be >= 0"));
  }
  absl::StatusOr<std::vector<JobRecord>> list = jobs_->list(state, req->limit());
  if (!list.ok()) return counted(jobs_, service::to_grpc_status(list.status()));
  for (const JobRecord& job : *list) fill_job(*jobs_, job, false, resp->add_jobs());
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* req,
                                       v1::CancelJobResponse* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  AdmissionControl::Ticket ticket;
  if (grpc::Status admitted = admit(jobs_, context, &ticket); !admitted.ok()) return admitted;
  if (req->id().empty()) return counted(jobs_, bad_id(req->id()));
  absl::StatusOr<JobRecord> job = jobs_->cancel(req->id());
  if (!job.ok()) return counted(jobs_, service::to_grpc_status(job.status()));
  fill_job(*jobs_, *job, false, resp->mutable_job());
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  AdmissionControl::Ticket ticket;
  if (grpc::Status admitted = admit(jobs_, context, &ticket); !admitted.ok()) return admitted;
  ticket.release();  // checked on arrival only: a watch may last as long as its job
  if (req->id().empty()) return counted(jobs_, bad_id(req->id()));
  int64_t last_updated = -1, last_step = -1;
  JobState last_state = JobState::kQueued;
  JobProgress last_progress;
  while (!context->IsCancelled()) {
    absl::StatusOr<JobRecord> job = jobs_->get(req->id());
    if (!job.ok()) return counted(jobs_, service::to_grpc_status(job.status()));
    auto latest = jobs_->latest_metrics(job->id);
    const int64_t latest_step = latest.ok() && latest->has_value() ? (*latest)->step : -1;
    if (last_updated < 0 || job->state != last_state || latest_step != last_step ||
        job->updated_ms != last_updated || job->progress != last_progress) {
      v1::JobEvent event;
      fill_job(*jobs_, *job, false, event.mutable_job());
      if (!writer->Write(event)) return grpc::Status::OK;  // client went away
      last_updated = job->updated_ms;
      last_state = job->state;
      last_step = latest_step;
      last_progress = job->progress;
    }
    if (is_terminal(job->state)) return grpc::Status::OK;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled by the client");
}

grpc::Status JobServiceImpl::GetJobMetrics(grpc::ServerContext* context,
                                           const v1::GetJobMetricsRequest* req,
                                           v1::GetJobMetricsResponse* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  AdmissionControl::Ticket ticket;
  if (grpc::Status admitted = admit(jobs_, context, &ticket); !admitted.ok()) return admitted;
  if (req->id().empty()) return counted(jobs_, bad_id(req->id()));
  absl::StatusOr<std::vector<MetricsRow>> rows = jobs_->metrics(req->id());
  if (!rows.ok()) return counted(jobs_, service::to_grpc_status(rows.status()));
  for (const MetricsRow& row : *rows) fill_metrics(row, resp->add_steps());
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobEvents(grpc::ServerContext* context,
                                          const v1::GetJobEventsRequest* req,
                                          v1::GetJobEventsResponse* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  AdmissionControl::Ticket ticket;
  if (grpc::Status admitted = admit(jobs_, context, &ticket); !admitted.ok()) return admitted;
  if (req->id().empty()) return counted(jobs_, bad_id(req->id()));
  absl::StatusOr<std::vector<JobEvent>> events = jobs_->events(req->id());
  if (!events.ok()) return counted(jobs_, service::to_grpc_status(events.status()));
  for (const JobEvent& event : *events) {
    v1::JobFaultEvent* out = resp->add_events();
    out->set_kind(event.kind);
    out->set_message(event.message);
    out->set_recorded_unix_ms(event.recorded_ms);
  }
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryImpl::RegisterWorker(grpc::ServerContext* context,
                                                const v1::RegisterWorkerRequest* req,
                                                v1::RegisterWorkerResponse* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  WorkerKind kind;
  switch (req->kind()) {
    case v1::WORKER_KIND_GENERATION:
      kind = WorkerKind::kGeneration;
      break;
    case v1::WORKER_KIND_TRAINER:
      kind = WorkerKind::kTrainer;
      break;
    case v1::WORKER_KIND_WEIGHT_SYNC:
      kind = WorkerKind::kWeightSync;
      break;
    default:
      return counted(jobs_, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                         "kind: must be GENERATION, TRAINER or WEIGHT_SYNC"));
  }
  if (req->address().empty() || req->address().find(':') == std::string::npos) {
    return counted(jobs_, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       absl::StrCat("address: expected host:port, got '",
                                                    req->address(), "'")));
  }
  const std::string id =
      registry_->register_worker(kind, req->address(), req->metrics_address(), req->name(),
                                 req->weight_version(), req->instance());
  resp->set_worker_id(id);
  resp->set_heartbeat_interval_ms(registry_->heartbeat_interval_ms());
  resp->set_expiry_ms(registry_->expiry_ms());
  service::log_info(
      "registry", "worker registered",
      {{"id", id}, {"kind", std::string(worker_kind_name(kind))}, {"address", req->address()}});
  jobs_->refresh_gauges();
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryImpl::Heartbeat(grpc::ServerContext* context,
                                           const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  resp->set_reregister(
      !registry_->heartbeat(req->worker_id(), req->weight_version(), req->queue_depth()));
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryImpl::Deregister(grpc::ServerContext* context,
                                            const v1::DeregisterRequest* req,
                                            v1::DeregisterResponse*) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  registry_->deregister(req->worker_id());
  service::log_info("registry", "worker deregistered", {{"id", req->worker_id()}});
  jobs_->refresh_gauges();
  return grpc::Status::OK;
}

}  // namespace fp8rl::coordinator
