// Tests of the registration loop every worker process shares (common/service/worker_registration)
// against an in-process WorkerRegistry on loopback: what is registered, heartbeats with the load,
// registering again on a reregister answer, on NOT_FOUND and after a coordinator restart,
// deregistration, bounded stop with a hanging or absent coordinator, and option errors naming the
// field.
#include "common/service/worker_registration.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"

namespace fp8rl::service {
namespace {

using namespace std::chrono_literals;

// A coordinator stand-in: records every call; answers the next heartbeat with `reregister` or
// with NOT_FOUND when asked to.
class FakeRegistry final : public v1::WorkerRegistry::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    std::lock_guard lock(mu);
    registers.push_back(*request);
    response->set_worker_id(absl::StrCat(request->name(), "#", registers.size()));
    response->set_heartbeat_interval_ms(20);
    response->set_expiry_ms(expiry_ms);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    std::lock_guard lock(mu);
    heartbeats.push_back(*request);
    if (not_found.exchange(false)) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown id");
    response->set_reregister(reregister.exchange(false));
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse*) override {
    std::lock_guard lock(mu);
    deregistered.push_back(request->worker_id());
    return grpc::Status::OK;
  }

  size_t register_count() {
    std::lock_guard lock(mu);
    return registers.size();
  }

  std::mutex mu;
  std::vector<v1::RegisterWorkerRequest> registers;
  std::vector<v1::HeartbeatRequest> heartbeats;
  std::vector<std::string> deregistered;
  std::atomic<bool> reregister{false};
  std::atomic<bool> not_found{false};
  int64_t expiry_ms = 60000;
};

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

std::unique_ptr<GrpcServer> serve(FakeRegistry* fake, const std::string& address = "127.0.0.1:0") {
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::start({address}, {fake});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// Random, non-zero load values so a report of zeros or of stale fields cannot pass.
struct RandomLoad {
  RandomLoad() {
    std::mt19937 rng(1234);
    version = std::uniform_int_distribution<int64_t>(3, 1000)(rng);
    depth = std::uniform_int_distribution<int32_t>(1, 64)(rng);
  }
  int64_t version;
  int32_t depth;
};

WorkerRegistrationOptions options_for(int port, const RandomLoad& load) {
  WorkerRegistrationOptions o;
  o.coordinator = absl::StrCat("127.0.0.1:", port);
  o.kind = v1::WORKER_KIND_WEIGHT_SYNC;
  o.name = "ws";
  o.address = "127.0.0.1:51052";
  o.metrics_address = "127.0.0.1:10402";
  o.retry_backoff = 10ms;
  o.max_backoff = 40ms;
  o.rpc_timeout = 1000ms;
  o.load = [&load] { return WorkerLoad{load.version, load.depth}; };
  return o;
}

TEST(WorkerRegistrationTest, RegistersHeartbeatsReregistersAndDeregisters) {
  FakeRegistry fake;
  std::unique_ptr<GrpcServer> server = serve(&fake);
  ASSERT_NE(server, nullptr);
  const RandomLoad load;
  WorkerRegistration registration(options_for(server->port(), load));
  ASSERT_TRUE(registration.start().ok());
  ASSERT_TRUE(registration.wait_registered(5s));
  EXPECT_EQ(registration.worker_id(), "ws#1");
  {
    std::lock_guard lock(fake.mu);
    ASSERT_EQ(fake.registers.size(), 1u);
    const v1::RegisterWorkerRequest& r = fake.registers[0];
    EXPECT_EQ(r.kind(), v1::WORKER_KIND_WEIGHT_SYNC);
    EXPECT_EQ(r.name(), "ws");
    EXPECT_EQ(r.address(), "127.0.0.1:51052");
    EXPECT_EQ(r.metrics_address(), "127.0.0.1:10402");
    EXPECT_EQ(r.weight_version(), load.version);
  }
  // Heartbeats at the announced 20 ms carry the id and the load.
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(fake.mu);
    return fake.heartbeats.size() >= 3;
  }));
  {
    std::lock_guard lock(fake.mu);
    EXPECT_EQ(fake.heartbeats.back().worker_id(), "ws#1");
    EXPECT_EQ(fake.heartbeats.back().weight_version(), load.version);
    EXPECT_EQ(fake.heartbeats.back().queue_depth(), load.depth);
  }
  // The coordinator asks to register again: a second registration, new id.
  fake.reregister = true;
  ASSERT_TRUE(eventually([&] { return registration.worker_id() == "ws#2"; }));
  // NOT_FOUND for a heartbeat means the same.
  fake.not_found = true;
  ASSERT_TRUE(eventually([&] { return registration.worker_id() == "ws#3"; }));
  EXPECT_EQ(registration.stats().registrations, 3);
  EXPECT_GE(registration.stats().heartbeats, 3);
  {
    // Every registration of this process carries one instance: 16 hex digits, not another
    // registration's (a second WorkerRegistration stands for a restarted process).
    std::lock_guard lock(fake.mu);
    const std::string instance = fake.registers[0].instance();
    EXPECT_EQ(instance.size(), 16u) << instance;
    EXPECT_EQ(instance.find_first_not_of("0123456789abcdef"), std::string::npos) << instance;
    for (const v1::RegisterWorkerRequest& r : fake.registers) EXPECT_EQ(r.instance(), instance);
    EXPECT_EQ(registration.options().instance, instance);
    WorkerRegistration restarted(options_for(server->port(), load));
    EXPECT_NE(restarted.options().instance, instance);
  }

  registration.stop();
  EXPECT_TRUE(registration.stats().deregistered);
  EXPECT_EQ(registration.worker_id(), "");
  std::lock_guard lock(fake.mu);
  EXPECT_EQ(fake.deregistered, std::vector<std::string>{"ws#3"});
  EXPECT_EQ(fake.registers.size(), 3u);
}

TEST(WorkerRegistrationTest, WaitsForALateCoordinatorAndSurvivesItsRestart) {
  // Reserve a port, then free it: the registration starts with nobody listening there.
  FakeRegistry first;
  std::unique_ptr<GrpcServer> probe = serve(&first);
  ASSERT_NE(probe, nullptr);
  const int port = probe->port();
  probe->shutdown(0ms);
  probe.reset();

  const RandomLoad load;
  WorkerRegistrationOptions o = options_for(port, load);
  WorkerRegistration registration(o);
  ASSERT_TRUE(registration.start().ok());
  EXPECT_FALSE(registration.wait_registered(150ms));
  EXPECT_GE(registration.stats().failed_calls, 1);

  // The coordinator comes up (short expiry): the worker registers.
  FakeRegistry coordinator;
  coordinator.expiry_ms = 200;
  std::unique_ptr<GrpcServer> server = serve(&coordinator, absl::StrCat("127.0.0.1:", port));
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(registration.wait_registered(5s));
  ASSERT_TRUE(eventually([&] { return coordinator.register_count() == 1; }));

  // It goes away past the expiry and a fresh one (empty registry) starts on the same port: the
  // worker registers with it without being asked.
  server->shutdown(0ms);
  server.reset();
  std::this_thread::sleep_for(400ms);
  FakeRegistry restarted;
  server = serve(&restarted, absl::StrCat("127.0.0.1:", port));
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(eventually([&] { return restarted.register_count() >= 1; }));
  {
    std::lock_guard lock(restarted.mu);
    EXPECT_EQ(restarted.registers[0].name(), "ws");
    EXPECT_EQ(restarted.registers[0].weight_version(), load.version);
  }
  ASSERT_TRUE(eventually([&] { return registration.worker_id() == "ws#1"; }));
  registration.stop();
  std::lock_guard lock(restarted.mu);
  EXPECT_EQ(restarted.deregistered, std::vector<std::string>{"ws#1"});
}

// A coordinator that hangs in RegisterWorker until released (or 5 s pass).
class HangingRegistry final : public v1::WorkerRegistry::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override {
    std::unique_lock lock(mu);
    ++calls;
    cv.notify_all();
    cv.wait_for(lock, 5s, [this] { return released; });
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "hung");
  }
  void release() {
    std::lock_guard lock(mu);
    released = true;
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  bool released = false;
};

TEST(WorkerRegistrationTest, StopIsBoundedWhenTheCoordinatorHangsOrIsGone) {
  HangingRegistry hanging;
  std::unique_ptr<GrpcServer> server = GrpcServer::start({"127.0.0.1:0"}, {&hanging}).value();
  const RandomLoad load;
  WorkerRegistrationOptions o = options_for(server->port(), load);
  o.rpc_timeout = 4000ms;
  WorkerRegistration registration(o);
  ASSERT_TRUE(registration.start().ok());
  {
    std::unique_lock lock(hanging.mu);
    ASSERT_TRUE(hanging.cv.wait_for(lock, 5s, [&] { return hanging.calls > 0; }));
  }
  // The call in flight would hold for its 4 s deadline; stop() cancels it instead.
  auto start = std::chrono::steady_clock::now();
  registration.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_EQ(registration.worker_id(), "");
  EXPECT_FALSE(registration.stats().deregistered);
  registration.stop();  // idempotent
  hanging.release();
  server->shutdown(0ms);

  // Nobody at the address at all.
  o.coordinator = absl::StrCat("127.0.0.1:", server->port());
  o.rpc_timeout = 300ms;
  WorkerRegistration gone(o);
  ASSERT_TRUE(gone.start().ok());
  EXPECT_FALSE(gone.wait_registered(100ms));
  start = std::chrono::steady_clock::now();
  gone.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(WorkerRegistrationTest, RejectsBadOptionsNamingTheField) {
  const RandomLoad load;
  const WorkerRegistrationOptions good = options_for(50051, load);
  struct Case {
    std::function<void(WorkerRegistrationOptions&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](WorkerRegistrationOptions& o) { o.coordinator.clear(); }, "coordinator:"},
      {[](WorkerRegistrationOptions& o) { o.address.clear(); }, "address:"},
      {[](WorkerRegistrationOptions& o) { o.kind = v1::WORKER_KIND_UNSPECIFIED; }, "kind:"},
      {[](WorkerRegistrationOptions& o) { o.rpc_timeout = 0ms; }, "rpc_timeout:"},
      {[](WorkerRegistrationOptions& o) { o.heartbeat_interval = -5ms; }, "heartbeat_interval:"},
      {[](WorkerRegistrationOptions& o) { o.max_backoff = 5ms; }, "max_backoff:"},
  };
  for (const Case& c : cases) {
    WorkerRegistrationOptions o = good;
    c.edit(o);
    WorkerRegistration registration(o);
    const absl::Status s = registration.start();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.message().substr(0, c.field.size()), c.field) << s;
  }
  WorkerRegistration twice(good);
  ASSERT_TRUE(twice.start().ok());
  EXPECT_EQ(twice.start().code(), absl::StatusCode::kFailedPrecondition);
  twice.stop(/*deregister=*/false);
}

}  // namespace
}  // namespace fp8rl::service
