// The coordinator's REST API on the HTTP server (port 8080): POST /v1/jobs, GET /v1/jobs,
// GET /v1/jobs/{id}, POST /v1/jobs/{id}:cancel, GET /v1/jobs/{id}/metrics, GET
// /v1/jobs/{id}/events (faults handled: checkpoint fallback, trainer lost, token quota). Bad input
// answers 400 {"error": "<field path>: ..."}, unknown jobs 404; beyond the admission limits
// (admission.h) 429 with Retry-After.
#pragma once

#include "common/service/http_server.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/job_manager.h"

namespace fp8rl::coordinator {

void add_rest_routes(service::HttpServer& server, JobManager& jobs);

// The POST /v1/jobs handler on its own (body: a job config as JSON): 201 with the new job's id,
// 400 naming the field for bad input. Exposed for the REST fuzz target (fuzz/).
service::HttpResponse submit_job_request(JobManager& jobs, const service::HttpRequest& req);

// The JSON shape of a job in REST answers (config included when `with_config`).
nlohmann::json job_to_json(const JobRecord& job, const std::optional<MetricsRow>& latest,
                           bool with_config);
nlohmann::json metrics_row_to_json(const MetricsRow& row);

// HTTP status for an absl error code (400, 404, 409, 429, 503, 500).
int http_status_for(const absl::Status& status);

}  // namespace fp8rl::coordinator
