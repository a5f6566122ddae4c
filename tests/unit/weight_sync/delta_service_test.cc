// Delta versions end to end over gRPC: the service pushes a version as a delta against the one a
// worker acknowledged and the worker rebuilds it bit-exact; a worker without that base, a
// corrupted delta and a weight-sync restart between versions all end with the full version.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "services/weight_sync/client.h"
#include "services/weight_sync/delta.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"
#include "tests/unit/weight_sync/trained_versions.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;
using testing::expect_same_set;
using testing::payload_of;
using testing::stream_messages;
using testing::trained_versions;
using testing::wait_until;

SubscriberOptions fast_subscriber(const std::string& worker) {
  SubscriberOptions o;
  o.worker_id = worker;
  o.initial_backoff = 20ms;
  o.max_backoff = 100ms;
  return o;
}

// A subscriber that keeps every set it was handed.
struct Worker {
  Worker(std::shared_ptr<grpc::ChannelInterface> channel, SubscriberOptions options)
      : sub(std::move(channel), std::move(options), [this](model::WeightSet set) {
          std::lock_guard<std::mutex> lock(mu);
          loaded.push_back(std::move(set));
          return absl::OkStatus();
        }) {}
  std::vector<model::WeightSet> sets() {
    std::lock_guard<std::mutex> lock(mu);
    return loaded;
  }
  std::mutex mu;
  std::vector<model::WeightSet> loaded;
  WeightSubscriber sub;
};

// Waits until the service recorded `worker`'s ack of `version`.
bool acked(testing::TestServer& server, const std::string& worker, int64_t version) {
  return wait_until([&] {
    const v1::WeightSyncStatus status = server.status();
    for (const v1::WorkerVersion& w : status.workers()) {
      if (w.worker_id() == worker && w.version() == version) return true;
    }
    return false;
  });
}

double counter(testing::TestServer& server, service::CounterFamily* family, const char* kind) {
  return family->with({kind}).value();
}

const std::vector<model::WeightSet>& fp8_versions() {
  static const std::vector<model::WeightSet> sets = trained_versions(3, Precision::kFP8, 1e-3);
  return sets;
}

TEST(DeltaPush, NextVersionGoesAsADeltaAndRebuildsBitExact) {
  const auto& sets = fp8_versions();
  ASSERT_EQ(sets.size(), 3u);
  testing::TestServer server;
  ASSERT_TRUE(upload(server.stub(), sets[0], v1::WEIGHT_FORMAT_FP8).ok());
  Worker w(server.channel(), fast_subscriber("gen-0"));
  ASSERT_TRUE(w.sub.start().ok());
  ASSERT_TRUE(w.sub.wait_for_version(1, 10s));
  ASSERT_TRUE(acked(server, "gen-0", 1));
  for (int v = 2; v <= 3; ++v) {
    ASSERT_TRUE(upload(server.stub(), sets[v - 1], v1::WEIGHT_FORMAT_FP8).ok());
    ASSERT_TRUE(w.sub.wait_for_version(v, 10s));
    ASSERT_TRUE(acked(server, "gen-0", v));
  }
  w.sub.stop();
  const std::vector<model::WeightSet> loaded = w.sets();
  ASSERT_EQ(loaded.size(), 3u);
  for (int i = 0; i < 3; ++i) expect_same_set(sets[i], loaded[i]);
  const WeightSubscriber::Stats stats = w.sub.stats();
  EXPECT_EQ(stats.versions_from_delta, 2);
  EXPECT_EQ(stats.delta_fallbacks, 0);
  EXPECT_GT(stats.delta_decode_seconds, 0.0);

  WeightSyncMetrics& m = server.metrics();
  EXPECT_EQ(counter(server, m.pushes, "full"), 1);
  EXPECT_EQ(counter(server, m.pushes, "delta"), 2);
  EXPECT_EQ(counter(server, m.pushed_bytes, "delta"),
            static_cast<double>(stats.delta_bytes_received));
  const double full = m.version_wire_bytes->with({"full"}).value();
  const double delta = m.version_wire_bytes->with({"delta"}).value();
  EXPECT_EQ(full, static_cast<double>(payload_of(sets[2]).size()));
  EXPECT_GT(delta, 0);
  EXPECT_LT(delta, full);
  EXPECT_DOUBLE_EQ(m.delta_compression_ratio->get().value(), full / delta);
}

// The in-place receive path (a generation worker's double buffer): the delta is rebuilt straight
// into the buffer `target` hands out, from the bytes `base` returns, and installed from there.
TEST(DeltaPush, InPlaceReceiverRebuildsDeltasIntoTheIdleBuffer) {
  const auto& sets = fp8_versions();
  testing::TestServer server;
  std::mutex mu;
  std::vector<char> buffers[2];
  int base_index = -1, receiving = 0;
  int64_t base_version = 0;
  std::vector<std::string> installed;
  InPlaceReceiver rx;
  rx.target = [&](const v1::VersionManifest& m) -> absl::StatusOr<std::span<char>> {
    std::lock_guard lock(mu);
    receiving = base_index < 0 ? 0 : 1 - base_index;  // never the base's buffer
    buffers[receiving].assign(m.total_bytes(), 0);
    return std::span<char>(buffers[receiving]);
  };
  rx.install = [&](const v1::VersionManifest& m, std::span<const char> payload) {
    std::lock_guard lock(mu);
    EXPECT_EQ(payload.data(), buffers[receiving].data());
    installed.emplace_back(payload.begin(), payload.end());
    base_index = receiving;
    base_version = m.version();
    return absl::OkStatus();
  };
  rx.base = [&](int64_t version) -> std::span<const char> {
    std::lock_guard lock(mu);
    if (base_index < 0 || version != base_version) return {};
    return std::span<const char>(buffers[base_index]);
  };
  WeightSubscriber sub(server.channel(), fast_subscriber("gen-in-place"), rx);
  ASSERT_TRUE(sub.start().ok());
  for (int v = 1; v <= 3; ++v) {
    ASSERT_TRUE(upload(server.stub(), sets[v - 1], v1::WEIGHT_FORMAT_FP8).ok());
    ASSERT_TRUE(sub.wait_for_version(v, 10s));
    ASSERT_TRUE(acked(server, "gen-in-place", v));
  }
  sub.stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(installed.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const std::string want = payload_of(sets[i]);
    EXPECT_TRUE(installed[i] == want) << "version " << i + 1 << " differs";
  }
  EXPECT_EQ(sub.stats().versions_from_delta, 2);
  EXPECT_EQ(sub.stats().delta_fallbacks, 0);
}

// A worker that holds version 1 without its bytes (started with held_version 1) and one that
// takes no deltas both get version 2 in full while a third gets the delta.
TEST(DeltaPush, AWorkerWithoutTheBaseGetsTheFullVersion) {
  const auto& sets = fp8_versions();
  ASSERT_EQ(sets.size(), 3u);
  testing::TestServer server;
  ASSERT_TRUE(upload(server.stub(), sets[0], v1::WEIGHT_FORMAT_FP8).ok());
  Worker with_base(server.channel(), fast_subscriber("gen-a"));
  SubscriberOptions no_bytes = fast_subscriber("gen-b");
  no_bytes.held_version = 1;
  Worker without_base(server.channel(), no_bytes);
  SubscriberOptions full_only = fast_subscriber("gen-c");
  full_only.accept_delta = false;
  Worker no_deltas(server.channel(), full_only);
  for (Worker* w : {&with_base, &without_base, &no_deltas}) ASSERT_TRUE(w->sub.start().ok());
  ASSERT_TRUE(with_base.sub.wait_for_version(1, 10s));
  ASSERT_TRUE(no_deltas.sub.wait_for_version(1, 10s));
  ASSERT_TRUE(acked(server, "gen-a", 1));
  ASSERT_TRUE(wait_until([&] { return server.status().workers_size() == 3; }));

  ASSERT_TRUE(upload(server.stub(), sets[1], v1::WEIGHT_FORMAT_FP8).ok());
  for (Worker* w : {&with_base, &without_base, &no_deltas}) {
    ASSERT_TRUE(w->sub.wait_for_version(2, 10s));
    w->sub.stop();
    ASSERT_FALSE(w->sets().empty());
    expect_same_set(sets[1], w->sets().back());
  }
  EXPECT_EQ(with_base.sub.stats().versions_from_delta, 1);
  EXPECT_EQ(without_base.sub.stats().versions_from_delta, 0);
  EXPECT_EQ(without_base.sub.stats().versions_loaded, 1);  // only version 2, in full
  EXPECT_EQ(no_deltas.sub.stats().versions_from_delta, 0);
  EXPECT_EQ(counter(server, server.metrics().pushes, "delta"), 1);
  EXPECT_EQ(counter(server, server.metrics().pushes, "full"), 4);  // 2 x v1, 2 x v2
}

// After a restart the service has no versions: the worker's base (version 1) is unknown there,
// so version 2 comes in full; version 3 is a delta against 2 again.
TEST(DeltaPush, WeightSyncRestartBetweenVersionsSendsTheFullVersion) {
  const auto& sets = fp8_versions();
  ASSERT_EQ(sets.size(), 3u);
  auto first = std::make_unique<testing::TestServer>();
  const int port = first->port();
  ASSERT_TRUE(upload(first->stub(), sets[0], v1::WEIGHT_FORMAT_FP8).ok());
  Worker w(grpc::CreateChannel(first->address(), grpc::InsecureChannelCredentials()),
           fast_subscriber("gen-r"));
  ASSERT_TRUE(w.sub.start().ok());
  ASSERT_TRUE(w.sub.wait_for_version(1, 10s));
  first.reset();

  testing::TestServer second(testing::fast_options(), port);
  ASSERT_EQ(second.port(), port);
  ASSERT_TRUE(upload(second.stub(), sets[1], v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(w.sub.wait_for_version(2, 10s));
  ASSERT_TRUE(acked(second, "gen-r", 2));
  EXPECT_EQ(w.sub.stats().versions_from_delta, 0);
  ASSERT_TRUE(upload(second.stub(), sets[2], v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(w.sub.wait_for_version(3, 10s));
  w.sub.stop();
  EXPECT_EQ(w.sub.stats().versions_from_delta, 1);
  EXPECT_EQ(w.sub.stats().delta_fallbacks, 0);
  ASSERT_EQ(w.sets().size(), 3u);
  for (int i = 0; i < 3; ++i) expect_same_set(sets[i], w.sets()[i]);
}

// A scripted service: the n-th Subscribe call writes script[n] and then waits until cancelled;
// requests are recorded.
class ScriptedService final : public v1::WeightSyncService::Service {
 public:
  std::vector<std::vector<v1::SubscribeResponse>> script;

  grpc::Status Subscribe(grpc::ServerContext* context, const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::SubscribeResponse>* writer) override {
    size_t call = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      call = requests_.size();
      requests_.push_back(*request);
    }
    if (call < script.size()) {
      for (const auto& m : script[call]) {
        if (!writer->Write(m)) return grpc::Status::CANCELLED;
      }
    }
    while (!context->IsCancelled()) std::this_thread::sleep_for(10ms);
    return grpc::Status::CANCELLED;
  }
  grpc::Status Ack(grpc::ServerContext*, const v1::AckRequest* request, v1::AckResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    acks_.push_back(*request);
    return grpc::Status::OK;
  }
  std::vector<v1::SubscribeRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<v1::AckRequest> acks() {
    std::lock_guard<std::mutex> lock(mu_);
    return acks_;
  }

 private:
  std::mutex mu_;
  std::vector<v1::SubscribeRequest> requests_;
  std::vector<v1::AckRequest> acks_;
};

// The messages of a delta push.
std::vector<v1::SubscribeResponse> delta_messages(const EncodedDelta& d) {
  std::vector<v1::SubscribeResponse> out(1);
  *out[0].mutable_delta() = d.manifest;
  for (uint64_t offset = 0; offset < d.payload.size(); offset += 1 << 16) {
    v1::SubscribeResponse m;
    m.mutable_chunk()->set_version(d.manifest.target().version());
    m.mutable_chunk()->set_offset(offset);
    m.mutable_chunk()->set_data(d.payload.substr(offset, 1 << 16));
    out.push_back(std::move(m));
  }
  return out;
}

// The delta was made against a base that differs from the worker's version 1 in one FP8 code:
// the rebuilt tensor fails the full manifest's CRC-32C, so the worker reconnects without a base
// and loads the full version 2 instead; the bad reconstruction never reaches the handler.
TEST(DeltaPush, ACorruptedDeltaMakesTheWorkerFetchTheFullVersion) {
  const auto& sets = fp8_versions();
  ASSERT_EQ(sets.size(), 3u);
  const v1::VersionManifest m1 = build_manifest(sets[0], v1::WEIGHT_FORMAT_FP8).value();
  const v1::VersionManifest m2 = build_manifest(sets[1], v1::WEIGHT_FORMAT_FP8).value();
  std::string wrong_base = payload_of(sets[0]);
  int fp8 = 0;
  while (m1.tensors(fp8).dtype() != "F8_E4M3") ++fp8;
  wrong_base[m1.tensors(fp8).offset() + 3] ^= 0x02;
  const EncodedDelta bad = encode_delta(m1, wrong_base, m2, payload_of(sets[1])).value();
  ASSERT_EQ(bad.manifest.tensors(fp8).encoding(), v1::TENSOR_ENCODING_XOR_ZSTD);

  ScriptedService service;
  std::vector<v1::SubscribeResponse> first =
      stream_messages<v1::SubscribeResponse>(sets[0], v1::WEIGHT_FORMAT_FP8);
  for (auto& m : delta_messages(bad)) first.push_back(std::move(m));
  service.script = {first, stream_messages<v1::SubscribeResponse>(sets[1], v1::WEIGHT_FORMAT_FP8)};
  auto server = service::GrpcServer::start({.address = "127.0.0.1:0"}, {&service}).value();
  Worker w(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                               grpc::InsecureChannelCredentials()),
           fast_subscriber("gen-x"));
  ASSERT_TRUE(w.sub.start().ok());
  ASSERT_TRUE(w.sub.wait_for_version(2, 10s));
  w.sub.stop();

  ASSERT_EQ(w.sets().size(), 2u);
  expect_same_set(sets[0], w.sets()[0]);
  expect_same_set(sets[1], w.sets()[1]);
  const WeightSubscriber::Stats stats = w.sub.stats();
  EXPECT_EQ(stats.delta_fallbacks, 1);
  EXPECT_EQ(stats.versions_from_delta, 0);
  EXPECT_EQ(stats.versions_rejected, 0);
  EXPECT_NE(stats.last_error.find("crc32c mismatch"), std::string::npos) << stats.last_error;
  const std::vector<v1::SubscribeRequest> requests = service.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_TRUE(requests[0].accept_delta());
  EXPECT_EQ(requests[0].delta_base_version(), 0);  // nothing held yet
  EXPECT_EQ(requests[1].held_version(), 1);
  EXPECT_EQ(requests[1].delta_base_version(), 0);  // asks for the full version
  const std::vector<v1::AckRequest> acks = service.acks();
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_TRUE(acks[0].ok() && acks[1].ok());
  EXPECT_EQ(acks[1].version(), 2);
  server->shutdown(std::chrono::milliseconds(500));
}

// The default, measured choice: the first delta is a probe; when this worker's delta pushes take
// far longer (its handler sleeps 1 s after each rebuilt delta, as a slow decoder would) the next
// versions go in full, until a re-probe after PushChooser::kReprobeAfter fulls in a row.
TEST(DeltaPush, MeasuredChoiceSendsFullWhenDeltasReachTheWorkerLater) {
  const auto& sets = fp8_versions();
  WeightSyncOptions options = testing::fast_options();
  options.delta_choice = WeightSyncOptions::DeltaChoice::kMeasured;
  testing::TestServer server(options);
  std::atomic<int64_t> deltas_seen{0};
  WeightSubscriber* self = nullptr;
  WeightSubscriber sub(server.channel(), fast_subscriber("gen-slow"), [&](model::WeightSet) {
    const int64_t from_delta = self->stats().versions_from_delta;
    if (from_delta > deltas_seen.exchange(from_delta)) std::this_thread::sleep_for(1s);
    return absl::OkStatus();
  });
  self = &sub;
  ASSERT_TRUE(sub.start().ok());
  // Versions 1..12, contents cycling through three trained versions.
  const int kVersions = 4 + PushChooser::kReprobeAfter;
  for (int v = 1; v <= kVersions; ++v) {
    model::WeightSet set = sets[(v - 1) % 3];
    set.version = v;
    ASSERT_TRUE(upload(server.stub(), set, v1::WEIGHT_FORMAT_FP8).ok());
    ASSERT_TRUE(sub.wait_for_version(v, 20s)) << v;
    ASSERT_TRUE(acked(server, "gen-slow", v)) << v;
  }
  sub.stop();
  // The first two pushes of a stream are not timed. v1 full (no base yet), v2 and v3 deltas
  // (probes: no delta measured), v4 full (probe: no full measured), v5..v11 full (cheaper), v12
  // delta (re-probe after kReprobeAfter fulls in a row).
  WeightSyncMetrics& m = server.metrics();
  EXPECT_EQ(sub.stats().versions_from_delta, 3);
  EXPECT_EQ(sub.stats().delta_fallbacks, 0);
  EXPECT_EQ(counter(server, m.pushes, "delta"), 3);
  EXPECT_EQ(counter(server, m.pushes, "full"), kVersions - 3);
  EXPECT_EQ(counter(server, m.push_probes, "delta"), 3);
  EXPECT_EQ(counter(server, m.push_probes, "full"), 1);
  EXPECT_GT(m.push_cost_seconds->with({"delta"}).value(), 0.9);
  EXPECT_LT(m.push_cost_seconds->with({"full"}).value(),
            m.push_cost_seconds->with({"delta"}).value());
}

TEST(DeltaPush, OptionsAreChecked) {
  WeightSyncOptions o;
  ASSERT_TRUE(validate_options(o).ok());
  o.delta_max_fraction = 0;
  EXPECT_NE(std::string(validate_options(o).message()).find("delta_max_fraction"),
            std::string::npos);
  o.delta_max_fraction = 1.5;
  EXPECT_FALSE(validate_options(o).ok());
  o = WeightSyncOptions();
  o.delta_zstd_level = 0;
  EXPECT_NE(std::string(validate_options(o).message()).find("delta_zstd_level"), std::string::npos);
}

}  // namespace
}  // namespace fp8rl::weight_sync
