// Spawning, health-checking, supervising and stopping the local cluster's child processes.
#include "tools/fp8rl/cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"
#include "common/service/auth.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace fp8rl::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int err) { return std::strerror(err); }

// A socket address for an IPv4 literal host ("127.0.0.1"); "localhost" means loopback.
absl::StatusOr<sockaddr_in> ipv4_address(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string literal = host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, literal.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("host '", host, "': expected an IPv4 address such as 127.0.0.1"));
  }
  return addr;
}

// A connected TCP socket (caller closes it), or Unavailable.
absl::StatusOr<int> tcp_connect(const std::string& host, int port,
                                std::chrono::milliseconds timeout) {
  absl::StatusOr<sockaddr_in> addr = ipv4_address(host, port);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", errno_text(errno)));
  int rc = connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = poll(&p, 1, static_cast<int>(timeout.count()));
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
      rc = 0;
    } else {
      errno = rc == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
      rc = -1;
    }
  }
  if (rc != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", host, ":", port, ": ", errno_text(err)));
  }
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string port_flag(const std::string& name, int port) {
  return absl::StrCat("--", name, "=", port);
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

absl::StatusOr<int> http_get(const std::string& host, int port, const std::string& path,
                             std::chrono::milliseconds timeout, std::string* body,
                             const std::string& tls_ca) {
  if (!tls_ca.empty()) {
    httplib::SSLClient client(host, port);
    client.set_ca_cert_path(tls_ca.c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    httplib::Result result = client.Get(path.c_str());
    if (!result) {
      return absl::UnavailableError(absl::StrCat("GET ", path, " on port ", port,
                                                 " (HTTPS): ", httplib::to_string(result.error())));
    }
    if (body != nullptr) *body = result->body;
    return result->status;
  }
  absl::StatusOr<int> fd = tcp_connect(host, port, timeout);
  if (!fd.ok()) return fd.status();
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(*fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", host, ":", port,
                                           "\r\nConnection: close\r\nAccept: */*\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(*fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(*fd);
      return absl::UnavailableError(absl::StrCat("GET ", path, " on port ", port, ": send failed"));
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(*fd, buf, sizeof(buf), 0);
    if (n > 0) {
      response.append(buf, static_cast<size_t>(n));
      if (response.size() > (16u << 20)) break;
    } else {
      break;  // EOF (Connection: close), timeout or error: parse what arrived
    }
  }
  close(*fd);
  // "HTTP/1.1 200 OK\r\n..."
  int status = 0;
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12 ||
      std::sscanf(response.c_str() + 9, "%3d", &status) != 1) {
    return absl::UnavailableError(
        absl::StrCat("GET ", path, " on port ", port, ": no HTTP response"));
  }
  if (body != nullptr) {
    const size_t split = response.find("\r\n\r\n");
    *body = split == std::string::npos ? "" : response.substr(split + 4);
  }
  return status;
}

absl::Status validate_cluster_options(const ClusterOptions& options) {
  if (options.workers < 1 || options.workers > kMaxGenerationWorkers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers: must be in [1, ", kMaxGenerationWorkers, "], got ", options.workers));
  }
  if (options.trainers < 1 || options.trainers > kMaxTrainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trainers: must be in [1, ", kMaxTrainers, "], got ", options.trainers));
  }
  // The lowest default port is 8080 and the highest 50061 + workers - 1 (or an extra trainer's).
  const int highest = std::max(kGenerationGrpcPort + options.workers - 1,
                               kExtraTrainerGrpcPort + options.trainers - 1) +
                      options.port_offset;
  const int lowest = kCoordinatorHttpPort + options.port_offset;
  if (lowest < 1024 || highest > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port-offset: ", options.port_offset,
                                                   " moves the ports to [", lowest, ", ", highest,
                                                   "]; they must stay within [1024, 65535]"));
  }
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir: must not be empty");
  if (options.bin_dir.empty()) return absl::InvalidArgumentError("--bin-dir: must not be empty");
  if (options.startup_timeout.count() <= 0) {
    return absl::InvalidArgumentError("--startup-timeout: must be > 0");
  }
  const RestartPolicy& r = options.restart;
  if (r.initial_backoff.count() <= 0 || r.max_backoff < r.initial_backoff) {
    return absl::InvalidArgumentError(
        "restart: initial_backoff must be > 0 and max_backoff >= initial_backoff");
  }
  if (r.give_up_crashes < 1 || r.give_up_window.count() <= 0 || r.quick_crash_window.count() < 0) {
    return absl::InvalidArgumentError(
        "restart: give_up_crashes must be >= 1, give_up_window > 0, quick_crash_window >= 0");
  }
  if (absl::StatusOr<sockaddr_in> a = ipv4_address(options.host, 1); !a.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--host: ", a.status().message()));
  }
  return absl::OkStatus();
}

std::string cluster_token_path(const ClusterOptions& options) {
  return (std::filesystem::path(options.data_dir) / "cluster.token").string();
}

std::vector<ServiceSpec> plan_cluster(const ClusterOptions& options) {
  namespace fs = std::filesystem;
  const int off = options.port_offset;
  const std::string& host = options.host;
  const fs::path bin(options.bin_dir);
  const fs::path data(options.data_dir);
  const std::string coordinator = absl::StrCat(host, ":", kCoordinatorGrpcPort + off);
  const std::string weight_sync = absl::StrCat(host, ":", kWeightSyncGrpcPort + off);
  const std::string token_flag = "--cluster-token-file=" + cluster_token_path(options);
  std::vector<std::string> security_flags = {token_flag};
  for (auto [flag, path] :
       {std::pair{"--tls-cert=", &options.tls_cert}, std::pair{"--tls-key=", &options.tls_key},
        std::pair{"--tls-ca=", &options.tls_ca}}) {
    if (!path->empty()) security_flags.push_back(flag + *path);
  }
  auto common = [&](const std::string& name) {
    std::vector<std::string> args = {"--listen-host=" + host, "--advertise-host=" + host,
                                     "--log-level=" + options.log_level,
                                     "--data-dir=" + (data / name).string()};
    args.insert(args.end(), security_flags.begin(), security_flags.end());
    return args;
  };
  auto log_path = [&](const std::string& name) {
    return (data / "logs" / (name + ".log")).string();
  };
  std::vector<ServiceSpec> out;

  ServiceSpec ws;
  ws.name = "weight-sync";
  ws.binary = (bin / "fp8rl-weight-sync").string();
  ws.grpc_port = kWeightSyncGrpcPort + off;
  ws.http_port = kWeightSyncMetricsPort + off;
  ws.args = common(ws.name);
  ws.args.push_back(port_flag("grpc-port", ws.grpc_port));
  ws.args.push_back(port_flag("http-port", ws.http_port));
  ws.args.push_back("--coordinator=" + coordinator);  // registers as the job's weight sync
  // Every service of a local cluster runs on this host: the trainer hands each version over as a
  // file and the workers read weight sync's file instead of TCP (docs/design/weight-sync.md
  // "Same-host mapping", "Same-host upload"; both sides default to auto, weight sync to off).
  ws.args.push_back("--same-host=auto");
  ws.log_path = log_path(ws.name);
  out.push_back(ws);

  ServiceSpec co;
  co.name = "coordinator";
  co.binary = (bin / "fp8rl-coordinator").string();
  co.grpc_port = kCoordinatorGrpcPort + off;
  co.http_port = kCoordinatorHttpPort + off;
  co.args = common(co.name);
  co.args.push_back(port_flag("grpc-port", co.grpc_port));
  co.args.push_back(port_flag("http-port", co.http_port));
  if (!options.data_root.empty()) co.args.push_back("--data-root=" + options.data_root);
  if (!options.models_root.empty()) co.args.push_back("--models-root=" + options.models_root);
  if (!options.datasets_root.empty()) {
    co.args.push_back("--datasets-root=" + options.datasets_root);
  }
  if (!options.auth_token_file.empty()) {
    co.args.push_back("--auth-token-file=" + options.auth_token_file);
  }
  co.log_path = log_path(co.name);
  out.push_back(co);

  ServiceSpec tr;
  tr.name = "trainer";
  tr.binary = (bin / "fp8rl-trainer-worker").string();
  tr.grpc_port = kTrainerGrpcPort + off;
  tr.http_port = kTrainerMetricsPort + off;
  tr.args = common(tr.name);
  tr.args.push_back(port_flag("grpc-port", tr.grpc_port));
  tr.args.push_back(port_flag("http-port", tr.http_port));
  tr.args.push_back("--coordinator=" + coordinator);
  tr.args.push_back("--weight-sync=" + weight_sync);
  // The trainer checks checkpoint and model paths against the coordinator's roots again.
  const std::string cwd = std::filesystem::current_path().string();
  tr.args.push_back("--data-root=" + (options.data_root.empty() ? cwd : options.data_root));
  tr.args.push_back("--models-root=" + (options.models_root.empty() ? cwd : options.models_root));
  // The local cluster keeps the per-token logprobs of every step (<data dir>/trainer/logprobs/),
  // so a job's mismatch metrics can be recomputed (scripts/recompute_mismatch.py).
  tr.args.push_back("--logprob-log-dir=logprobs");
  tr.log_path = log_path(tr.name);
  out.push_back(tr);
  // More trainers: same flags, own name (their registration name, so ranks follow the names),
  // ports and data dir.
  for (int i = 1; i < options.trainers; ++i) {
    ServiceSpec more = tr;
    more.name = absl::StrCat("trainer-", i);
    more.grpc_port = kExtraTrainerGrpcPort + i + off;
    more.http_port = kExtraTrainerMetricsPort + i + off;
    more.args = common(more.name);
    more.args.push_back(port_flag("grpc-port", more.grpc_port));
    more.args.push_back(port_flag("http-port", more.http_port));
    more.args.push_back("--coordinator=" + coordinator);
    more.args.push_back("--weight-sync=" + weight_sync);
    more.args.push_back("--data-root=" + (options.data_root.empty() ? cwd : options.data_root));
    more.args.push_back("--models-root=" +
                        (options.models_root.empty() ? cwd : options.models_root));
    more.args.push_back("--logprob-log-dir=logprobs");
    more.args.push_back("--worker-id=" + more.name);
    more.log_path = log_path(more.name);
    out.push_back(more);
  }

  for (int i = 0; i < options.workers; ++i) {
    ServiceSpec gw;
    gw.name = absl::StrCat("generation-worker-", i);
    gw.binary = (bin / "fp8rl-generation-worker").string();
    gw.grpc_port = kGenerationGrpcPort + i + off;
    gw.http_port = kGenerationMetricsPort + i + off;
    gw.essential = false;
    gw.args = {"--listen-host=" + host, "--advertise-host=" + host,
               "--log-level=" + options.log_level};
    gw.args.insert(gw.args.end(), security_flags.begin(), security_flags.end());
    gw.args.push_back(port_flag("grpc-port", gw.grpc_port));
    gw.args.push_back(port_flag("http-port", gw.http_port));
    gw.args.push_back("--coordinator=" + coordinator);
    gw.args.push_back("--weight-sync=" + weight_sync);
    gw.args.push_back("--worker-id=" + gw.name);
    gw.log_path = log_path(gw.name);
    out.push_back(gw);
  }
  return out;
}

absl::Status check_ports_free(const std::vector<ServiceSpec>& plan, const std::string& host) {
  for (const ServiceSpec& s : plan) {
    const std::pair<int, const char*> ports[] = {
        {s.grpc_port, "gRPC"}, {s.http_port, s.name == "coordinator" ? "HTTP" : "metrics"}};
    for (const auto& [port, what] : ports) {
      absl::StatusOr<sockaddr_in> addr = ipv4_address(host, port);
      if (!addr.ok()) return addr.status();
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", errno_text(errno)));
      // SO_REUSEADDR like the services themselves, so sockets in TIME_WAIT do not count; a
      // listening socket (on this address or the wildcard) still makes bind() fail.
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      const int rc = bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr));
      const int err = errno;
      close(fd);
      if (rc != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("port ", port, " (", s.name, " ", what, ") is not free on ", host, ": ",
                         errno_text(err), "; stop what uses it or pick another --port-offset"));
      }
    }
  }
  return absl::OkStatus();
}

std::string tail_file(const std::string& path, int max_lines) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
  }
  std::string out;
  for (const std::string& l : lines) absl::StrAppend(&out, "    ", l, "\n");
  return out;
}

// ---------------------------------------------------------------------------------------------
// ChildProcess

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::spawn(
    const std::string& binary, const std::vector<std::string>& args, const std::string& log_path,
    const std::string& restart_note) {
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("'", binary, "' is not an executable file (",
                                            errno_text(errno), "); build it or pass --bin-dir"));
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(log_path).parent_path(), ec);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open log file '", log_path, "': ", errno_text(errno)));
  }
  // Everything the child needs is prepared before fork(): after it only async-signal-safe calls.
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string header =
      restart_note.empty()
          ? absl::StrCat("=== fp8rl launcher: starting ", binary, " at ", now_text(), " ===\n")
          : absl::StrCat("=== fp8rl launcher: restarting ", binary, " at ", now_text(), " (",
                         restart_note, ") ===\n");
  (void)!write(log_fd, header.data(), header.size());
  // exec failure is reported through a close-on-exec pipe: EOF means exec succeeded.
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", errno_text(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(log_fd);
    close(error_pipe[0]);
    close(error_pipe[1]);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", errno_text(err)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    const int err = errno;
    (void)!write(error_pipe[1], &err, sizeof(err));
    _exit(127);
  }
  close(log_fd);
  close(error_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess(pid));
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    child->wait_for_exit(std::chrono::milliseconds(5000));
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute '", binary, "': ", errno_text(child_errno)));
  }
  return child;
}

ChildProcess::~ChildProcess() { stop(std::chrono::milliseconds(5000)); }

bool ChildProcess::running() {
  if (wait_status_) return false;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    wait_status_ = status;
    return false;
  }
  if (r < 0) {  // not our child any more (should not happen): treat as gone
    wait_status_ = 0;
    return false;
  }
  return true;
}

std::string ChildProcess::exit_description() const {
  if (!wait_status_) return "";
  const int s = *wait_status_;
  if (WIFEXITED(s)) return absl::StrCat("exited with code ", WEXITSTATUS(s));
  if (WIFSIGNALED(s)) {
    return absl::StrCat("killed by signal ", WTERMSIG(s), " (", strsignal(WTERMSIG(s)), ")");
  }
  return "ended";
}

bool ChildProcess::exited_cleanly() const {
  return wait_status_ && WIFEXITED(*wait_status_) && WEXITSTATUS(*wait_status_) == 0;
}

bool ChildProcess::killed_by(int signal) const {
  return wait_status_ && WIFSIGNALED(*wait_status_) && WTERMSIG(*wait_status_) == signal;
}

void ChildProcess::send_signal(int signal) {
  if (running()) kill(pid_, signal);
}

bool ChildProcess::wait_for_exit(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (running()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool ChildProcess::stop(std::chrono::milliseconds grace) {
  if (!running()) return true;
  kill(pid_, SIGTERM);
  if (wait_for_exit(grace)) return true;
  kill(pid_, SIGKILL);
  wait_for_exit(std::chrono::milliseconds(10'000));
  return false;
}

// ---------------------------------------------------------------------------------------------
// LocalCluster

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::start(
    const ClusterOptions& options, std::ostream* progress,
    const std::function<bool()>& interrupted) {
  FP8RL_RETURN_IF_ERROR(validate_cluster_options(options));
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->options_ = options;
  cluster->specs_ = plan_cluster(options);
  for (const ServiceSpec& s : cluster->specs_) {
    if (access(s.binary.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(s.name, ": '", s.binary,
                                              "' is not an executable file; build the services "
                                              "or pass --bin-dir"));
    }
  }
  FP8RL_RETURN_IF_ERROR(check_ports_free(cluster->specs_, options.host));
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(options.data_dir) / "logs", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir: cannot create '", options.data_dir, "': ", ec.message()));
  }
  // A fresh cluster token per start: every service requires it on its internal endpoints and
  // sends it on its calls, so nothing else on this host can publish weights or register workers.
  absl::StatusOr<std::string> token = service::generate_token();
  if (!token.ok()) return token.status();
  if (absl::Status s = service::write_token_file(cluster_token_path(options), *token); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--data-dir: ", s.message()));
  }
  if (progress != nullptr) {
    *progress << "fp8rl: starting " << cluster->specs_.size() << " services, logs in "
              << (std::filesystem::path(options.data_dir) / "logs").string() << "\n"
              << std::flush;
  }

  // Weight sync and the coordinator first (the others connect to them), then everyone else.
  const size_t first_wave = 2;
  size_t next = 0;
  for (size_t wave_end : {first_wave, cluster->specs_.size()}) {
    const size_t wave_begin = next;
    const auto wave_start = Clock::now();
    for (; next < wave_end; ++next) {
      const ServiceSpec& s = cluster->specs_[next];
      absl::StatusOr<std::unique_ptr<ChildProcess>> child =
          ChildProcess::spawn(s.binary, s.args, s.log_path);
      if (!child.ok()) {
        cluster->stop();
        return absl::Status(child.status().code(),
                            absl::StrCat(s.name, ": ", child.status().message()));
      }
      cluster->children_.push_back(std::move(*child));
      cluster->supervision_.emplace_back();
      cluster->supervision_.back().started_at = Clock::now();
    }
    std::vector<bool> ready(wave_end - wave_begin, false);
    size_t remaining = ready.size();
    std::vector<std::string> last_error(ready.size());
    while (remaining > 0) {
      for (size_t i = wave_begin; i < wave_end; ++i) {
        if (ready[i - wave_begin]) continue;
        const ServiceSpec& s = cluster->specs_[i];
        ChildProcess& child = *cluster->children_[i];
        if (!child.running()) {
          const std::string why = child.exit_description();
          cluster->supervision_[i].reported = true;
          cluster->stop();
          return absl::UnavailableError(absl::StrCat(s.name, " ", why,
                                                     " during startup; last lines of ", s.log_path,
                                                     ":\n", tail_file(s.log_path, 15)));
        }
        std::string body;
        absl::StatusOr<int> code = http_get(options.host, s.http_port, "/healthz",
                                            std::chrono::milliseconds(1000), &body, options.tls_ca);
        bool ok = code.ok() && *code == 200;
        if (!code.ok()) {
          last_error[i - wave_begin] = std::string(code.status().message());
        } else if (*code != 200) {
          last_error[i - wave_begin] = absl::StrCat("GET /healthz answered ", *code);
        }
        if (ok) {
          absl::StatusOr<int> fd =
              tcp_connect(options.host, s.grpc_port, std::chrono::milliseconds(1000));
          if (fd.ok()) {
            close(*fd);
          } else {
            ok = false;
            last_error[i - wave_begin] = absl::StrCat("gRPC port: ", fd.status().message());
          }
        }
        if (ok) {
          ready[i - wave_begin] = true;
          --remaining;
          if (progress != nullptr) {
            const double secs = std::chrono::duration<double>(Clock::now() - wave_start).count();
            *progress << absl::StrFormat("  %-22s ready  (pid %d, %.1f s)\n", s.name,
                                         static_cast<int>(child.pid()), secs)
                      << std::flush;
          }
        }
      }
      if (remaining == 0) break;
      if (interrupted && interrupted()) {
        cluster->stop();
        return absl::CancelledError("interrupted while the cluster was starting; stopped it");
      }
      if (Clock::now() - wave_start > options.startup_timeout) {
        for (size_t i = wave_begin; i < wave_end; ++i) {
          if (ready[i - wave_begin]) continue;
          const ServiceSpec& s = cluster->specs_[i];
          const std::string message = absl::StrCat(
              s.name, " did not become healthy within ",
              std::chrono::duration_cast<std::chrono::seconds>(options.startup_timeout).count(),
              " s (", last_error[i - wave_begin], "); last lines of ", s.log_path, ":\n",
              tail_file(s.log_path, 15));
          cluster->stop();
          return absl::DeadlineExceededError(message);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  if (absl::Status s = cluster->write_state(); !s.ok()) {
    cluster->stop();
    return s;
  }
  return cluster;
}

LocalCluster::~LocalCluster() { stop(); }

std::string LocalCluster::coordinator_grpc_address() const {
  return absl::StrCat(options_.host, ":", kCoordinatorGrpcPort + options_.port_offset);
}

std::string LocalCluster::coordinator_http_url() const {
  return absl::StrCat(options_.tls_cert.empty() ? "http://" : "https://", options_.host, ":",
                      kCoordinatorHttpPort + options_.port_offset);
}

std::string LocalCluster::state_path() const {
  return (std::filesystem::path(options_.data_dir) / "cluster.json").string();
}

// cluster.json: what runs where, for scripts and tests (pids to signal, logs to read).
absl::Status LocalCluster::write_state() const {
  nlohmann::ordered_json state;
  state["host"] = options_.host;
  state["port_offset"] = options_.port_offset;
  state["data_dir"] = options_.data_dir;
  state["launcher_pid"] = static_cast<int>(getpid());
  state["coordinator_grpc"] = coordinator_grpc_address();
  state["coordinator_http"] = coordinator_http_url();
  nlohmann::ordered_json services = nlohmann::ordered_json::array();
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ServiceSpec& s = specs_[i];
    services.push_back({{"name", s.name},
                        {"pid", static_cast<int>(children_[i]->pid())},
                        {"grpc_port", s.grpc_port},
                        {"http_port", s.http_port},
                        {"log", s.log_path},
                        {"restarts", supervision_[i].restarts}});
  }
  state["services"] = services;
  if (absl::Status s = write_file_atomic(state_path(), state.dump(2) + "\n"); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--data-dir: ", s.message()));
  }
  return absl::OkStatus();
}

namespace {

ChildFailure failure_of(const ServiceSpec& s, std::string description) {
  ChildFailure f;
  f.service = s.name;
  f.essential = s.essential;
  f.description = std::move(description);
  f.log_path = s.log_path;
  f.log_tail = tail_file(s.log_path, 10);
  return f;
}

}  // namespace

void LocalCluster::schedule_restart(size_t i, Clock::time_point now, ChildFailure& failure) {
  const RestartPolicy& policy = options_.restart;
  Supervision& sv = supervision_[i];
  if (!policy.enabled) return;
  // A child that ran longer than quick_crash_window was healthy: its death (a kill, an OOM) starts
  // a fresh count, so only a crash loop is ever given up.
  if (now - sv.started_at >= policy.quick_crash_window) sv.crashes.clear();
  std::erase_if(sv.crashes, [&](Clock::time_point t) { return now - t > policy.give_up_window; });
  sv.crashes.push_back(now);
  if (static_cast<int>(sv.crashes.size()) >= policy.give_up_crashes) {
    failure.gave_up = absl::StrCat(
        "crashed ", sv.crashes.size(), " times within ",
        absl::StrFormat("%g", std::chrono::duration<double>(policy.give_up_window).count()), " s");
    return;
  }
  // The first restart waits initial_backoff; a crash soon after the previous restart doubles it.
  std::chrono::milliseconds backoff = policy.initial_backoff;
  if (sv.last_backoff.count() > 0 && now - sv.started_at < policy.quick_crash_window) {
    backoff = std::min(sv.last_backoff * 2, policy.max_backoff);
  }
  backoff = std::min(backoff, policy.max_backoff);
  sv.last_backoff = backoff;
  sv.restart_at = now + backoff;
  failure.restarting = true;
  failure.restart_in = backoff;
}

std::vector<ChildFailure> LocalCluster::poll_failures() {
  std::vector<ChildFailure> out = std::move(pending_failures_);
  pending_failures_.clear();
  if (stopped_) return out;
  for (size_t i = 0; i < children_.size(); ++i) {
    Supervision& sv = supervision_[i];
    if (sv.reported || children_[i]->running()) continue;
    sv.reported = true;
    const ServiceSpec& s = specs_[i];
    ChildFailure f = failure_of(s, children_[i]->exit_description());
    schedule_restart(i, Clock::now(), f);
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<ChildRestart> LocalCluster::restart_due() {
  std::vector<ChildRestart> out;
  if (stopped_) return out;
  for (size_t i = 0; i < children_.size(); ++i) {
    Supervision& sv = supervision_[i];
    const auto now = Clock::now();
    if (!sv.restart_at || now < *sv.restart_at) continue;
    sv.restart_at.reset();
    const ServiceSpec& s = specs_[i];
    const int restart = sv.restarts + 1;
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::spawn(
        s.binary, s.args, s.log_path,
        absl::StrCat("restart ", restart, "; previous run: ", children_[i]->exit_description()));
    if (!child.ok()) {
      // Counts as one more crash: retried after the next back-off, or given up.
      ChildFailure f =
          failure_of(s, absl::StrCat("could not be restarted: ", child.status().message()));
      sv.started_at = now;  // a quick failure: the next back-off doubles
      schedule_restart(i, now, f);
      pending_failures_.push_back(std::move(f));
      continue;
    }
    children_[i] = std::move(*child);
    sv.reported = false;
    sv.restarts = restart;
    sv.started_at = Clock::now();
    ChildRestart r;
    r.service = s.name;
    r.pid = children_[i]->pid();
    r.restart = restart;
    out.push_back(std::move(r));
  }
  if (!out.empty()) {
    // A failed rewrite leaves the previous file in place; the restart itself stands.
    if (absl::Status s = write_state(); !s.ok()) out.back().state_error = std::string(s.message());
  }
  return out;
}

bool LocalCluster::restart_pending() const {
  return std::any_of(supervision_.begin(), supervision_.end(),
                     [](const Supervision& sv) { return sv.restart_at.has_value(); });
}

std::string LocalCluster::stop() {
  if (stopped_) return "";
  stopped_ = true;
  std::string report;
  // Waves: generation workers and trainer, then the coordinator, then weight sync. Each wave gets
  // SIGTERM together and one shared grace period.
  std::vector<std::vector<size_t>> waves(3);
  for (size_t i = 0; i < children_.size(); ++i) {
    const std::string& name = specs_[i].name;
    waves[name == "weight-sync" ? 2 : name == "coordinator" ? 1 : 0].push_back(i);
  }
  for (const std::vector<size_t>& wave : waves) {
    std::vector<size_t> signalled;
    for (size_t i : wave) {
      if (children_[i]->running()) {
        children_[i]->send_signal(SIGTERM);
        signalled.push_back(i);
      } else if (!supervision_[i].reported && !children_[i]->exited_cleanly()) {
        absl::StrAppend(&report, specs_[i].name, " had ", children_[i]->exit_description(),
                        " (log: ", specs_[i].log_path, ")\n");
      }
      supervision_[i].reported = true;
      supervision_[i].restart_at.reset();  // a pending restart never happens once stopping
    }
    const auto deadline = Clock::now() + options_.stop_grace;
    for (size_t i : signalled) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (!children_[i]->stop(std::max(left, std::chrono::milliseconds(0)))) {
        absl::StrAppend(&report, specs_[i].name, " ignored SIGTERM for ",
                        options_.stop_grace.count() / 1000.0,
                        " s and was killed (log: ", specs_[i].log_path, ")\n");
      } else if (!children_[i]->exited_cleanly() && !children_[i]->killed_by(SIGTERM)) {
        // Dying of our SIGTERM is a clean stop too (a child that had not installed its handler
        // yet, e.g. one restarted a moment ago).
        absl::StrAppend(&report, specs_[i].name, " stopped: ", children_[i]->exit_description(),
                        " (log: ", specs_[i].log_path, ")\n");
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove(state_path(), ec);
  return report;
}

std::string format_endpoints(const std::vector<ServiceSpec>& services, const std::string& host) {
  std::string out;
  for (const ServiceSpec& s : services) {
    const char* http_kind = s.name == "coordinator" ? "REST+/metrics" : "/metrics";
    absl::StrAppend(&out, absl::StrFormat("  %-22s gRPC %s:%d   %s http://%s:%d\n", s.name, host,
                                          s.grpc_port, http_kind, host, s.http_port));
  }
  return out;
}

}  // namespace fp8rl::cli
