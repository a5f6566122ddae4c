// Tests of the `fp8rl up/run` launcher (tools/fp8rl/cluster.h) against fake service binaries
// (fake_service.py), and of the CLI's job views and config preparation (tools/fp8rl/job_client.h).
// Real processes, real ports and signals; each test takes well under a second or two.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tools/fp8rl/cluster.h"
#include "tools/fp8rl/job_client.h"

namespace fp8rl::cli {
namespace {

namespace fs = std::filesystem;

std::string source_dir() {
  const char* dir = std::getenv("FP8RL_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

fs::path make_temp_dir(const std::string& tag) {
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() /
                       absl::StrCat("fp8rl-cli-", tag, "-", getpid(), "-", rd() % 100000);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool process_alive(pid_t pid) { return kill(pid, 0) == 0; }

// The pids the fake services wrote (NAME.pid; a fake stopped mid-write leaves only a temp file).
std::vector<std::pair<fs::path, pid_t>> fake_pids(const fs::path& pid_dir) {
  std::vector<std::pair<fs::path, pid_t>> out;
  for (const auto& entry : fs::directory_iterator(pid_dir)) {
    if (entry.path().extension() != ".pid" || entry.path().filename().string()[0] == '.') continue;
    out.emplace_back(entry.path(), static_cast<pid_t>(std::stoi(read_file(entry.path()))));
  }
  return out;
}

// A port offset whose every port (3 core services + `workers`) is currently free on loopback.
int free_port_offset(int workers) {
  std::mt19937 rng(static_cast<uint32_t>(getpid()) * 7919u +
                   static_cast<uint32_t>(std::random_device{}()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int offset = 1000 + static_cast<int>(rng() % 14000);
    ClusterOptions o;
    o.workers = workers;
    o.port_offset = offset;
    o.bin_dir = "/nonexistent";
    o.data_dir = "/tmp/unused";
    if (check_ports_free(plan_cluster(o), "127.0.0.1").ok()) return offset;
  }
  ADD_FAILURE() << "no free port offset found";
  return 0;
}

// A bin dir whose fp8rl-* binaries are shell wrappers around fake_service.py.
fs::path fake_bin_dir(const fs::path& root) {
  const fs::path bin = root / "bin";
  fs::create_directories(bin);
  const std::string fake = source_dir() + "/tests/system/fake_service.py";
  const std::pair<const char*, const char*> binaries[] = {{"fp8rl-coordinator", "coordinator"},
                                                          {"fp8rl-weight-sync", "weight-sync"},
                                                          {"fp8rl-trainer-worker", "trainer"},
                                                          {"fp8rl-generation-worker", ""}};
  for (const auto& [binary, name] : binaries) {
    // Generation workers take their name from --worker-id.
    const std::string name_flag =
        *name != '\0' ? absl::StrCat("--fake-name=", name)
                      : "--fake-name=$(printf '%s\\n' \"$@\" | sed -n 's/^--worker-id=//p')";
    write_file(bin / binary, absl::StrCat("#!/bin/sh\nexec /usr/bin/python3 ", fake, " ", name_flag,
                                          " \"$@\"\n"));
    fs::permissions(bin / binary,
                    fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  }
  return bin;
}

// Sets/clears the fake services' behaviour variables for one test.
class FakeEnv {
 public:
  explicit FakeEnv(std::initializer_list<std::pair<std::string, std::string>> vars) : vars_(vars) {
    for (const auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~FakeEnv() {
    for (const auto& [k, v] : vars_) unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

// ---------------------------------------------------------------------------------------------
// Plan and options

TEST(ClusterPlan, DefaultPortsPlusOffsetAndWiring) {
  ClusterOptions o;
  o.bin_dir = "/opt/fp8rl/bin";
  o.data_dir = "/var/fp8rl";
  o.workers = 3;
  o.port_offset = 100;
  const std::vector<ServiceSpec> plan = plan_cluster(o);
  ASSERT_EQ(plan.size(), 6u);
  EXPECT_EQ(plan[0].name, "weight-sync");
  EXPECT_EQ(plan[0].grpc_port, 50152);
  EXPECT_EQ(plan[0].http_port, 9502);
  EXPECT_EQ(plan[1].name, "coordinator");
  EXPECT_EQ(plan[1].grpc_port, 50151);
  EXPECT_EQ(plan[1].http_port, 8180);
  EXPECT_EQ(plan[1].binary, "/opt/fp8rl/bin/fp8rl-coordinator");
  EXPECT_EQ(plan[2].name, "trainer");
  EXPECT_EQ(plan[2].grpc_port, 50153);
  EXPECT_EQ(plan[2].http_port, 9503);
  for (int i = 0; i < 3; ++i) {
    const ServiceSpec& w = plan[3 + static_cast<size_t>(i)];
    EXPECT_EQ(w.name, absl::StrCat("generation-worker-", i));
    EXPECT_EQ(w.grpc_port, 50161 + i);
    EXPECT_EQ(w.http_port, 9561 + i);
    EXPECT_FALSE(w.essential);
    EXPECT_EQ(w.log_path, absl::StrCat("/var/fp8rl/logs/generation-worker-", i, ".log"));
    auto has = [&](const std::string& arg) {
      return std::find(w.args.begin(), w.args.end(), arg) != w.args.end();
    };
    EXPECT_TRUE(has("--coordinator=127.0.0.1:50151"));
    EXPECT_TRUE(has("--weight-sync=127.0.0.1:50152"));
    EXPECT_TRUE(has(absl::StrCat("--grpc-port=", 50161 + i)));
    EXPECT_TRUE(has(absl::StrCat("--http-port=", 9561 + i)));
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(plan[i].essential);
  // A local cluster uses the same-host upload and install: weight sync is started with it on.
  const auto& ws_args = plan[0].args;
  EXPECT_NE(std::find(ws_args.begin(), ws_args.end(), "--same-host=auto"), ws_args.end());
  const auto& trainer_args = plan[2].args;
  EXPECT_NE(std::find(trainer_args.begin(), trainer_args.end(), "--data-dir=/var/fp8rl/trainer"),
            trainer_args.end());
}

TEST(ClusterPlan, SecurityFlagsReachEveryService) {
  ClusterOptions o;
  o.bin_dir = "/opt/fp8rl/bin";
  o.data_dir = "/var/fp8rl";
  o.workers = 2;
  o.data_root = "/srv/data";
  const std::vector<ServiceSpec> plain = plan_cluster(o);
  for (const ServiceSpec& s : plain) {
    auto has = [&](const std::string& arg) {
      return std::find(s.args.begin(), s.args.end(), arg) != s.args.end();
    };
    EXPECT_TRUE(has("--cluster-token-file=/var/fp8rl/cluster.token")) << s.name;
    for (const std::string& a : s.args) EXPECT_FALSE(a.starts_with("--tls-")) << s.name << a;
    EXPECT_FALSE(has("--auth-token-file=/etc/api.tokens")) << s.name;
  }
  EXPECT_EQ(cluster_token_path(o), "/var/fp8rl/cluster.token");
  // The trainer re-checks paths against the coordinator's roots.
  const auto& trainer = plain[2].args;
  EXPECT_NE(std::find(trainer.begin(), trainer.end(), "--data-root=/srv/data"), trainer.end());

  o.auth_token_file = "/etc/api.tokens";
  o.tls_cert = "/pki/service.pem";
  o.tls_key = "/pki/service.key";
  o.tls_ca = "/pki/ca.pem";
  for (const ServiceSpec& s : plan_cluster(o)) {
    auto has = [&](const std::string& arg) {
      return std::find(s.args.begin(), s.args.end(), arg) != s.args.end();
    };
    EXPECT_TRUE(has("--tls-cert=/pki/service.pem")) << s.name;
    EXPECT_TRUE(has("--tls-key=/pki/service.key")) << s.name;
    EXPECT_TRUE(has("--tls-ca=/pki/ca.pem")) << s.name;
    EXPECT_EQ(has("--auth-token-file=/etc/api.tokens"), s.name == "coordinator") << s.name;
  }
}

TEST(ClusterPlan, ValidationNamesTheFlag) {
  ClusterOptions o;
  o.bin_dir = "/b";
  o.data_dir = "/d";
  o.workers = 0;
  EXPECT_NE(validate_cluster_options(o).message().find("--workers"), std::string::npos);
  o.workers = 2;
  o.port_offset = 20000;  // 50062 + 20000 > 65535
  absl::Status s = validate_cluster_options(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--port-offset"), std::string::npos) << s;
  o.port_offset = -7500;  // 8080 - 7500 < 1024
  EXPECT_NE(validate_cluster_options(o).message().find("--port-offset"), std::string::npos);
  o.port_offset = 7;
  EXPECT_TRUE(validate_cluster_options(o).ok());
  o.host = "not-an-ip";
  EXPECT_NE(validate_cluster_options(o).message().find("--host"), std::string::npos);
  o.host = "127.0.0.1";
  o.restart.max_backoff = std::chrono::milliseconds(500);  // below the 1 s initial back-off
  EXPECT_NE(validate_cluster_options(o).message().find("restart: initial_backoff"),
            std::string::npos);
  o.restart.max_backoff = std::chrono::milliseconds(30'000);
  o.restart.give_up_crashes = 0;
  EXPECT_NE(validate_cluster_options(o).message().find("give_up_crashes"), std::string::npos);
}

TEST(ClusterPlan, BusyPortIsReportedWithItsService) {
  const int offset = free_port_offset(2);
  ClusterOptions o;
  o.bin_dir = "/b";
  o.data_dir = "/d";
  o.port_offset = offset;
  const int busy = kTrainerMetricsPort + offset;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(busy));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  absl::Status s = check_ports_free(plan_cluster(o), "127.0.0.1");
  close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(absl::StrCat("port ", busy, " (trainer metrics)")), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--port-offset"), std::string::npos);
  EXPECT_TRUE(check_ports_free(plan_cluster(o), "127.0.0.1").ok());
}

// ---------------------------------------------------------------------------------------------
// Child processes

TEST(ChildProcess, LogsExitCodeAndOutput) {
  const fs::path dir = make_temp_dir("child");
  const std::string log = (dir / "logs" / "c.log").string();
  auto child =
      ChildProcess::spawn("/bin/sh", {"-c", "echo out-line; echo err-line >&2; exit 3"}, log);
  ASSERT_TRUE(child.ok()) << child.status();
  for (int i = 0; i < 200 && (*child)->running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE((*child)->running());
  EXPECT_EQ((*child)->exit_description(), "exited with code 3");
  EXPECT_FALSE((*child)->exited_cleanly());
  const std::string text = read_file(log);
  EXPECT_NE(text.find("out-line"), std::string::npos);
  EXPECT_NE(text.find("err-line"), std::string::npos);
  EXPECT_EQ(tail_file(log, 1), "    err-line\n");
  fs::remove_all(dir);
}

TEST(ChildProcess, MissingBinaryIsAClearError) {
  auto child = ChildProcess::spawn("/nonexistent/fp8rl-nothing", {}, "/tmp/unused.log");
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(child.status().message().find("/nonexistent/fp8rl-nothing"), std::string::npos);
}

TEST(ChildProcess, StopUsesSigtermThenSigkill) {
  const fs::path dir = make_temp_dir("stop");
  auto polite = ChildProcess::spawn("/bin/sleep", {"30"}, (dir / "p.log").string());
  ASSERT_TRUE(polite.ok());
  EXPECT_TRUE((*polite)->stop(std::chrono::milliseconds(2000)));
  EXPECT_EQ((*polite)->exit_description(), "killed by signal 15 (Terminated)");

  // Ignores SIGTERM: only SIGKILL ends it. "ready" is printed once the trap is in place.
  const std::string log = (dir / "s.log").string();
  auto stubborn = ChildProcess::spawn(
      "/bin/sh", {"-c", "trap '' TERM; echo ready; while true; do sleep 0.05; done"}, log);
  ASSERT_TRUE(stubborn.ok());
  for (int i = 0; i < 200 && read_file(log).find("ready") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const pid_t pid = (*stubborn)->pid();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE((*stubborn)->stop(std::chrono::milliseconds(300)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_EQ((*stubborn)->exit_description(), "killed by signal 9 (Killed)");
  EXPECT_FALSE(process_alive(pid));
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// LocalCluster with fake services

ClusterOptions fake_options(const fs::path& root, int workers) {
  ClusterOptions o;
  o.bin_dir = fake_bin_dir(root).string();
  o.data_dir = (root / "data").string();
  o.workers = workers;
  o.port_offset = free_port_offset(workers);
  o.startup_timeout = std::chrono::milliseconds(15000);
  o.stop_grace = std::chrono::milliseconds(3000);
  return o;
}

TEST(LocalCluster, StartsSupervisesAndStopsEveryChild) {
  const fs::path root = make_temp_dir("cluster");
  const ClusterOptions o = fake_options(root, 2);
  std::ostringstream progress;
  auto cluster = LocalCluster::start(o, &progress);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_NE(progress.str().find("coordinator"), std::string::npos);
  EXPECT_NE(progress.str().find("generation-worker-1"), std::string::npos);
  EXPECT_EQ((*cluster)->coordinator_grpc_address(),
            absl::StrCat("127.0.0.1:", 50051 + o.port_offset));

  // cluster.json names every child with a live pid, ports and log.
  const nlohmann::json state = nlohmann::json::parse(read_file((*cluster)->state_path()));
  ASSERT_EQ(state["services"].size(), 5u);
  std::map<std::string, pid_t> pids;
  for (const auto& s : state["services"]) {
    pids[s["name"]] = s["pid"].get<int>();
    EXPECT_TRUE(process_alive(s["pid"].get<int>())) << s["name"];
    EXPECT_TRUE(fs::exists(s["log"].get<std::string>()));
  }
  std::string body;
  auto code = http_get("127.0.0.1", 8080 + o.port_offset, "/healthz",
                       std::chrono::milliseconds(2000), &body);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 200);
  EXPECT_EQ(body, R"({"status":"ok"})");
  EXPECT_NE(read_file(root / "data" / "logs" / "trainer.log")
                .find(absl::StrCat("--coordinator=127.0.0.1:", 50051 + o.port_offset)),
            std::string::npos);

  // A generation worker dies: reported once, as non-essential, with its signal.
  kill(pids["generation-worker-1"], SIGKILL);
  std::vector<ChildFailure> failures;
  for (int i = 0; i < 300 && failures.empty(); ++i) {
    failures = (*cluster)->poll_failures();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].service, "generation-worker-1");
  EXPECT_FALSE(failures[0].essential);
  EXPECT_EQ(failures[0].description, "killed by signal 9 (Killed)");
  EXPECT_NE(failures[0].log_tail.find("fake generation-worker-1: started"), std::string::npos);
  EXPECT_TRUE((*cluster)->poll_failures().empty());

  EXPECT_EQ((*cluster)->stop(), "");  // the rest exit 0 on SIGTERM
  for (const auto& [name, pid] : pids) EXPECT_FALSE(process_alive(pid)) << name;
  EXPECT_FALSE(fs::exists((*cluster)->state_path()));
  fs::remove_all(root);
}

TEST(LocalCluster, ServiceThatExitsDuringStartupIsNamedWithItsLog) {
  const fs::path root = make_temp_dir("fail");
  const fs::path pid_dir = root / "pids";
  fs::create_directories(pid_dir);
  FakeEnv env({{"FP8RL_FAKE_FAIL", "trainer"}, {"FP8RL_FAKE_PID_DIR", pid_dir.string()}});
  auto cluster = LocalCluster::start(fake_options(root, 2), nullptr);
  ASSERT_FALSE(cluster.ok());
  const std::string message(cluster.status().message());
  EXPECT_EQ(message.rfind("trainer exited with code 3 during startup", 0), 0u) << message;
  EXPECT_NE(message.find("simulated failure"), std::string::npos) << message;
  EXPECT_NE(message.find("trainer.log"), std::string::npos);
  // Nothing is left running.
  int seen = 0;
  for (const auto& [path, pid] : fake_pids(pid_dir)) {
    ++seen;
    EXPECT_FALSE(process_alive(pid)) << path;
  }
  EXPECT_GE(seen, 3);
  fs::remove_all(root);
}

TEST(LocalCluster, UnhealthyServiceTimesOutAndStopsTheRest) {
  const fs::path root = make_temp_dir("unhealthy");
  const fs::path pid_dir = root / "pids";
  fs::create_directories(pid_dir);
  FakeEnv env({{"FP8RL_FAKE_UNHEALTHY", "weight-sync"}, {"FP8RL_FAKE_PID_DIR", pid_dir.string()}});
  ClusterOptions o = fake_options(root, 1);
  // Long enough for the fake weight sync to answer 503 at least once on a loaded machine.
  o.startup_timeout = std::chrono::milliseconds(4000);
  auto cluster = LocalCluster::start(o, nullptr);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string message(cluster.status().message());
  EXPECT_EQ(message.rfind("weight-sync did not become healthy", 0), 0u) << message;
  EXPECT_NE(message.find("answered 503"), std::string::npos) << message;
  for (const auto& [path, pid] : fake_pids(pid_dir)) {
    EXPECT_FALSE(process_alive(pid)) << path;
  }
  fs::remove_all(root);
}

TEST(LocalCluster, ChildIgnoringSigtermIsKilledAndReported) {
  const fs::path root = make_temp_dir("stubborn");
  FakeEnv env({{"FP8RL_FAKE_IGNORE_TERM", "coordinator"}});
  ClusterOptions o = fake_options(root, 1);
  o.stop_grace = std::chrono::milliseconds(400);
  auto cluster = LocalCluster::start(o, nullptr);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string report = (*cluster)->stop();
  EXPECT_NE(report.find("coordinator ignored SIGTERM"), std::string::npos) << report;
  EXPECT_EQ(report.find("trainer"), std::string::npos) << report;
  fs::remove_all(root);
}

// ---------------------------------------------------------------------------------------------
// Restarts (RestartPolicy): crashed children come back with the same flags and ports

using SteadyClock = std::chrono::steady_clock;

// What supervision rounds (poll_failures + restart_due, as `fp8rl up` does them) saw, with the
// time each was seen; failures are stamped before the round so that back-offs can be checked.
struct Supervised {
  std::vector<std::pair<SteadyClock::time_point, ChildFailure>> failures;
  std::vector<std::pair<SteadyClock::time_point, ChildRestart>> restarts;
};

// Runs supervision rounds every 10 ms until `done` holds or `timeout` passes.
void supervise_until(LocalCluster& cluster, Supervised& seen, std::chrono::milliseconds timeout,
                     const std::function<bool(const Supervised&)>& done) {
  const auto deadline = SteadyClock::now() + timeout;
  while (!done(seen) && SteadyClock::now() < deadline) {
    const auto before = SteadyClock::now();
    for (ChildFailure& f : cluster.poll_failures()) seen.failures.emplace_back(before, f);
    for (ChildRestart& r : cluster.restart_due()) {
      seen.restarts.emplace_back(SteadyClock::now(), r);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

nlohmann::json service_state(const LocalCluster& cluster, const std::string& name) {
  const nlohmann::json state = nlohmann::json::parse(read_file(cluster.state_path()));
  for (const auto& s : state["services"]) {
    if (s["name"] == name) return s;
  }
  ADD_FAILURE() << name << " missing from cluster.json";
  return {};
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

bool healthy_within(int port, std::chrono::milliseconds timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  while (SteadyClock::now() < deadline) {
    auto code = http_get("127.0.0.1", port, "/healthz", std::chrono::milliseconds(500));
    if (code.ok() && *code == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(LocalClusterRestart, KilledEssentialServiceComesBackWithNewPidSamePortsAndAppendedLog) {
  const fs::path root = make_temp_dir("restart");
  ClusterOptions o = fake_options(root, 1);
  o.restart.initial_backoff = std::chrono::milliseconds(300);
  auto cluster = LocalCluster::start(o, nullptr);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const nlohmann::json before = service_state(**cluster, "coordinator");
  const pid_t old_pid = before["pid"].get<int>();
  EXPECT_EQ(before["restarts"], 0);
  const pid_t trainer_pid = service_state(**cluster, "trainer")["pid"].get<int>();

  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  Supervised seen;
  supervise_until(**cluster, seen, std::chrono::milliseconds(5000),
                  [](const Supervised& s) { return !s.restarts.empty(); });
  ASSERT_EQ(seen.failures.size(), 1u);
  const ChildFailure& f = seen.failures[0].second;
  EXPECT_EQ(f.service, "coordinator");
  EXPECT_TRUE(f.essential);
  EXPECT_EQ(f.description, "killed by signal 9 (Killed)");
  EXPECT_TRUE(f.restarting);
  EXPECT_EQ(f.restart_in, std::chrono::milliseconds(300));
  EXPECT_TRUE(f.gave_up.empty());
  EXPECT_NE(f.log_tail.find("fake coordinator: started"), std::string::npos) << f.log_tail;

  ASSERT_EQ(seen.restarts.size(), 1u);
  const ChildRestart& r = seen.restarts[0].second;
  EXPECT_EQ(r.service, "coordinator");
  EXPECT_EQ(r.restart, 1);
  EXPECT_TRUE(r.state_error.empty()) << r.state_error;
  EXPECT_NE(r.pid, old_pid);
  EXPECT_TRUE(process_alive(r.pid));
  EXPECT_GE(seen.restarts[0].first - seen.failures[0].first, std::chrono::milliseconds(300));
  EXPECT_FALSE((*cluster)->restart_pending());

  // Same ports, healthy again; cluster.json names the new pid and counts the restart.
  EXPECT_TRUE(healthy_within(8080 + o.port_offset, std::chrono::milliseconds(5000)));
  const nlohmann::json after = service_state(**cluster, "coordinator");
  EXPECT_EQ(after["pid"].get<int>(), r.pid);
  EXPECT_EQ(after["restarts"], 1);
  EXPECT_EQ(after["http_port"], before["http_port"]);
  EXPECT_EQ(after["grpc_port"], before["grpc_port"]);
  EXPECT_EQ(service_state(**cluster, "trainer")["pid"].get<int>(), trainer_pid);
  EXPECT_EQ(service_state(**cluster, "trainer")["restarts"], 0);

  // One log, both runs: the first start, then a restart header naming the previous death.
  const std::string log = read_file(f.log_path);
  EXPECT_EQ(count_of(log, "fake coordinator: started"), 2u) << log;
  EXPECT_EQ(count_of(log, "=== fp8rl launcher: starting "), 1u) << log;
  EXPECT_NE(log.find("(restart 1; previous run: killed by signal 9 (Killed)) ==="),
            std::string::npos)
      << log;
  EXPECT_LT(log.find("=== fp8rl launcher: starting "), log.find("=== fp8rl launcher: restarting "));

  // A second crash of the restarted child is seen like the first (the new child is supervised).
  ASSERT_EQ(kill(r.pid, SIGKILL), 0);
  supervise_until(**cluster, seen, std::chrono::milliseconds(5000),
                  [](const Supervised& s) { return s.restarts.size() == 2; });
  ASSERT_EQ(seen.failures.size(), 2u);
  EXPECT_EQ(seen.failures[1].second.service, "coordinator");
  // It crashed within the quick-crash window of its restart: the back-off doubled.
  EXPECT_EQ(seen.failures[1].second.restart_in, std::chrono::milliseconds(600));
  ASSERT_EQ(seen.restarts.size(), 2u);
  EXPECT_EQ(seen.restarts[1].second.restart, 2);
  EXPECT_EQ(service_state(**cluster, "coordinator")["restarts"], 2);

  const pid_t newest = seen.restarts[1].second.pid;
  EXPECT_TRUE(healthy_within(8080 + o.port_offset, std::chrono::milliseconds(5000)));
  EXPECT_EQ((*cluster)->stop(), "");
  EXPECT_FALSE(process_alive(newest));
  EXPECT_FALSE(process_alive(trainer_pid));
  EXPECT_FALSE(fs::exists((*cluster)->state_path()));
  fs::remove_all(root);
}

TEST(LocalClusterRestart, CrashLoopIsGivenUpAfterTheLimitWithDoublingCappedBackoff) {
  const fs::path root = make_temp_dir("crashloop");
  const fs::path crash_dir = root / "crash";
  fs::create_directories(crash_dir);
  FakeEnv env({{"FP8RL_FAKE_CRASH_DIR", crash_dir.string()}});
  ClusterOptions o = fake_options(root, 1);
  o.restart.initial_backoff = std::chrono::milliseconds(100);
  o.restart.max_backoff = std::chrono::milliseconds(300);
  o.restart.quick_crash_window = std::chrono::milliseconds(10'000);
  o.restart.give_up_crashes = 4;
  o.restart.give_up_window = std::chrono::milliseconds(60'000);
  auto cluster = LocalCluster::start(o, nullptr);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const pid_t first = service_state(**cluster, "trainer")["pid"].get<int>();

  // From now on every start of the trainer crashes at once.
  write_file(crash_dir / "trainer.crash", "");
  ASSERT_EQ(kill(first, SIGKILL), 0);
  Supervised seen;
  supervise_until(**cluster, seen, std::chrono::milliseconds(10'000), [](const Supervised& s) {
    return !s.failures.empty() && !s.failures.back().second.restarting;
  });
  ASSERT_EQ(seen.failures.size(), 4u);
  ASSERT_EQ(seen.restarts.size(), 3u);
  const std::chrono::milliseconds expected_backoff[] = {std::chrono::milliseconds(100),
                                                        std::chrono::milliseconds(200),
                                                        std::chrono::milliseconds(300)};
  for (size_t k = 0; k < 3; ++k) {
    const ChildFailure& f = seen.failures[k].second;
    EXPECT_EQ(f.service, "trainer");
    EXPECT_TRUE(f.restarting) << k;
    EXPECT_EQ(f.restart_in, expected_backoff[k]) << k;
    EXPECT_EQ(f.description, k == 0 ? "killed by signal 9 (Killed)" : "exited with code 4") << k;
    EXPECT_EQ(seen.restarts[k].second.restart, static_cast<int>(k) + 1);
    // The restart never comes before its back-off ran out.
    EXPECT_GE(seen.restarts[k].first - seen.failures[k].first, expected_backoff[k]) << k;
  }
  const ChildFailure& last = seen.failures[3].second;
  EXPECT_EQ(last.description, "exited with code 4");
  EXPECT_FALSE(last.restarting);
  EXPECT_TRUE(last.essential);
  EXPECT_EQ(last.gave_up, "crashed 4 times within 60 s");
  EXPECT_NE(last.log_tail.find("simulated crash at start"), std::string::npos) << last.log_tail;
  EXPECT_FALSE((*cluster)->restart_pending());

  // Given up: nothing more is started, however long we wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE((*cluster)->restart_due().empty());
  EXPECT_TRUE((*cluster)->poll_failures().empty());
  EXPECT_EQ(service_state(**cluster, "trainer")["restarts"], 3);
  const std::string log = read_file(last.log_path);
  EXPECT_EQ(count_of(log, "=== fp8rl launcher: restarting "), 3u) << log;
  EXPECT_EQ(count_of(log, "simulated crash at start"), 3u) << log;
  EXPECT_EQ((*cluster)->stop(), "");  // the crashes were reported already
  fs::remove_all(root);
}

TEST(LocalClusterRestart, NoRestartReportsTheExitAsFinal) {
  const fs::path root = make_temp_dir("norestart");
  ClusterOptions o = fake_options(root, 2);
  o.restart.enabled = false;
  o.restart.initial_backoff = std::chrono::milliseconds(50);
  auto cluster = LocalCluster::start(o, nullptr);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const pid_t pid = service_state(**cluster, "trainer")["pid"].get<int>();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  Supervised seen;
  supervise_until(**cluster, seen, std::chrono::milliseconds(3000),
                  [](const Supervised& s) { return !s.failures.empty(); });
  ASSERT_EQ(seen.failures.size(), 1u);
  const ChildFailure& f = seen.failures[0].second;
  EXPECT_EQ(f.service, "trainer");
  EXPECT_EQ(f.description, "killed by signal 9 (Killed)");
  EXPECT_FALSE(f.restarting);
  EXPECT_TRUE(f.gave_up.empty());  // not given up after crashes: restarts are off
  EXPECT_FALSE((*cluster)->restart_pending());
  supervise_until(**cluster, seen, std::chrono::milliseconds(400),
                  [](const Supervised&) { return false; });
  EXPECT_TRUE(seen.restarts.empty());
  EXPECT_EQ(seen.failures.size(), 1u);
  EXPECT_EQ(service_state(**cluster, "trainer")["pid"].get<int>(), pid);
  EXPECT_EQ(count_of(read_file(f.log_path), "fake trainer: started"), 1u);
  EXPECT_EQ((*cluster)->stop(), "");
  fs::remove_all(root);
}

TEST(LocalClusterRestart, StopDuringAPendingRestartStartsNothing) {
  const fs::path root = make_temp_dir("pending");
  const fs::path pid_dir = root / "pids";
  fs::create_directories(pid_dir);
  FakeEnv env({{"FP8RL_FAKE_PID_DIR", pid_dir.string()}});
  ClusterOptions o = fake_options(root, 1);
  o.restart.initial_backoff = std::chrono::milliseconds(800);
  auto cluster = LocalCluster::start(o, nullptr);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const pid_t pid = service_state(**cluster, "coordinator")["pid"].get<int>();
  const std::string log = service_state(**cluster, "coordinator")["log"];
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  Supervised seen;
  supervise_until(**cluster, seen, std::chrono::milliseconds(3000),
                  [](const Supervised& s) { return !s.failures.empty(); });
  ASSERT_EQ(seen.failures.size(), 1u);
  EXPECT_TRUE(seen.failures[0].second.restarting);
  EXPECT_TRUE((*cluster)->restart_pending());
  EXPECT_TRUE(seen.restarts.empty());

  EXPECT_EQ((*cluster)->stop(), "");
  EXPECT_FALSE((*cluster)->restart_pending());
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // past the back-off
  EXPECT_TRUE((*cluster)->restart_due().empty());
  EXPECT_TRUE((*cluster)->poll_failures().empty());
  // No new coordinator ever ran: its pid file still holds the killed one, its log one start.
  EXPECT_EQ(read_file(pid_dir / "coordinator.pid"), std::to_string(pid));
  EXPECT_EQ(read_file(log).find("=== fp8rl launcher: restarting "), std::string::npos);
  for (const auto& [path, pid] : fake_pids(pid_dir)) {
    EXPECT_FALSE(process_alive(pid)) << path;
  }
  fs::remove_all(root);
}

// `fp8rl up` itself (bin/fp8rl from FP8RL_BIN_DIR) on the fake services: the messages it prints
// for a crash and a restart, and --no-restart stopping the cluster on an essential crash.
fs::path fp8rl_binary() {
  const char* dir = std::getenv("FP8RL_BIN_DIR");
  return fs::path(dir != nullptr ? dir : "bin") / "fp8rl";
}

// Waits until `path` contains `needle`; returns the text.
std::string wait_for_text(const fs::path& path, const std::string& needle,
                          std::chrono::milliseconds timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  std::string text = read_file(path);
  while (text.find(needle) == std::string::npos && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    text = read_file(path);
  }
  return text;
}

TEST(UpCommand, RestartsAKilledTrainerAndStopsCleanlyOnSigterm) {
  if (access(fp8rl_binary().c_str(), X_OK) != 0) GTEST_SKIP() << fp8rl_binary() << " not built";
  const fs::path root = make_temp_dir("up");
  const fs::path out = root / "up.out";
  const fs::path data = root / "data";
  auto up = ChildProcess::spawn(
      fp8rl_binary().string(),
      {"up", "--workers", "1", "--port-offset", std::to_string(free_port_offset(1)), "--data-dir",
       data.string(), "--bin-dir", fake_bin_dir(root).string(), "--stop-timeout", "3"},
      out.string());
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_NE(wait_for_text(out, "fp8rl cluster is up", std::chrono::seconds(15))
                .find("fp8rl cluster is up"),
            std::string::npos)
      << read_file(out);
  const nlohmann::json state = nlohmann::json::parse(read_file(data / "cluster.json"));
  pid_t trainer = 0;
  for (const auto& s : state["services"]) {
    if (s["name"] == "trainer") trainer = s["pid"].get<int>();
  }
  ASSERT_GT(trainer, 0);
  ASSERT_EQ(kill(trainer, SIGKILL), 0);
  const std::string text =
      wait_for_text(out, "fp8rl up: trainer restarted (pid ", std::chrono::seconds(10));
  EXPECT_NE(text.find("fp8rl up: trainer killed by signal 9 (Killed) (restarting it in 1.0 s)"),
            std::string::npos)
      << text;
  const size_t at = text.find("fp8rl up: trainer restarted (pid ");
  ASSERT_NE(at, std::string::npos) << text;
  const pid_t restarted = std::atoi(text.c_str() + at + 33);
  EXPECT_NE(text.find(", restart 1)", at), std::string::npos) << text;
  EXPECT_NE(restarted, trainer);
  EXPECT_TRUE(process_alive(restarted));
  EXPECT_TRUE((*up)->running());  // the launcher keeps going

  (*up)->send_signal(SIGTERM);
  for (int i = 0; i < 200 && (*up)->running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ((*up)->exit_description(), "exited with code 0") << read_file(out);
  EXPECT_FALSE(process_alive(restarted));
  EXPECT_FALSE(fs::exists(data / "cluster.json"));
  fs::remove_all(root);
}

TEST(UpCommand, NoRestartStopsTheClusterWhenAnEssentialServiceDies) {
  if (access(fp8rl_binary().c_str(), X_OK) != 0) GTEST_SKIP() << fp8rl_binary() << " not built";
  const fs::path root = make_temp_dir("up-norestart");
  const fs::path out = root / "up.out";
  const fs::path data = root / "data";
  auto up = ChildProcess::spawn(
      fp8rl_binary().string(),
      {"up", "--workers", "1", "--port-offset", std::to_string(free_port_offset(1)), "--data-dir",
       data.string(), "--bin-dir", fake_bin_dir(root).string(), "--no-restart"},
      out.string());
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_NE(wait_for_text(out, "fp8rl cluster is up", std::chrono::seconds(15))
                .find("fp8rl cluster is up"),
            std::string::npos)
      << read_file(out);
  const nlohmann::json state = nlohmann::json::parse(read_file(data / "cluster.json"));
  std::vector<pid_t> pids;
  pid_t coordinator = 0;
  for (const auto& s : state["services"]) {
    pids.push_back(s["pid"].get<int>());
    if (s["name"] == "coordinator") coordinator = s["pid"].get<int>();
  }
  ASSERT_EQ(kill(coordinator, SIGKILL), 0);
  for (int i = 0; i < 200 && (*up)->running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string text = read_file(out);
  EXPECT_EQ((*up)->exit_description(), "exited with code 1") << text;
  EXPECT_NE(text.find("fp8rl up: coordinator killed by signal 9 (Killed) (the cluster cannot "
                      "continue)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("restarted"), std::string::npos) << text;
  EXPECT_NE(text.find("cluster stopped"), std::string::npos) << text;
  for (pid_t pid : pids) EXPECT_FALSE(process_alive(pid)) << pid;
  fs::remove_all(root);
}

// ---------------------------------------------------------------------------------------------
// Job views and config preparation

v1::StepMetrics row(int64_t step, std::map<std::string, double> values) {
  v1::StepMetrics m;
  m.set_step(step);
  for (const auto& [k, v] : values) (*m.mutable_values())[k] = v;
  return m;
}

TEST(JobViews, StepLineShowsRewardAccuracyMismatchAndPhases) {
  const std::string line = format_step_line(row(2, {{"reward_mean", 0.375},
                                                    {"val_accuracy", 0.5},
                                                    {"token_mult_prob_error", 1.01234},
                                                    {"sampling_importance_ratio", 0.99871},
                                                    {"time_generate_seconds", 1.2},
                                                    {"time_train_seconds", 0.8},
                                                    {"time_step_seconds", 2.45}}),
                                            3);
  EXPECT_EQ(line,
            "step 2/3  reward 0.375  val_acc 0.500  mult_prob_err 1.0123  is_ratio 0.9987  | "
            "generate 1.20s train 0.80s  | step 2.45s");
  const std::string zero =
      format_step_line(row(0, {{"val_accuracy", 0.25}, {"time_sft_seconds", 3.0}}), 12);
  EXPECT_EQ(zero, "step  0/12  before RL:  val_acc 0.250  | sft 3.00s");
}

TEST(JobViews, SummaryHasAccuracyMismatchAndTimeSplit) {
  v1::Job job;
  job.set_id("job-1");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.set_step(3);
  job.set_total_steps(3);
  const std::vector<v1::StepMetrics> rows = {
      row(0, {{"val_accuracy", 0.25}, {"time_sft_seconds", 3.0}, {"time_validate_seconds", 1.0}}),
      row(1, {{"token_mult_prob_error", 1.02},
              {"sampling_importance_ratio", 0.97},
              {"probs_ratio_min", 0.5},
              {"probs_ratio_max", 1.5},
              {"time_generate_seconds", 2.0},
              {"time_train_seconds", 2.0}}),
      row(2, {{"val_accuracy", 0.75},
              {"token_mult_prob_error", 1.04},
              {"sampling_importance_ratio", 0.99},
              {"probs_ratio_min", 0.4},
              {"probs_ratio_max", 1.2},
              {"time_generate_seconds", 2.0}}),
      row(3, {{"val_accuracy", 0.625},
              {"token_mult_prob_error", 1.06},
              {"sampling_importance_ratio", 1.01}}),
  };
  const std::string s = format_summary(job, rows, 12.34);
  EXPECT_NE(s.find("job-1: SUCCEEDED after 3/3 steps"), std::string::npos) << s;
  EXPECT_NE(s.find("val accuracy before: 0.250 (step 0)"), std::string::npos) << s;
  EXPECT_NE(s.find("val accuracy after:  0.625 (step 3)"), std::string::npos) << s;
  EXPECT_NE(s.find("val accuracy best:   0.750 (step 2)"), std::string::npos) << s;
  EXPECT_NE(s.find("accuracy change:     +0.375"), std::string::npos) << s;
  EXPECT_NE(s.find("token_mult_prob_error      1.040000"), std::string::npos) << s;
  EXPECT_NE(s.find("sampling_importance_ratio  0.990000"), std::string::npos) << s;
  EXPECT_NE(s.find("probs_ratio_min            0.400000"), std::string::npos) << s;
  EXPECT_NE(s.find("probs_ratio_max            1.500000"), std::string::npos) << s;
  // 10 s of phases: sft 3 (30%), validate 1 (10%), generate 4 (40%), train 2 (20%).
  EXPECT_NE(s.find("sft               3.00 s   30.0%"), std::string::npos) << s;
  EXPECT_NE(s.find("generate          4.00 s   40.0%"), std::string::npos) << s;
  EXPECT_NE(s.find("train             2.00 s   20.0%"), std::string::npos) << s;
  EXPECT_NE(s.find("validate          1.00 s   10.0%"), std::string::npos) << s;
  EXPECT_LT(s.find("sft "), s.find("generate "));  // loop order, not alphabetical
  EXPECT_NE(s.find("total time:          12.3 s (4 metric rows)"), std::string::npos) << s;
}

TEST(JobViews, StatesParseAndPrint) {
  EXPECT_EQ(*parse_job_state("running"), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(*parse_job_state("JOB_STATE_FAILED"), v1::JOB_STATE_FAILED);
  EXPECT_NE(parse_job_state("done").status().message().find("--state"), std::string::npos);
  EXPECT_TRUE(is_terminal(v1::JOB_STATE_CANCELLED));
  EXPECT_FALSE(is_terminal(v1::JOB_STATE_QUEUED));
  v1::Job job;
  job.set_id("job-7");
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_step(1);
  job.set_total_steps(4);
  job.set_error("trainer: gone");
  const std::string table = format_job_table({job});
  EXPECT_NE(table.find("job-7"), std::string::npos);
  EXPECT_NE(table.find("FAILED"), std::string::npos);
  EXPECT_NE(table.find("1/4"), std::string::npos);
  EXPECT_NE(format_job_details(job).find("error:    trainer: gone"), std::string::npos);
}

v1::Job running_job(const std::string& phase, int64_t done, int64_t total,
                    const std::string& detail) {
  v1::Job job;
  job.set_id("job-9");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_total_steps(5);
  job.mutable_progress()->set_phase(phase);
  job.mutable_progress()->set_done(done);
  job.mutable_progress()->set_total(total);
  job.mutable_progress()->set_detail(detail);
  return job;
}

TEST(JobViews, PhasesBeforeTheFirstRowArePrintedOnce) {
  EXPECT_EQ(format_progress_line(running_job("sft", 12, 120, "loss 2.3412").progress()),
            "sft   12/120  loss 2.3412");
  EXPECT_EQ(format_progress_line(running_job("rl", 1, 5, "train").progress()), "");
  EXPECT_EQ(
      format_progress_line(running_job("trainer_lost", 0, 0, "train step 2: gone").progress()),
      "trainer lost: train step 2: gone");
  const std::string details = format_job_details(running_job("sft", 12, 120, "loss 2.3412"));
  EXPECT_NE(details.find("phase:    sft 12/120 (loss 2.3412)"), std::string::npos) << details;

  // A printer fed every event of a run before row 0 (no metrics yet, so it never needs a client).
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  ASSERT_NE(out, nullptr);
  {
    ProgressPrinter printer(nullptr, out);
    ASSERT_TRUE(printer.update(running_job("waiting_for_trainer", 0, 0, "")).ok());
    ASSERT_TRUE(printer.update(running_job("waiting_for_trainer", 0, 0, "")).ok());
    ASSERT_TRUE(printer.update(running_job("initializing", 0, 0, "")).ok());
    for (int64_t done = 0; done <= 20; ++done) {
      ASSERT_TRUE(printer.update(running_job("sft", done, 20, absl::StrCat("loss ", done))).ok());
      ASSERT_TRUE(printer.update(running_job("sft", done, 20, absl::StrCat("loss ", done))).ok());
    }
    ASSERT_TRUE(printer.update(running_job("syncing_weights", 0, 0, "")).ok());
    ASSERT_TRUE(printer.update(running_job("rl", 0, 5, "rollout")).ok());
    ASSERT_TRUE(printer.update(running_job("trainer_lost", 0, 0, "gone (10 s left)")).ok());
    ASSERT_TRUE(printer.update(running_job("trainer_lost", 0, 0, "gone (9 s left)")).ok());
  }
  std::fclose(out);
  const std::string text(buffer, size);
  std::free(buffer);
  std::string expected =
      "waiting for a trainer\ninitializing the policy on the trainer\nsft   0/20  loss 0\n";
  for (int64_t done = 2; done <= 20; done += 2) {
    absl::StrAppend(&expected, absl::StrFormat("sft  %2d/20  loss %d\n", done, done));
  }
  absl::StrAppend(
      &expected,
      "publishing the weights to the generation workers\ntrainer lost: gone (10 s left)\n");
  EXPECT_EQ(text, expected);
}

constexpr char kConfig[] = R"(name: t
model:
  init:
    config: MODEL
    seed: 3
task:
  name: addition
algorithm:
  steps: 2
  prompts_per_step: 2
  samples_per_prompt: 2
checkpoint:
  every_steps: 1
  dir: out/ckpt
)";

std::string config_with_model(const std::string& model) {
  std::string text = kConfig;
  text.replace(text.find("MODEL"), 5, model);
  return text;
}

TEST(JobConfigPrep, RelativePathsResolveAgainstWorkingDirThenConfigFolder) {
  const fs::path root = make_temp_dir("cfg");
  const fs::path cwd = root / "cwd";
  const fs::path cfg_dir = root / "configs";
  fs::create_directories(cwd / "models");
  fs::create_directories(cfg_dir / "models");
  const std::string model = read_file(fs::path(source_dir()) / "configs/models/tiny.json");
  ASSERT_FALSE(model.empty());
  write_file(cfg_dir / "models" / "only-here.json", model);
  write_file(cwd / "models" / "both.json", model);
  write_file(cfg_dir / "models" / "both.json", model);

  write_file(cfg_dir / "a.yaml", config_with_model("models/only-here.json"));
  auto a = prepare_job_config((cfg_dir / "a.yaml").string(), cwd.string());
  ASSERT_TRUE(a.ok()) << a.status();
  nlohmann::json ja = nlohmann::json::parse(*a);
  EXPECT_EQ(ja["model"]["init"]["config"], (cfg_dir / "models" / "only-here.json").string());
  EXPECT_EQ(ja["checkpoint"]["dir"], (cwd / "out" / "ckpt").string());

  write_file(cfg_dir / "b.yaml", config_with_model("models/both.json"));
  auto b = prepare_job_config((cfg_dir / "b.yaml").string(), cwd.string());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(nlohmann::json::parse(*b)["model"]["init"]["config"],
            (cwd / "models" / "both.json").string());

  write_file(cfg_dir / "c.yaml", config_with_model("models/missing.json"));
  auto c = prepare_job_config((cfg_dir / "c.yaml").string(), cwd.string());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.init.config: 'models/missing.json' not found"),
            std::string::npos)
      << c.status();
  fs::remove_all(root);
}

TEST(JobConfigPrep, InvalidConfigNamesFileAndField) {
  const fs::path root = make_temp_dir("bad");
  std::string text = config_with_model("/abs/model.json");
  text.replace(text.find("samples_per_prompt: 2"), 21, "samples_per_prompt: 1");
  write_file(root / "bad.yaml", text);
  auto r = prepare_job_config((root / "bad.yaml").string(), root.string());
  ASSERT_FALSE(r.ok());
  const std::string message(r.status().message());
  EXPECT_EQ(message.rfind((root / "bad.yaml").string() + ": ", 0), 0u) << message;
  EXPECT_NE(message.find("algorithm.samples_per_prompt"), std::string::npos) << message;
  auto missing = prepare_job_config((root / "nope.yaml").string(), root.string());
  EXPECT_NE(missing.status().message().find("nope.yaml"), std::string::npos);
  fs::remove_all(root);
}

TEST(JobClientConnect, UnreachableCoordinatorIsOneClearError) {
  const int offset = free_port_offset(1);
  const std::string address = absl::StrCat("127.0.0.1:", 50051 + offset);
  const auto start = std::chrono::steady_clock::now();
  auto client = JobClient::connect(address, std::chrono::milliseconds(800));
  ASSERT_FALSE(client.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find("cannot reach the coordinator at " + address),
            std::string::npos);
  EXPECT_EQ(JobClient::connect("no-port").status().code(), absl::StatusCode::kInvalidArgument);
}

// A JobService whose WatchJob answers from a script, one entry per stream opened: refuse it
// (RESOURCE_EXHAUSTED with a push-back, as the coordinator's admission does), send these states
// then break it (UNAVAILABLE, a coordinator going away), or send these states and end.
class ScriptedWatchService final : public v1::JobService::Service {
 public:
  struct Stream {
    std::vector<v1::JobState> states;
    grpc::StatusCode end = grpc::StatusCode::OK;
  };
  explicit ScriptedWatchService(std::vector<Stream> script) : script_(std::move(script)) {}

  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    const int call = calls_.fetch_add(1);
    const Stream& stream = script_[std::min<size_t>(call, script_.size() - 1)];
    for (v1::JobState state : stream.states) {
      v1::JobEvent event;
      event.mutable_job()->set_id(request->id());
      event.mutable_job()->set_state(state);
      event.mutable_job()->set_step(call);
      writer->Write(event);
    }
    if (stream.end == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      context->AddTrailingMetadata("grpc-retry-pushback-ms", "20");
      return grpc::Status(stream.end, "too many requests in flight (--max-inflight-requests 1)");
    }
    if (stream.end != grpc::StatusCode::OK) return grpc::Status(stream.end, "coordinator stopping");
    return grpc::Status::OK;
  }
  int calls() const { return calls_.load(); }

 private:
  std::vector<Stream> script_;
  std::atomic<int> calls_{0};
};

struct FakeCoordinator {
  explicit FakeCoordinator(std::vector<ScriptedWatchService::Stream> script)
      : service(std::move(script)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~FakeCoordinator() { server->Shutdown(); }
  std::unique_ptr<JobClient> client() {
    absl::StatusOr<std::unique_ptr<JobClient>> c =
        JobClient::connect(absl::StrCat("127.0.0.1:", port));
    EXPECT_TRUE(c.ok()) << c.status();
    RetryPolicy fast;
    fast.initial_backoff = std::chrono::milliseconds(10);
    fast.max_backoff = std::chrono::milliseconds(40);
    (*c)->set_retry_policy(fast);
    return std::move(*c);
  }
  ScriptedWatchService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

using Code = grpc::StatusCode;

TEST(JobClientWatch, RefusedAndBrokenStreamsAreOpenedAgainUntilTheJobEnds) {
  FakeCoordinator fake({{{}, Code::RESOURCE_EXHAUSTED},
                        {{}, Code::RESOURCE_EXHAUSTED},
                        {{v1::JOB_STATE_RUNNING}, Code::UNAVAILABLE},
                        {{v1::JOB_STATE_RUNNING}, Code::OK},  // ended early by the server
                        {{v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED}, Code::OK}});
  std::unique_ptr<JobClient> client = fake.client();
  ASSERT_NE(client, nullptr);
  std::vector<std::pair<v1::JobState, int64_t>> seen;
  absl::Status s = client->watch("job-1", [&](const v1::Job& job) {
    seen.emplace_back(job.state(), job.step());
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(fake.service.calls(), 5);
  const std::vector<std::pair<v1::JobState, int64_t>> want = {{v1::JOB_STATE_RUNNING, 2},
                                                              {v1::JOB_STATE_RUNNING, 3},
                                                              {v1::JOB_STATE_RUNNING, 4},
                                                              {v1::JOB_STATE_SUCCEEDED, 4}};
  EXPECT_EQ(seen, want);
}

TEST(JobClientWatch, GivesUpAfterTheTriesNamingTheRefusal) {
  FakeCoordinator fake({{{}, Code::RESOURCE_EXHAUSTED}});
  std::unique_ptr<JobClient> client = fake.client();
  ASSERT_NE(client, nullptr);
  absl::Status s = client->watch("job-1", [](const v1::Job&) { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("gave up after 8 tries"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--max-inflight-requests"), std::string::npos) << s;
  EXPECT_EQ(fake.service.calls(), 8);
}

TEST(JobClientWatch, OtherErrorsEndTheWatchAtOnce) {
  FakeCoordinator fake({{{v1::JOB_STATE_RUNNING}, Code::NOT_FOUND}});
  std::unique_ptr<JobClient> client = fake.client();
  ASSERT_NE(client, nullptr);
  absl::Status s = client->watch("job-1", [](const v1::Job&) { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(fake.service.calls(), 1);
}

TEST(JobClientWatch, StopWatchEndsTheWaitBetweenTries) {
  FakeCoordinator fake({{{}, Code::RESOURCE_EXHAUSTED}});
  std::unique_ptr<JobClient> client = fake.client();
  ASSERT_NE(client, nullptr);
  RetryPolicy slow;
  slow.initial_backoff = std::chrono::milliseconds(30'000);
  slow.max_backoff = std::chrono::milliseconds(30'000);
  slow.budget = std::chrono::milliseconds(600'000);
  client->set_retry_policy(slow);
  std::thread stopper([&] {
    while (fake.service.calls() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    client->stop_watch();
  });
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = client->watch("job-1", [](const v1::Job&) { return true; });
  stopper.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(fake.service.calls(), 1);
}

}  // namespace
}  // namespace fp8rl::cli
