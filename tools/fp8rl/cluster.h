// The local launcher behind `fp8rl up` and `fp8rl run`: plans the services of a one-host cluster
// (coordinator, weight sync, trainer, N generation workers) on the default ports of
// ARCHITECTURE.md plus an offset, spawns them as child processes with logs under the data dir,
// waits until each is healthy, supervises them and stops them cleanly (SIGTERM, bounded wait,
// SIGKILL). Children die with the launcher (PR_SET_PDEATHSIG), so nothing is ever orphaned.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl::cli {

// Default ports (ARCHITECTURE.md "Services"); generation worker i adds i to its two ports.
inline constexpr int kCoordinatorGrpcPort = 50051;
inline constexpr int kCoordinatorHttpPort = 8080;
inline constexpr int kWeightSyncGrpcPort = 50052;
inline constexpr int kWeightSyncMetricsPort = 9402;
inline constexpr int kTrainerGrpcPort = 50053;
inline constexpr int kTrainerMetricsPort = 9403;
inline constexpr int kGenerationGrpcPort = 50061;
inline constexpr int kGenerationMetricsPort = 9461;
// Worker i uses 50061+i and 9461+i; more than this would run into other services' ranges.
inline constexpr int kMaxGenerationWorkers = 32;

struct ClusterOptions {
  std::string bin_dir;   // folder holding fp8rl-coordinator, fp8rl-weight-sync, ...
  std::string data_dir;  // logs/, coordinator/ (job store), trainer/ (checkpoints), cluster.json
  int workers = 2;       // generation workers
  int port_offset = 0;   // added to every default port
  std::string host = "127.0.0.1";  // loopback: services listen and advertise here
  std::chrono::milliseconds startup_timeout{90'000};  // per service, until healthy
  std::chrono::milliseconds stop_grace{15'000};       // SIGTERM -> SIGKILL
  std::string log_level = "info";
};

// One service to launch: what it is called, how to start it and where to find it.
struct ServiceSpec {
  std::string name;    // "coordinator", "weight-sync", "trainer", "generation-worker-0", ...
  std::string binary;  // absolute path
  std::vector<std::string> args;  // flags (argv[1..])
  int grpc_port = 0;
  int http_port = 0;      // /healthz and /metrics (REST too for the coordinator)
  bool essential = true;  // false for generation workers: the cluster survives losing one
  std::string log_path;
};

// Checks the options (errors name the flag: "--workers: must be in [1, 32], got 0").
absl::Status validate_cluster_options(const ClusterOptions& options);

// The services of the cluster in start order: weight sync, coordinator, trainer, workers.
// Pure: touches no file or port.
std::vector<ServiceSpec> plan_cluster(const ClusterOptions& options);

// FailedPrecondition naming the service and port ("port 50051 (coordinator gRPC) is already in
// use on 127.0.0.1; pick another --port-offset") when any port of `plan` cannot be bound.
absl::Status check_ports_free(const std::vector<ServiceSpec>& plan, const std::string& host);

// Last `max_lines` lines of a text file ("" when unreadable).
std::string tail_file(const std::string& path, int max_lines);

// A child process started with its stdout and stderr appended to a log file, in its own process
// group (so a Ctrl-C in the terminal reaches only the launcher, which then stops the children
// in order) and killed by the kernel if the launcher dies.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> spawn(const std::string& binary,
                                                             const std::vector<std::string>& args,
                                                             const std::string& log_path);
  ~ChildProcess();  // stops the child (SIGTERM, 5 s, SIGKILL) if it still runs
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reaps the child without blocking; true while it has not exited.
  bool running();
  // "exited with code 3" / "killed by signal 9 (Killed)"; empty while running.
  std::string exit_description() const;
  bool exited_cleanly() const;  // exited with code 0
  // SIGTERM, wait up to `grace`, then SIGKILL and wait. Returns true when SIGTERM sufficed.
  bool stop(std::chrono::milliseconds grace);
  void send_signal(int signal);

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  bool wait_for_exit(std::chrono::milliseconds timeout);
  pid_t pid_;
  std::optional<int> wait_status_;
};

// What happened to a child that exited while the cluster was supposed to be running.
struct ChildFailure {
  std::string service;
  bool essential = true;
  std::string description;  // "exited with code 1"
  std::string log_path;
  std::string log_tail;
};

// A running local cluster. Destroying it stops every child.
class LocalCluster {
 public:
  // Checks options and ports, spawns every service, waits until each answers GET /healthz with
  // 200 and accepts TCP connections on its gRPC port, and writes <data_dir>/cluster.json (names,
  // pids, ports, log files). On failure every started child is stopped and the error names the
  // service, with the tail of its log. Progress lines go to `progress` (may be null). When
  // `interrupted` (optional) turns true while waiting, everything is stopped and Cancelled
  // returned.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> start(
      const ClusterOptions& options, std::ostream* progress,
      const std::function<bool()>& interrupted = {});
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const std::vector<ServiceSpec>& services() const { return specs_; }
  std::string coordinator_grpc_address() const;  // "127.0.0.1:50051"
  std::string coordinator_http_url() const;      // "http://127.0.0.1:8080"
  std::string state_path() const;                // <data_dir>/cluster.json

  // Children that exited since the last call (each reported once).
  std::vector<ChildFailure> poll_failures();
  // Stops every child, generation workers first and weight sync last. Returns one line per child
  // that needed SIGKILL or had already exited with an error ("" when all stopped cleanly).
  // Idempotent.
  std::string stop();

 private:
  LocalCluster() = default;
  ClusterOptions options_;
  std::vector<ServiceSpec> specs_;
  std::vector<std::unique_ptr<ChildProcess>> children_;  // parallel to specs_
  std::vector<bool> reported_;
  bool stopped_ = false;
};

// GET http://host:port/path with a timeout; returns the status code (and the body in `body`).
// Unavailable when nothing answers. Plain HTTP/1.1 over a blocking socket (loopback health).
absl::StatusOr<int> http_get(const std::string& host, int port, const std::string& path,
                             std::chrono::milliseconds timeout, std::string* body = nullptr);

// The one-line table of endpoints `fp8rl up` prints, one service per line.
std::string format_endpoints(const std::vector<ServiceSpec>& services, const std::string& host);

}  // namespace fp8rl::cli
