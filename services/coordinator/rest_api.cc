// REST handlers over JobManager (see rest_api.h).
#include "services/coordinator/rest_api.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/service/log.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/metrics_downsample.h"

namespace fp8rl::coordinator {
namespace {

service::HttpResponse json_response(int status, const nlohmann::json& body) {
  return {status, body.dump(), "application/json"};
}

service::HttpResponse error_response(const absl::Status& status) {
  service::HttpResponse response =
      service::json_error(http_status_for(status), std::string(status.message()));
  if (std::optional<std::chrono::milliseconds> wait = retry_after_of(status)) {
    // Whole seconds, rounded up, at least 1 (RFC 9110 section 10.2.3).
    response.headers["Retry-After"] =
        absl::StrCat(std::max<int64_t>(1, (wait->count() + 999) / 1000));
  }
  return response;
}

// True when the request says its body is YAML (Content-Type application/yaml, text/yaml, or
// application/x-yaml, parameters such as "; charset=utf-8" allowed).
bool is_yaml_body(const service::HttpRequest& req) {
  auto it = req.headers.find("content-type");
  if (it == req.headers.end()) return false;
  const std::string type = it->second.substr(0, it->second.find(';'));
  return type == "application/yaml" || type == "text/yaml" || type == "application/x-yaml";
}

// A YAML job config (the console's submit page, `curl --data-binary @job.yaml`): the same
// validation as the gRPC SubmitJob, errors naming the field.
service::HttpResponse submit_yaml(JobManager& jobs, const service::HttpRequest& req) {
  if (req.body.find_first_not_of(" \t\r\n") == std::string::npos)
    return service::json_error(400, "body: empty; expected a job config as YAML");
  absl::StatusOr<JobRecord> job = jobs.submit_text(req.body);
  if (!job.ok()) return error_response(job.status());
  return json_response(201, {{"id", job->id}, {"state", std::string(job_state_name(job->state))}});
}

service::HttpResponse submit(JobManager& jobs, const service::HttpRequest& req) {
  if (is_yaml_body(req)) return submit_yaml(jobs, req);
  const size_t first = req.body.find_first_not_of(" \t\r\n");
  if (first == std::string::npos)
    return service::json_error(400, "body: empty; expected a job config as JSON");
  if (req.body[first] != '{') {
    return service::json_error(400, "body: expected a JSON object (the job config)");
  }
  absl::StatusOr<nlohmann::ordered_json> json = parse_json_strict(req.body, "body");
  if (!json.ok()) return error_response(json.status());
  std::vector<std::string> warnings;
  absl::StatusOr<rl::JobConfig> config = rl::job_config_from_json(*json, &warnings);
  if (!config.ok()) return error_response(config.status());
  for (const std::string& w : warnings) service::log_warn("rest", w);
  absl::StatusOr<JobRecord> job = jobs.submit(*config);
  if (!job.ok()) return error_response(job.status());
  return json_response(201, {{"id", job->id}, {"state", std::string(job_state_name(job->state))}});
}

// GET /v1/jobs/{id}/metrics[?max_points=N]: the history in step order, thinned per metric when
// max_points is given (then "recorded_rows" says how many rows the store holds).
service::HttpResponse metrics_history(JobManager& jobs, const service::HttpRequest& req) {
  int64_t max_points = 0;
  if (auto it = req.query.find("max_points"); it != req.query.end()) {
    if (!absl::SimpleAtoi(it->second, &max_points) || max_points < 2) {
      return service::json_error(
          400, absl::StrCat("max_points: expected an integer >= 2, got '", it->second, "'"));
    }
  }
  // The tag comes from one cheap query, so a poll of an unchanged long history (the console's)
  // is answered 304 without reading its rows.
  absl::StatusOr<JobStore::MetricsFingerprint> fingerprint =
      jobs.metrics_fingerprint(req.params[0]);
  if (!fingerprint.ok()) return error_response(fingerprint.status());
  const std::string etag = absl::StrCat("\"m", fingerprint->rows, "-", fingerprint->max_step, "-",
                                        fingerprint->max_recorded_ms, "-", max_points, "\"");
  if (service::http_matches_etag(req, etag)) {
    service::HttpResponse not_modified{304, "", "application/json"};
    not_modified.headers["ETag"] = etag;
    return not_modified;
  }
  absl::StatusOr<std::vector<MetricsRow>> rows = jobs.metrics(req.params[0]);
  if (!rows.ok()) return error_response(rows.status());
  const size_t recorded = rows->size();
  if (max_points > 0) *rows = downsample_metrics(*rows, max_points);
  nlohmann::json out = nlohmann::json::array();
  for (const MetricsRow& row : *rows) out.push_back(metrics_row_to_json(row));
  nlohmann::json body = {{"id", req.params[0]}, {"steps", out}};
  if (max_points > 0) body["recorded_rows"] = recorded;
  service::HttpResponse response = json_response(200, body);
  response.headers["ETag"] = etag;
  return response;
}

// A job API route: holds an admission slot while the handler runs (429 with Retry-After when
// none is free, admission.h) and counts the route's 400 answers as rejected requests
// (fp8rl_coordinator_requests_rejected_total{api="rest"}).
service::HttpHandler counting_rejects(JobManager& jobs, service::HttpHandler handler) {
  return [&jobs, handler = std::move(handler)](const service::HttpRequest& req) {
    AdmissionControl::Ticket ticket;
    if (absl::Status s = jobs.admission().enter("rest", &ticket); !s.ok()) {
      return error_response(s);
    }
    service::HttpResponse response = handler(req);
    if (response.status == 400 && jobs.coordinator_metrics() != nullptr) {
      jobs.coordinator_metrics()->count_rejected("rest");
    }
    return response;
  };
}

}  // namespace

service::HttpResponse submit_job_request(JobManager& jobs, const service::HttpRequest& req) {
  return submit(jobs, req);
}

int http_status_for(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

nlohmann::json metrics_row_to_json(const MetricsRow& row) {
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [key, value] : row.values) values[key] = value;
  return {{"step", row.step}, {"metrics", values}, {"recorded_unix_ms", row.recorded_ms}};
}

nlohmann::json job_to_json(const JobRecord& job, const std::optional<MetricsRow>& latest,
                           bool with_config) {
  nlohmann::json out = {{"id", job.id},
                        {"state", std::string(job_state_name(job.state))},
                        {"step", job.step},
                        {"total_steps", job.total_steps},
                        {"error", job.error},
                        {"created_unix_ms", job.created_ms},
                        {"updated_unix_ms", job.updated_ms}};
  out["latest_metrics"] = latest ? metrics_row_to_json(*latest) : nlohmann::json(nullptr);
  if (job.progress.phase.empty()) {
    out["progress"] = nullptr;
  } else {
    out["progress"] = {{"phase", job.progress.phase},
                       {"done", job.progress.done},
                       {"total", job.progress.total},
                       {"detail", job.progress.detail},
                       {"updated_unix_ms", job.progress.updated_ms}};
  }
  if (with_config) {
    out["config"] = nlohmann::json::parse(job.config_json, nullptr, false);
  }
  return out;
}

void add_rest_routes(service::HttpServer& server, JobManager& jobs) {
  server.post("/v1/jobs", counting_rejects(jobs, [&jobs](const service::HttpRequest& req) {
                return submit(jobs, req);
              }));

  server.get(
      "/v1/jobs", counting_rejects(jobs, [&jobs](const service::HttpRequest& req) {
        std::optional<JobState> state;
        if (auto it = req.query.find("state"); it != req.query.end() && !it->second.empty()) {
          absl::StatusOr<JobState> parsed = parse_job_state(it->second);
          if (!parsed.ok()) return error_response(parsed.status());
          state = *parsed;
        }
        int64_t limit = 0;
        if (auto it = req.query.find("limit"); it != req.query.end()) {
          if (!absl::SimpleAtoi(it->second, &limit) || limit < 0) {
            return service::json_error(
                400, absl::StrCat("limit: expected an integer >= 0, got '", it->second, "'"));
          }
        }
        absl::StatusOr<std::vector<JobRecord>> list = jobs.list(state, limit);
        if (!list.ok()) return error_response(list.status());
        nlohmann::json out = nlohmann::json::array();
        for (const JobRecord& job : *list) {
          auto latest = jobs.latest_metrics(job.id);
          out.push_back(job_to_json(job, latest.ok() ? *latest : std::nullopt, false));
        }
        return json_response(200, {{"jobs", out}});
      }));

  server.get(
      R"(/v1/jobs/([^/:]+))", counting_rejects(jobs, [&jobs](const service::HttpRequest& req) {
        absl::StatusOr<JobRecord> job = jobs.get(req.params[0]);
        if (!job.ok()) return error_response(job.status());
        auto latest = jobs.latest_metrics(job->id);
        return json_response(200, job_to_json(*job, latest.ok() ? *latest : std::nullopt, true));
      }));

  server.post(R"(/v1/jobs/([^/:]+):cancel)",
              counting_rejects(jobs, [&jobs](const service::HttpRequest& req) {
                absl::StatusOr<JobRecord> job = jobs.cancel(req.params[0]);
                if (!job.ok()) return error_response(job.status());
                return json_response(200, job_to_json(*job, std::nullopt, false));
              }));

  server.get(
      R"(/v1/jobs/([^/:]+)/events)",
      counting_rejects(jobs, [&jobs](const service::HttpRequest& req) {
        absl::StatusOr<std::vector<JobEvent>> events = jobs.events(req.params[0]);
        if (!events.ok()) return error_response(events.status());
        nlohmann::json out = nlohmann::json::array();
        for (const JobEvent& e : *events) {
          out.push_back(
              {{"kind", e.kind}, {"message", e.message}, {"recorded_unix_ms", e.recorded_ms}});
        }
        return json_response(200, {{"id", req.params[0]}, {"events", out}});
      }));

  server.get(R"(/v1/jobs/([^/:]+)/metrics)",
             counting_rejects(jobs, [&jobs](const service::HttpRequest& req) {
               return metrics_history(jobs, req);
             }));
}

}  // namespace fp8rl::coordinator
