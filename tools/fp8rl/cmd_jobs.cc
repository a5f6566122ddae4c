// `fp8rl submit/status/list/cancel/watch`: drive a running coordinator over its gRPC JobService.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/service/shutdown.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"
#include "tools/fp8rl/job_client.h"

namespace fp8rl::cli {
namespace {

// Exit code after Ctrl-C (128 + SIGINT), as shells report it.
constexpr int kInterruptedExit = 130;

// Parses flags shared by every job command and connects; on failure prints the one-line error
// and sets `exit_code`.
std::unique_ptr<JobClient> connect_or_report(const char* name, const Args& args, int* exit_code) {
  const std::string address = args.get("coordinator").value_or(kDefaultCoordinator);
  absl::StatusOr<int64_t> timeout = args.get_int("connect-timeout", 5);
  if (!timeout.ok()) {
    *exit_code = usage_error(name, std::string(timeout.status().message()));
    return nullptr;
  }
  if (*timeout < 1) {
    *exit_code = usage_error(name, "--connect-timeout: must be >= 1 (seconds)");
    return nullptr;
  }
  absl::StatusOr<service::ClientSecurity> security = cli_security(&args);
  if (!security.ok()) {
    *exit_code = usage_error(name, std::string(security.status().message()));
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<JobClient>> client =
      JobClient::connect(address, std::chrono::seconds(*timeout), *security);
  if (!client.ok()) {
    *exit_code = client.status().code() == absl::StatusCode::kInvalidArgument
                     ? usage_error(name, std::string(client.status().message()))
                     : failure(name, std::string(client.status().message()));
    return nullptr;
  }
  return std::move(*client);
}

FlagSpec job_flags(int positionals) {
  FlagSpec spec;
  spec.value_flags = {"coordinator", "connect-timeout"};
  for (const char* flag : kSecurityFlags) spec.value_flags.insert(flag);
  spec.max_positionals = positionals;
  return spec;
}

}  // namespace

int submit_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "submit";
  FlagSpec spec = job_flags(1);
  spec.bool_flags = {"quiet"};
  absl::StatusOr<Args> args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  if (args->positionals().size() != 1) return usage_error(kName, "expected one CONFIG file");
  absl::StatusOr<std::string> config =
      prepare_job_config(args->positionals()[0], std::filesystem::current_path().string());
  if (!config.ok()) return failure(kName, std::string(config.status().message()));
  int code = 0;
  std::unique_ptr<JobClient> client = connect_or_report(kName, *args, &code);
  if (client == nullptr) return code;
  absl::StatusOr<v1::Job> job = client->submit(*config);
  if (!job.ok()) return failure(kName, std::string(job.status().message()));
  if (args->has("quiet")) {
    std::printf("%s\n", job->id().c_str());
  } else {
    std::printf("submitted %s (%s, %lld steps) to %s\n", job->id().c_str(),
                job_state_name(job->state()).c_str(), static_cast<long long>(job->total_steps()),
                client->address().c_str());
    std::printf("follow it with: fp8rl watch %s --coordinator %s\n", job->id().c_str(),
                client->address().c_str());
  }
  return 0;
}

int status_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "status";
  absl::StatusOr<Args> args = Args::Parse(argv, job_flags(1));
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  int code = 0;
  std::unique_ptr<JobClient> client = connect_or_report(kName, *args, &code);
  if (client == nullptr) return code;
  std::string id;
  if (args->positionals().empty()) {
    // No id: the newest job.
    absl::StatusOr<std::vector<v1::Job>> jobs = client->list(v1::JOB_STATE_UNSPECIFIED, 1);
    if (!jobs.ok()) return failure(kName, std::string(jobs.status().message()));
    if (jobs->empty()) {
      std::printf("coordinator %s: no jobs yet\n", client->address().c_str());
      return 0;
    }
    id = jobs->front().id();
  } else {
    id = args->positionals()[0];
  }
  absl::StatusOr<v1::Job> job = client->get(id);
  if (!job.ok()) return failure(kName, std::string(job.status().message()));
  std::fputs(format_job_details(*job).c_str(), stdout);
  absl::StatusOr<std::vector<v1::JobFaultEvent>> events = client->events(id);
  if (!events.ok()) return failure(kName, std::string(events.status().message()));
  std::fputs(format_job_events(*events).c_str(), stdout);
  return 0;
}

int list_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "list";
  FlagSpec spec = job_flags(0);
  spec.value_flags.insert({"state", "limit"});
  absl::StatusOr<Args> args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  if (auto s = args->get("state")) {
    absl::StatusOr<v1::JobState> parsed = parse_job_state(*s);
    if (!parsed.ok()) return usage_error(kName, std::string(parsed.status().message()));
    state = *parsed;
  }
  absl::StatusOr<int64_t> limit = args->get_int("limit", 0);
  if (!limit.ok()) return usage_error(kName, std::string(limit.status().message()));
  if (*limit < 0 || *limit > 1'000'000)
    return usage_error(kName, "--limit: must be in [0, 1000000]");
  int code = 0;
  std::unique_ptr<JobClient> client = connect_or_report(kName, *args, &code);
  if (client == nullptr) return code;
  absl::StatusOr<std::vector<v1::Job>> jobs = client->list(state, static_cast<int>(*limit));
  if (!jobs.ok()) return failure(kName, std::string(jobs.status().message()));
  std::fputs(format_job_table(*jobs).c_str(), stdout);
  return 0;
}

int cancel_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "cancel";
  absl::StatusOr<Args> args = Args::Parse(argv, job_flags(1));
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  if (args->positionals().size() != 1) return usage_error(kName, "expected one job ID");
  int code = 0;
  std::unique_ptr<JobClient> client = connect_or_report(kName, *args, &code);
  if (client == nullptr) return code;
  absl::StatusOr<v1::Job> job = client->cancel(args->positionals()[0]);
  if (!job.ok()) return failure(kName, std::string(job.status().message()));
  if (job->state() == v1::JOB_STATE_CANCELLED) {
    std::printf("%s: CANCELLED\n", job->id().c_str());
  } else {
    std::printf("%s: cancel requested; it is %s until the current phase ends\n", job->id().c_str(),
                job_state_name(job->state()).c_str());
  }
  return 0;
}

int watch_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "watch";
  absl::StatusOr<Args> args = Args::Parse(argv, job_flags(1));
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  if (args->positionals().size() != 1) return usage_error(kName, "expected one job ID");
  int code = 0;
  std::unique_ptr<JobClient> client = connect_or_report(kName, *args, &code);
  if (client == nullptr) return code;
  if (absl::Status s = service::install_shutdown_handlers(); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  const std::string id = args->positionals()[0];
  const auto start = std::chrono::steady_clock::now();

  // Ctrl-C ends the watch (the job keeps running).
  std::atomic<bool> done{false};
  std::thread interrupter([&] {
    while (!done.load()) {
      if (service::wait_for_shutdown(std::chrono::milliseconds(200))) {
        client->stop_watch();
        return;
      }
    }
  });
  ProgressPrinter printer(client.get(), stdout);
  v1::Job last;
  absl::Status progress_error;
  absl::Status s = client->watch(id, [&](const v1::Job& job) {
    if (last.id().empty()) {
      std::printf("watching %s (%s, step %lld/%lld)\n", job.id().c_str(),
                  job_state_name(job.state()).c_str(), static_cast<long long>(job.step()),
                  static_cast<long long>(job.total_steps()));
    }
    last = job;
    progress_error = printer.update(job);
    return progress_error.ok();
  });
  done.store(true);
  interrupter.join();
  if (service::shutdown_requested()) {
    std::fprintf(stderr, "fp8rl watch: interrupted; %s keeps running\n", id.c_str());
    return kInterruptedExit;
  }
  if (!s.ok()) return failure(kName, std::string(s.message()));
  if (!progress_error.ok()) return failure(kName, std::string(progress_error.message()));
  if (absl::Status f = printer.finish(id, last.total_steps()); !f.ok()) {
    return failure(kName, std::string(f.message()));
  }
  absl::StatusOr<v1::Job> final_job = client->get(id);
  if (!final_job.ok()) return failure(kName, std::string(final_job.status().message()));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fputs(format_summary(*final_job, printer.rows(), secs).c_str(), stdout);
  return final_job->state() == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

}  // namespace fp8rl::cli
