// An in-process weight-sync service on a free loopback port for tests: the real service, metrics
// registry and gRPC server (health + reflection), plus a channel and stub to talk to it.
#pragma once

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/metrics.h"
#include "services/weight_sync/weight_sync_metrics.h"
#include "services/weight_sync/weight_sync_service.h"

namespace fp8rl::weight_sync::testing {

// gRPC is initialized once for the whole test binary and never shut down: when the last gRPC
// object of a test goes away, grpc_shutdown() can otherwise wait up to 10 s for gRPC's executor
// thread (its poll timeout), which made individual tests take 10 s at random.
inline const bool kGrpcInitialized = (grpc_init(), true);

// Polls `done` every 5 ms for up to 5 s; false when it never became true.
template <typename Pred>
bool wait_until(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline WeightSyncOptions fast_options(int keep = 2) {
  WeightSyncOptions o;
  o.keep_versions = keep;
  o.poll_interval = std::chrono::milliseconds(20);
  // A delta whenever one is possible, so tests can count them; the measured choice is tested
  // on its own (DeltaPush.MeasuredChoice...).
  o.delta_choice = WeightSyncOptions::DeltaChoice::kAlways;
  return o;
}

class TestServer {
 public:
  // port 0 picks a free port.
  explicit TestServer(WeightSyncOptions options = fast_options(), int port = 0) {
    metrics_ = WeightSyncMetrics::create(&registry_).value();
    service_ = std::make_unique<WeightSyncServiceImpl>(options, metrics_.get());
    service::GrpcServerOptions grpc_options;
    grpc_options.address = absl::StrCat("127.0.0.1:", port);
    auto server = service::GrpcServer::start(grpc_options, {service_.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args);
    stub_ = v1::WeightSyncService::NewStub(channel_);
  }
  ~TestServer() { stop(); }

  // The service's shutdown sequence: end Subscribe streams, then drain the gRPC server.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(2)) {
    if (server_ == nullptr) return;
    service_->begin_shutdown();
    server_->shutdown(grace);
    server_.reset();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port()); }
  int port() const { return server_ ? server_->port() : 0; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  v1::WeightSyncService::Stub* stub() { return stub_.get(); }
  WeightSyncServiceImpl& service() { return *service_; }
  service::MetricsRegistry& registry() { return registry_; }
  WeightSyncMetrics& metrics() { return *metrics_; }

  v1::WeightSyncStatus status() {
    grpc::ClientContext context;
    v1::WeightSyncStatus out;
    const grpc::Status s = stub_->GetStatus(&context, v1::GetWeightSyncStatusRequest(), &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

 private:
  service::MetricsRegistry registry_;
  std::unique_ptr<WeightSyncMetrics> metrics_;
  std::unique_ptr<WeightSyncServiceImpl> service_;
  std::unique_ptr<service::GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WeightSyncService::Stub> stub_;
};

}  // namespace fp8rl::weight_sync::testing
