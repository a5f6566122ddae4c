// `fp8rl up` (run a local cluster until Ctrl-C) and `fp8rl run CONFIG` (local cluster + one job
// with live progress and a summary): the one-command ways to use fp8rl on a single machine. Both
// restart a service that crashes (unless --no-restart) and report every crash and restart.
// Built only with FP8RL_HAVE_SERVICES: the launcher needs the service libraries (shutdown
// handling) and the JobService client.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/service/shutdown.h"
#include "common/status_macros.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/cluster.h"
#include "tools/fp8rl/command.h"
#include "tools/fp8rl/job_client.h"

namespace fp8rl::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kInterruptedExit = 130;
// `fp8rl run` keeps polling an unreachable coordinator this long after its restart began (or
// after the first failed call) before it gives the run up.
constexpr auto kCoordinatorOutage = std::chrono::seconds(60);

// The folder of the running fp8rl binary: the service binaries are built next to it.
std::string own_bin_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

// What `fp8rl run` sends to the cluster it started: its TLS files and the first API token.
absl::StatusOr<service::ClientSecurity> launcher_security(const ClusterOptions& o) {
  std::string token;
  if (!o.auth_token_file.empty()) {
    absl::StatusOr<std::string> t =
        service::read_token_file(o.auth_token_file, "--auth-token-file");
    if (!t.ok()) return t.status();
    token = *t;
  }
  return service::client_security({o.tls_cert, o.tls_key, o.tls_ca}, std::move(token));
}

FlagSpec cluster_flags() {
  FlagSpec spec;
  spec.value_flags = {"port-offset", "base-port-offset", "data-dir",      "workers",
                      "bin-dir",     "startup-timeout",  "log-level",     "stop-timeout",
                      "data-root",   "models-root",      "datasets-root", "auth-token-file",
                      "tls-cert",    "tls-key",          "tls-ca",        "trainers"};
  spec.bool_flags = {"no-restart"};
  return spec;
}

absl::StatusOr<ClusterOptions> cluster_options(const Args& args) {
  ClusterOptions o;
  o.bin_dir = args.get("bin-dir").value_or(own_bin_dir());
  o.data_dir = std::filesystem::absolute(args.get("data-dir").value_or("fp8rl-data")).string();
  // Job path roots of the coordinator (rl/job_paths.h); unset: the working directory.
  for (auto [flag, root] :
       {std::pair{"data-root", &o.data_root}, std::pair{"models-root", &o.models_root},
        std::pair{"datasets-root", &o.datasets_root}}) {
    if (std::optional<std::string> v = args.get(flag); v.has_value()) {
      std::error_code ec;
      if (!std::filesystem::is_directory(*v, ec)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, ": '", *v, "' is not an existing folder"));
      }
      *root = std::filesystem::absolute(*v).string();
    }
  }
  // Security files, passed on as given (each service checks them and names the flag).
  for (auto [flag, file] :
       {std::pair{"auth-token-file", &o.auth_token_file}, std::pair{"tls-cert", &o.tls_cert},
        std::pair{"tls-key", &o.tls_key}, std::pair{"tls-ca", &o.tls_ca}}) {
    if (std::optional<std::string> v = args.get(flag); v.has_value()) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(*v, ec)) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", *v, "' is not a file"));
      }
      *file = std::filesystem::absolute(*v).string();
    }
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key: give both or neither");
  }
  if (!o.tls_cert.empty() && o.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca: required with --tls-cert (the launcher and the services verify each other)");
  }
  absl::StatusOr<int64_t> workers = args.get_int("workers", 2);
  if (!workers.ok()) return workers.status();
  absl::StatusOr<int64_t> trainers = args.get_int("trainers", 1);
  if (!trainers.ok()) return trainers.status();
  if (*trainers < 1 || *trainers > kMaxTrainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trainers: must be in [1, ", kMaxTrainers, "], got ", *trainers));
  }
  const char* offset_flag = args.has("port-offset") ? "port-offset" : "base-port-offset";
  if (args.has("port-offset") && args.has("base-port-offset")) {
    return absl::InvalidArgumentError(
        "--port-offset and --base-port-offset are the same flag; "
        "give one");
  }
  absl::StatusOr<int64_t> offset = args.get_int(offset_flag, 0);
  if (!offset.ok()) return offset.status();
  absl::StatusOr<double> startup = args.get_double("startup-timeout", 90.0);
  if (!startup.ok()) return startup.status();
  absl::StatusOr<double> stop = args.get_double("stop-timeout", 15.0);
  if (!stop.ok()) return stop.status();
  if (*workers < 0 || *workers > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers: must be in [1, ", kMaxGenerationWorkers, "], got ", *workers));
  }
  if (*offset < -65535 || *offset > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port-offset: must be in [-65535, 65535], got ", *offset));
  }
  if (!(*startup > 0 && *startup <= 3600)) {
    return absl::InvalidArgumentError("--startup-timeout: must be in (0, 3600] seconds");
  }
  if (!(*stop >= 0 && *stop <= 3600)) {
    return absl::InvalidArgumentError("--stop-timeout: must be in [0, 3600] seconds");
  }
  o.workers = static_cast<int>(*workers);
  o.trainers = static_cast<int>(*trainers);
  o.port_offset = static_cast<int>(*offset);
  o.startup_timeout = std::chrono::milliseconds(static_cast<int64_t>(*startup * 1000));
  o.stop_grace = std::chrono::milliseconds(static_cast<int64_t>(*stop * 1000));
  o.log_level = args.get("log-level").value_or("info");
  o.restart.enabled = !args.has("no-restart");
  if (o.log_level != "debug" && o.log_level != "info" && o.log_level != "warn" &&
      o.log_level != "error") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-level: must be one of debug, info, warn, error, got '", o.log_level, "'"));
  }
  FP8RL_RETURN_IF_ERROR(validate_cluster_options(o));
  return o;
}

void print_failure(const char* name, const ChildFailure& f) {
  std::string what;
  if (f.restarting) {
    what = absl::StrFormat("restarting it in %.1f s",
                           std::chrono::duration<double>(f.restart_in).count());
  } else {
    what = absl::StrCat(f.gave_up.empty() ? "" : absl::StrCat(f.gave_up, ", giving up; "),
                        f.essential ? "the cluster cannot continue" : "continuing without it");
  }
  std::fprintf(stderr, "fp8rl %s: %s %s (%s); last lines of %s:\n%s", name, f.service.c_str(),
               f.description.c_str(), what.c_str(), f.log_path.c_str(), f.log_tail.c_str());
  std::fflush(stderr);
}

void print_restart(const char* name, const ChildRestart& r) {
  std::fprintf(stderr, "fp8rl %s: %s restarted (pid %d, restart %d)\n", name, r.service.c_str(),
               static_cast<int>(r.pid), r.restart);
  if (!r.state_error.empty()) {
    std::fprintf(stderr, "fp8rl %s: cluster.json not updated: %s\n", name, r.state_error.c_str());
  }
  std::fflush(stderr);
}

// One supervision round shared by `up` and `run`: reports crashes and restarts, counts the
// generation workers given up. Returns the reason the cluster cannot go on ("" while it can).
std::string supervise(const char* name, LocalCluster& cluster, int& workers_alive,
                      const std::function<void(const ChildFailure&)>& on_failure = {},
                      const std::function<void(const ChildRestart&)>& on_restart = {}) {
  std::string fatal;
  for (const ChildFailure& f : cluster.poll_failures()) {
    print_failure(name, f);
    if (on_failure) on_failure(f);
    if (f.restarting) continue;
    if (f.essential && fatal.empty()) fatal = absl::StrCat(f.service, " ", f.description);
    if (!f.essential && --workers_alive == 0 && fatal.empty()) {
      fatal = "no generation worker is left";
    }
  }
  for (const ChildRestart& r : cluster.restart_due()) {
    print_restart(name, r);
    if (on_restart) on_restart(r);
  }
  return fatal;
}

// Stops the cluster and reports children that did not stop cleanly.
void stop_cluster(const char* name, LocalCluster& cluster) {
  std::printf("stopping the cluster...\n");
  std::fflush(stdout);
  const std::string report = cluster.stop();
  if (!report.empty()) std::fprintf(stderr, "fp8rl %s: %s", name, report.c_str());
  std::printf("cluster stopped\n");
  std::fflush(stdout);
}

}  // namespace

int up_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "up";
  absl::StatusOr<Args> args = Args::Parse(argv, cluster_flags());
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  absl::StatusOr<ClusterOptions> options = cluster_options(*args);
  if (!options.ok()) return usage_error(kName, std::string(options.status().message()));
  if (absl::Status s = service::install_shutdown_handlers(); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::start(*options, &std::cout, [] { return service::shutdown_requested(); });
  if (!cluster.ok()) {
    failure(kName, std::string(cluster.status().message()));
    return cluster.status().code() == absl::StatusCode::kCancelled ? kInterruptedExit : 1;
  }
  std::printf("fp8rl cluster is up (launcher pid %d):\n%s", static_cast<int>(getpid()),
              format_endpoints((*cluster)->services(), options->host).c_str());
  std::printf("coordinator: gRPC %s, REST %s\n", (*cluster)->coordinator_grpc_address().c_str(),
              (*cluster)->coordinator_http_url().c_str());
  std::printf("logs: %s/logs   state: %s\n", options->data_dir.c_str(),
              (*cluster)->state_path().c_str());
  std::printf("press Ctrl-C (or send SIGTERM) to stop\n");
  std::fflush(stdout);

  int code = 0;
  int workers_alive = options->workers;
  while (!service::wait_for_shutdown(std::chrono::milliseconds(250))) {
    const std::string fatal = supervise(kName, **cluster, workers_alive);
    if (!fatal.empty()) {
      std::fprintf(stderr, "fp8rl up: %s; stopping the cluster\n", fatal.c_str());
      code = 1;
      break;
    }
  }
  stop_cluster(kName, **cluster);
  return code;
}

int run_main(const std::vector<std::string>& argv) {
  constexpr const char* kName = "run";
  FlagSpec spec = cluster_flags();
  spec.max_positionals = 1;
  absl::StatusOr<Args> args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  if (args->positionals().size() != 1) return usage_error(kName, "expected one CONFIG file");
  absl::StatusOr<ClusterOptions> options = cluster_options(*args);
  if (!options.ok()) return usage_error(kName, std::string(options.status().message()));
  // Validate the config before starting anything.
  absl::StatusOr<std::string> config =
      prepare_job_config(args->positionals()[0], std::filesystem::current_path().string());
  if (!config.ok()) return failure(kName, std::string(config.status().message()));
  if (absl::Status s = service::install_shutdown_handlers(); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  const auto start = Clock::now();
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::start(*options, &std::cout, [] { return service::shutdown_requested(); });
  if (!cluster.ok()) {
    failure(kName, std::string(cluster.status().message()));
    return cluster.status().code() == absl::StatusCode::kCancelled ? kInterruptedExit : 1;
  }
  LocalCluster& c = **cluster;
  auto fail_and_stop = [&](const std::string& message) {
    std::fprintf(stderr, "fp8rl run: %s\n", message.c_str());
    stop_cluster(kName, c);
    return 1;
  };

  // The cluster's own TLS files and the first job API token, when the cluster has them.
  absl::StatusOr<service::ClientSecurity> security = launcher_security(c.options());
  if (!security.ok()) return fail_and_stop(std::string(security.status().message()));
  absl::StatusOr<std::unique_ptr<JobClient>> client =
      JobClient::connect(c.coordinator_grpc_address(), std::chrono::seconds(10), *security);
  if (!client.ok()) return fail_and_stop(std::string(client.status().message()));
  absl::StatusOr<v1::Job> submitted = (*client)->submit(*config);
  if (!submitted.ok()) return fail_and_stop(std::string(submitted.status().message()));
  const std::string id = submitted->id();
  std::printf("job %s submitted (%lld steps); coordinator REST %s/v1/jobs/%s\n", id.c_str(),
              static_cast<long long>(submitted->total_steps()), c.coordinator_http_url().c_str(),
              id.c_str());
  std::fflush(stdout);

  ProgressPrinter printer(client->get(), stdout);
  bool interrupted = false;
  Clock::time_point cancel_deadline{};
  v1::Job job = *submitted;
  int workers_alive = options->workers;
  // While the coordinator is restarting, GetJob fails for a while: tolerated for
  // kCoordinatorOutage after the later of its restart and the first failed call.
  Clock::time_point coordinator_restarted{};  // epoch: never
  bool unreachable = false;
  Clock::time_point unreachable_since{};
  auto on_failure = [&](const ChildFailure& f) {
    if (f.service == "coordinator" && f.restarting) coordinator_restarted = Clock::now();
  };
  auto on_restart = [&](const ChildRestart& r) {
    if (r.service == "coordinator") coordinator_restarted = Clock::now();
  };
  while (true) {
    if (!interrupted && service::shutdown_requested()) {
      interrupted = true;
      std::fprintf(stderr, "fp8rl run: interrupted; cancelling %s\n", id.c_str());
      absl::StatusOr<v1::Job> cancelled = (*client)->cancel(id);
      if (!cancelled.ok() && cancelled.status().code() != absl::StatusCode::kFailedPrecondition) {
        std::fprintf(stderr, "fp8rl run: cancel failed: %s\n",
                     std::string(cancelled.status().message()).c_str());
        break;
      }
      cancel_deadline = Clock::now() + std::chrono::seconds(60);
    }
    const std::string fatal = supervise(kName, c, workers_alive, on_failure, on_restart);
    if (!fatal.empty()) return fail_and_stop(absl::StrCat(fatal, "; job ", id, " cannot finish"));
    absl::StatusOr<v1::Job> current = (*client)->get(id);
    if (!current.ok()) {
      const absl::StatusCode code = current.status().code();
      const bool transient =
          code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
      const auto now = Clock::now();
      if (!unreachable) {
        unreachable = true;
        unreachable_since = now;
        if (transient) {
          std::fprintf(stderr, "fp8rl run: coordinator unreachable (%s); waiting for it\n",
                       std::string(current.status().message()).c_str());
          std::fflush(stderr);
        }
      }
      const Clock::time_point since = std::max(unreachable_since, coordinator_restarted);
      if (!transient || now - since > kCoordinatorOutage) {
        return fail_and_stop(std::string(current.status().message()));
      }
      if (interrupted && now > cancel_deadline) {
        std::fprintf(stderr, "fp8rl run: the coordinator stayed unreachable after the cancel\n");
        break;
      }
      if (interrupted) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      } else {
        service::wait_for_shutdown(std::chrono::milliseconds(500));
      }
      continue;
    }
    if (unreachable) {
      std::fprintf(stderr, "fp8rl run: coordinator is back after %.1f s; job %s continues\n",
                   std::chrono::duration<double>(Clock::now() - unreachable_since).count(),
                   id.c_str());
      std::fflush(stderr);
      unreachable = false;
    }
    job = *current;
    if (absl::Status s = printer.update(job); !s.ok()) {
      // The metrics call can meet the coordinator's restart too: the next round retries it.
      const bool transient = s.code() == absl::StatusCode::kUnavailable ||
                             s.code() == absl::StatusCode::kDeadlineExceeded;
      if (!transient) return fail_and_stop(std::string(s.message()));
    }
    if (is_terminal(job.state())) break;
    if (interrupted && Clock::now() > cancel_deadline) {
      std::fprintf(stderr, "fp8rl run: %s did not stop within 60 s of the cancel request\n",
                   id.c_str());
      break;
    }
    if (interrupted) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    } else {
      service::wait_for_shutdown(std::chrono::milliseconds(300));
    }
  }
  if (absl::Status s = printer.finish(id, job.total_steps()); !s.ok()) {
    std::fprintf(stderr, "fp8rl run: metrics: %s\n", std::string(s.message()).c_str());
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  std::fputs(format_summary(job, printer.rows(), secs).c_str(), stdout);
  std::fflush(stdout);
  stop_cluster(kName, c);
  if (job.state() == v1::JOB_STATE_SUCCEEDED) return 0;
  if (interrupted) return kInterruptedExit;
  std::fprintf(stderr, "fp8rl run: job %s %s: %s\n", id.c_str(),
               job_state_name(job.state()).c_str(),
               job.error().empty() ? "(no error recorded)" : job.error().c_str());
  return 1;
}

}  // namespace fp8rl::cli
