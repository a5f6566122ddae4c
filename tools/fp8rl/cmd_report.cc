// `fp8rl report JOB_ID --out DIR`: the web console's charts of one job as SVG files plus a
// markdown summary (report.h), for papers and issues. Reads the job over the gRPC JobService.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"
#include "tools/fp8rl/job_client.h"
#include "tools/fp8rl/report.h"

namespace fp8rl::cli {

int report_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "report";
  FlagSpec spec;
  spec.value_flags = {"out", "coordinator"};
  for (const char* flag : kSecurityFlags) spec.value_flags.insert(flag);
  spec.max_positionals = 1;
  absl::StatusOr<Args> args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  if (args->positionals().size() != 1) return usage_error(kName, "expected one JOB_ID");
  absl::StatusOr<std::string> out = args->required("out");
  if (!out.ok()) return usage_error(kName, std::string(out.status().message()));
  if (out->empty()) return usage_error(kName, "--out: empty path");

  absl::StatusOr<service::ClientSecurity> security = cli_security(&*args);
  if (!security.ok()) return usage_error(kName, std::string(security.status().message()));
  absl::StatusOr<std::unique_ptr<JobClient>> client = JobClient::connect(
      args->get("coordinator").value_or(kDefaultCoordinator), std::chrono::seconds(5), *security);
  if (!client.ok()) return failure(kName, std::string(client.status().message()));
  const std::string& id = args->positionals()[0];
  absl::StatusOr<v1::Job> job = (*client)->get(id);
  if (!job.ok()) return failure(kName, std::string(job.status().message()));
  absl::StatusOr<std::vector<v1::StepMetrics>> rows = (*client)->metrics(id);
  if (!rows.ok()) return failure(kName, std::string(rows.status().message()));

  ReportJob report;
  report.id = job->id();
  report.state = job_state_name(job->state());
  report.step = job->step();
  report.total_steps = job->total_steps();
  report.error = job->error();
  report.created_unix_ms = job->created_unix_ms();
  report.updated_unix_ms = job->updated_unix_ms();
  report.config_json = job->config_json();
  for (const v1::StepMetrics& row : *rows) {
    report.rows.push_back({row.step(), {row.values().begin(), row.values().end()}});
  }
  if (absl::Status s = write_report(report, *out); !s.ok()) {
    return s.code() == absl::StatusCode::kInvalidArgument
               ? usage_error(kName, std::string(s.message()))
               : failure(kName, std::string(s.message()));
  }
  std::printf("wrote the report of %s (%zu metrics rows) to %s\n", id.c_str(), rows->size(),
              out->c_str());
  return 0;
}

}  // namespace fp8rl::cli
