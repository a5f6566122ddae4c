// The local launcher behind `fp8rl up` and `fp8rl run`: plans the services of a one-host cluster
// (coordinator, weight sync, trainer, N generation workers) on the default ports of
// docs/design/services.md "Services and ports" plus an offset, spawns them as child processes with
// logs under the data dir, waits until each is healthy, supervises them (a child that exits is
// restarted with a back-off, like docker compose's `restart: unless-stopped`) and stops them
// cleanly (SIGTERM, bounded wait, SIGKILL). Children die with the launcher (PR_SET_PDEATHSIG), so
// nothing is ever orphaned.
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

// Default ports (docs/design/services.md "Services and ports"); generation worker i adds i to its
// two ports.
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
// Trainers beyond the first ("trainer-1", ...; a data-parallel group, docs/design/training.md
// "Trainer groups") listen on these ports + their index.
inline constexpr int kExtraTrainerGrpcPort = 50100;
inline constexpr int kExtraTrainerMetricsPort = 9500;
inline constexpr int kMaxTrainers = 8;

// What the launcher does when a child exits while the cluster runs (any exit counts as a crash:
// nothing is supposed to end on its own). The child is restarted with the same binary and flags
// after a back-off that starts at `initial_backoff` and doubles for each crash that comes within
// `quick_crash_window` of the previous (re)start, up to `max_backoff`; a child that crashed
// `give_up_crashes` times within `give_up_window` is given up.
struct RestartPolicy {
  bool enabled = true;  // false: `--no-restart`, every exit is final
  std::chrono::milliseconds initial_backoff{1'000};
  std::chrono::milliseconds max_backoff{30'000};
  // A crash this soon after its (re)start doubles the back-off and counts towards giving up; a
  // child that ran longer resets both.
  std::chrono::milliseconds quick_crash_window{10'000};
  int give_up_crashes = 5;
  std::chrono::milliseconds give_up_window{300'000};
};

struct ClusterOptions {
  std::string bin_dir;   // folder holding fp8rl-coordinator, fp8rl-weight-sync, ...
  std::string data_dir;  // logs/, coordinator/ (job store), trainer/ (checkpoints), cluster.json
  int workers = 2;       // generation workers
  int trainers = 1;      // trainer workers ("trainer", "trainer-1", ...)
  int port_offset = 0;   // added to every default port
  std::string host = "127.0.0.1";  // loopback: services listen and advertise here
  std::chrono::milliseconds startup_timeout{90'000};  // per service, until healthy
  std::chrono::milliseconds stop_grace{15'000};       // SIGTERM -> SIGKILL
  std::string log_level = "info";
  RestartPolicy restart;
  // The coordinator's job path roots (--data-root, --models-root, --datasets-root: the folders
  // checkpoint.dir, model paths and dataset paths must lie in); empty: its working directory,
  // which is this process's.
  std::string data_root;
  std::string models_root;
  std::string datasets_root;
  // Security (docs/deploy.md). The coordinator's job API tokens (--auth-token-file; empty: open).
  // TLS PEM files given to every service (--tls-cert/--tls-key, --tls-ca for mutual TLS between
  // them); the launcher's health checks then use HTTPS verified with tls_ca. Whatever is set,
  // the launcher generates a cluster token per start (cluster_token_path()).
  std::string auth_token_file = {};
  std::string tls_cert = {};
  std::string tls_key = {};
  std::string tls_ca = {};
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
// Where `fp8rl up` writes the cluster token it generates (mode 0600) and every service reads it
// (--cluster-token-file): <data_dir>/cluster.token.
std::string cluster_token_path(const ClusterOptions& options);

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
  // The log gets a header line first: "=== fp8rl launcher: starting <binary> at <time> ===", or
  // with a `restart_note`: "=== fp8rl launcher: restarting <binary> at <time> (<note>) ===".
  static absl::StatusOr<std::unique_ptr<ChildProcess>> spawn(const std::string& binary,
                                                             const std::vector<std::string>& args,
                                                             const std::string& log_path,
                                                             const std::string& restart_note = "");
  ~ChildProcess();  // stops the child (SIGTERM, 5 s, SIGKILL) if it still runs
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reaps the child without blocking; true while it has not exited.
  bool running();
  // "exited with code 3" / "killed by signal 9 (Killed)"; empty while running.
  std::string exit_description() const;
  bool exited_cleanly() const;  // exited with code 0
  bool killed_by(int signal) const;
  // SIGTERM, wait up to `grace`, then SIGKILL and wait. Returns true when SIGTERM sufficed.
  bool stop(std::chrono::milliseconds grace);
  void send_signal(int signal);

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  bool wait_for_exit(std::chrono::milliseconds timeout);
  pid_t pid_;
  std::optional<int> wait_status_;
};

// What happened to a child that exited while the cluster was supposed to be running, and what
// the launcher does about it.
struct ChildFailure {
  std::string service;
  bool essential = true;
  std::string description;  // "exited with code 1"
  std::string log_path;
  std::string log_tail;
  bool restarting = false;  // a restart is scheduled after `restart_in`
  std::chrono::milliseconds restart_in{0};
  // Why the exit is final when restarts are on: "crashed 5 times within 300 s" (empty otherwise).
  std::string gave_up;
};

// A child the launcher started again after a crash.
struct ChildRestart {
  std::string service;
  pid_t pid = 0;    // the new process
  int restart = 0;  // 1 for the first restart of this service
  // Non-empty when cluster.json could not be rewritten (it still names the previous pid).
  std::string state_error;
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
  const ClusterOptions& options() const { return options_; }
  std::string coordinator_grpc_address() const;  // "127.0.0.1:50051"
  std::string coordinator_http_url() const;      // "http://127.0.0.1:8080"
  std::string state_path() const;                // <data_dir>/cluster.json

  // Children that exited since the last call (each reported once), with the restart decision of
  // options.restart. Also failed restart attempts (description "could not be restarted: ...").
  std::vector<ChildFailure> poll_failures();
  // Starts again every child whose back-off has elapsed, with the same binary, flags and ports,
  // its log appended to, and rewrites cluster.json with the new pids. Never restarts anything
  // once stop() began. Call it regularly together with poll_failures().
  std::vector<ChildRestart> restart_due();
  // True while some child waits for its scheduled restart.
  bool restart_pending() const;
  // Stops every child, generation workers first and weight sync last. Returns one line per child
  // that needed SIGKILL or had already exited with an error ("" when all stopped cleanly).
  // Idempotent.
  std::string stop();

 private:
  // Per service: its restart history (parallel to specs_).
  struct Supervision {
    bool reported = false;  // the current child's exit was returned by poll_failures()
    std::optional<std::chrono::steady_clock::time_point> restart_at;  // scheduled restart
    std::chrono::steady_clock::time_point started_at;                 // of the current child
    std::chrono::milliseconds last_backoff{0};
    std::vector<std::chrono::steady_clock::time_point> crashes;  // within give_up_window
    int restarts = 0;
  };
  LocalCluster() = default;
  // Records a crash of service i at `now` and decides: fills the restart fields of `failure`.
  void schedule_restart(size_t i, std::chrono::steady_clock::time_point now, ChildFailure& failure);
  absl::Status write_state() const;  // <data_dir>/cluster.json, atomically
  ClusterOptions options_;
  std::vector<ServiceSpec> specs_;
  std::vector<std::unique_ptr<ChildProcess>> children_;  // parallel to specs_
  std::vector<Supervision> supervision_;                 // parallel to specs_
  std::vector<ChildFailure> pending_failures_;           // failed restarts, for poll_failures()
  bool stopped_ = false;
};

// GET http://host:port/path with a timeout; returns the status code (and the body in `body`).
// Unavailable when nothing answers. Plain HTTP/1.1 over a blocking socket (loopback health).
// With `tls_ca`: HTTPS instead, the server's certificate verified against that CA file.
absl::StatusOr<int> http_get(const std::string& host, int port, const std::string& path,
                             std::chrono::milliseconds timeout, std::string* body = nullptr,
                             const std::string& tls_ca = "");

// The one-line table of endpoints `fp8rl up` prints, one service per line.
std::string format_endpoints(const std::vector<ServiceSpec>& services, const std::string& host);

}  // namespace fp8rl::cli
