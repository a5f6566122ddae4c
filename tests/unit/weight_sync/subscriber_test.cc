// The generation-worker side of weight sync: WeightSubscriber verifies every pushed version before
// handing it over, acknowledges rejections with the reason, and reconnects with backoff when the
// stream breaks (including mid-version and across a service restart).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "services/weight_sync/client.h"
#include "services/weight_sync/payload.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;
using testing::expect_same_set;
using testing::random_bf16_set;
using testing::random_fp8_set;
using testing::stream_messages;
using testing::wait_until;

// A scripted weight-sync service: the n-th Subscribe call (0-based) writes script[n] and then
// ends with `end_status[n]` (or waits until cancelled when it has none); acks are recorded.
class ScriptedService final : public v1::WeightSyncService::Service {
 public:
  std::vector<std::vector<v1::SubscribeResponse>> script;
  std::vector<std::optional<grpc::Status>> end_status;

  grpc::Status Subscribe(grpc::ServerContext* context, const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::SubscribeResponse>* writer) override {
    const size_t call = calls_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_versions_.push_back(request->held_version());
    }
    if (call < script.size()) {
      for (const auto& m : script[call]) {
        if (!writer->Write(m)) return grpc::Status::CANCELLED;
      }
      if (call < end_status.size() && end_status[call]) return *end_status[call];
    }
    while (!context->IsCancelled()) std::this_thread::sleep_for(10ms);
    return grpc::Status::CANCELLED;
  }
  grpc::Status Ack(grpc::ServerContext*, const v1::AckRequest* request, v1::AckResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    acks_.push_back(*request);
    return grpc::Status::OK;
  }
  std::vector<v1::AckRequest> acks() {
    std::lock_guard<std::mutex> lock(mu_);
    return acks_;
  }
  std::vector<int64_t> held_versions() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_versions_;
  }
  size_t calls() const { return calls_.load(); }

 private:
  std::atomic<size_t> calls_{0};
  std::mutex mu_;
  std::vector<v1::AckRequest> acks_;
  std::vector<int64_t> held_versions_;
};

struct ScriptedServer {
  explicit ScriptedServer(ScriptedService* service) {
    server = service::GrpcServer::start({.address = "127.0.0.1:0"}, {service}).value();
    channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                  grpc::InsecureChannelCredentials());
  }
  std::unique_ptr<service::GrpcServer> server;
  std::shared_ptr<grpc::Channel> channel;
};

SubscriberOptions fast_subscriber(const std::string& worker) {
  SubscriberOptions o;
  o.worker_id = worker;
  o.initial_backoff = 20ms;
  o.max_backoff = 100ms;
  return o;
}

TEST(WeightSubscriber, RejectsACorruptVersionAndLoadsTheNextGoodOne) {
  const model::WeightSet v1 = random_fp8_set(1, 51);
  const model::WeightSet v2 = random_fp8_set(2, 52);
  ScriptedService service;
  std::vector<v1::SubscribeResponse> stream =
      stream_messages<v1::SubscribeResponse>(v1, v1::WEIGHT_FORMAT_FP8);
  (*stream[4].mutable_chunk()->mutable_data())[777] ^= 0x40;  // corrupt version 1 in flight
  for (auto& m : stream_messages<v1::SubscribeResponse>(v2, v1::WEIGHT_FORMAT_FP8))
    stream.push_back(std::move(m));
  service.script = {stream};
  ScriptedServer server(&service);

  std::mutex mu;
  std::vector<model::WeightSet> loaded;
  WeightSubscriber sub(server.channel, fast_subscriber("gen-7"), [&](model::WeightSet set) {
    std::lock_guard<std::mutex> lock(mu);
    loaded.push_back(std::move(set));
    return absl::OkStatus();
  });
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(sub.wait_for_version(2, 10s));
  ASSERT_TRUE(wait_until([&] { return service.acks().size() == 2; }));
  sub.stop();

  ASSERT_EQ(loaded.size(), 1u);  // the corrupt version never reached the handler
  expect_same_set(v2, loaded[0]);
  const auto acks = service.acks();
  EXPECT_EQ(acks[0].worker_id(), "gen-7");
  EXPECT_EQ(acks[0].version(), 1);
  EXPECT_FALSE(acks[0].ok());
  EXPECT_NE(acks[0].error().find("crc32c mismatch"), std::string::npos) << acks[0].error();
  EXPECT_EQ(acks[1].version(), 2);
  EXPECT_TRUE(acks[1].ok());
  const WeightSubscriber::Stats stats = sub.stats();
  EXPECT_EQ(stats.versions_loaded, 1);
  EXPECT_EQ(stats.versions_rejected, 1);
  EXPECT_EQ(sub.held_version(), 2);
}

// The in-place receive, over its zero-copy chunk path (chunks copied from gRPC's buffers straight
// into the target) and over the message path: a corrupted chunk and a chunk leaving a gap each
// reject their version (acked with the reason), and the next good version lands bit for bit.
TEST(WeightSubscriber, InPlaceReceiveRejectsCorruptAndGappedChunksOnBothPaths) {
  for (bool zero_copy : {true, false}) {
    SCOPED_TRACE(zero_copy ? "zero-copy receive" : "message path");
    const model::WeightSet a = random_fp8_set(1, 61);
    const model::WeightSet b = random_fp8_set(2, 62);
    const model::WeightSet c = random_fp8_set(3, 63);
    ScriptedService service;
    std::vector<v1::SubscribeResponse> stream =
        stream_messages<v1::SubscribeResponse>(a, v1::WEIGHT_FORMAT_FP8);
    ASSERT_GT(stream.size(), 4u);
    (*stream[4].mutable_chunk()->mutable_data())[777] ^= 0x40;
    std::vector<v1::SubscribeResponse> gapped =
        stream_messages<v1::SubscribeResponse>(b, v1::WEIGHT_FORMAT_FP8);
    ASSERT_GT(gapped.size(), 3u);
    gapped[3].mutable_chunk()->set_offset(gapped[3].chunk().offset() + 1);
    for (auto& m : gapped) stream.push_back(std::move(m));
    for (auto& m : stream_messages<v1::SubscribeResponse>(c, v1::WEIGHT_FORMAT_FP8)) {
      stream.push_back(std::move(m));
    }
    service.script = {stream};
    ScriptedServer server(&service);

    std::mutex mu;
    std::vector<char> buffers[2];
    int next = 0;
    std::vector<std::pair<int64_t, std::string>> installed;
    InPlaceReceiver receiver;
    receiver.target = [&](const v1::VersionManifest& m) -> absl::StatusOr<std::span<char>> {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<char>& buffer = buffers[next];
      next = 1 - next;
      buffer.assign(m.total_bytes(), 0);
      return std::span<char>(buffer);
    };
    receiver.install = [&](const v1::VersionManifest& m, std::span<const char> payload) {
      std::lock_guard<std::mutex> lock(mu);
      installed.emplace_back(m.version(), std::string(payload.begin(), payload.end()));
      return absl::OkStatus();
    };
    WeightSubscriber sub(server.channel, fast_subscriber("gen-z"), receiver);
    sub.set_zero_copy_receive(zero_copy);
    ASSERT_TRUE(sub.start().ok());
    ASSERT_TRUE(sub.wait_for_version(3, 10s));
    ASSERT_TRUE(wait_until([&] { return service.acks().size() == 3; }));
    sub.stop();

    ASSERT_EQ(installed.size(), 1u);
    EXPECT_EQ(installed[0].first, 3);
    std::string want;
    for (const auto& t : c.tensors) want.append(t.bytes.begin(), t.bytes.end());
    EXPECT_TRUE(installed[0].second == want);
    const auto acks = service.acks();
    EXPECT_EQ(acks[0].version(), 1);
    EXPECT_FALSE(acks[0].ok());
    EXPECT_NE(acks[0].error().find("crc32c mismatch"), std::string::npos) << acks[0].error();
    EXPECT_EQ(acks[1].version(), 2);
    EXPECT_FALSE(acks[1].ok());
    EXPECT_NE(acks[1].error().find("chunk.offset: gap"), std::string::npos) << acks[1].error();
    EXPECT_EQ(acks[2].version(), 3);
    EXPECT_TRUE(acks[2].ok());
  }
}

TEST(WeightSubscriber, HandlerFailureIsAcknowledgedAsARejection) {
  ScriptedService service;
  service.script = {
      stream_messages<v1::SubscribeResponse>(random_bf16_set(3, 61), v1::WEIGHT_FORMAT_BF16)};
  ScriptedServer server(&service);
  WeightSubscriber sub(server.channel, fast_subscriber("gen-1"), [](model::WeightSet set) {
    return absl::FailedPreconditionError("model load failed: vocab mismatch");
  });
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(wait_until([&] { return service.acks().size() == 1; }));
  sub.stop();
  const auto acks = service.acks();
  EXPECT_EQ(acks[0].version(), 3);
  EXPECT_FALSE(acks[0].ok());
  EXPECT_EQ(acks[0].error(), "model load failed: vocab mismatch");
  EXPECT_EQ(sub.held_version(), 0);
  EXPECT_EQ(sub.stats().versions_rejected, 1);
}

TEST(WeightSubscriber, ReconnectsAfterAStreamBreaksMidVersion) {
  const model::WeightSet v4 = random_fp8_set(4, 71);
  const std::vector<v1::SubscribeResponse> full =
      stream_messages<v1::SubscribeResponse>(v4, v1::WEIGHT_FORMAT_FP8);
  ScriptedService service;
  // First stream: manifest and two chunks, then the service goes away; the second is whole.
  service.script = {{full[0], full[1], full[2]}, full};
  service.end_status = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting"), std::nullopt};
  ScriptedServer server(&service);
  std::atomic<int> handled{0};
  WeightSubscriber sub(server.channel, fast_subscriber("gen-2"), [&](model::WeightSet set) {
    ++handled;
    return set.tensors.size() == v4.tensors.size() ? absl::OkStatus()
                                                   : absl::InternalError("wrong tensor count");
  });
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(sub.wait_for_version(4, 10s));
  sub.stop();
  EXPECT_EQ(handled.load(), 1);  // the partial version was dropped, not handed over
  EXPECT_EQ(service.calls(), 2u);
  EXPECT_EQ(service.held_versions(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(sub.stats().streams_opened, 2);
  EXPECT_EQ(sub.stats().versions_rejected, 0);
}

TEST(WeightSubscriber, FollowsTheServiceAcrossARestartOnTheSamePort) {
  auto first = std::make_unique<testing::TestServer>();
  const int port = first->port();
  ASSERT_TRUE(upload(first->stub(), random_bf16_set(1, 81), v1::WEIGHT_FORMAT_BF16).ok());
  std::atomic<int64_t> last{0};
  // A plain channel with gRPC's default limits (4 MiB per received message).
  auto channel = grpc::CreateChannel(first->address(), grpc::InsecureChannelCredentials());
  WeightSubscriber sub(channel, fast_subscriber("gen-3"), [&](model::WeightSet set) {
    last = set.version;
    return absl::OkStatus();
  });
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(sub.wait_for_version(1, 10s));
  first.reset();  // the service stops: the stream ends with UNAVAILABLE

  testing::TestServer second(testing::fast_options(), port);
  ASSERT_EQ(second.port(), port);
  // A >4 MiB FP8 version through a default channel: pushed chunks fit gRPC's default limit.
  ASSERT_TRUE(upload(second.stub(), random_fp8_set(2, 82), v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(sub.wait_for_version(2, 10s));
  EXPECT_EQ(last.load(), 2);
  EXPECT_GE(sub.stats().streams_opened, 2);
  // The new service learned the worker's version from its ack.
  ASSERT_TRUE(wait_until([&] {
    const auto st = second.status();
    return st.workers_size() == 1 && st.workers(0).version() == 2 && st.workers(0).subscribed();
  }));
  const auto t0 = std::chrono::steady_clock::now();
  sub.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST(WeightSubscriber, StartChecksItsOptions) {
  auto channel = grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  auto ok = [](model::WeightSet) { return absl::OkStatus(); };
  SubscriberOptions no_id = fast_subscriber("");
  absl::Status s = WeightSubscriber(channel, no_id, ok).start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker_id"), std::string::npos);
  SubscriberOptions bad_backoff = fast_subscriber("w");
  bad_backoff.max_backoff = 1ms;
  s = WeightSubscriber(channel, bad_backoff, ok).start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("backoff"), std::string::npos);
  WeightSubscriber twice(channel, fast_subscriber("w"), ok);
  ASSERT_TRUE(twice.start().ok());
  EXPECT_EQ(twice.start().code(), absl::StatusCode::kFailedPrecondition);
  twice.stop();  // bounded even though nothing listens on the address
}

TEST(Upload, RejectsBadOptionsBeforeSending) {
  auto channel = grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  UploadOptions big;
  big.chunk_bytes = kMaxChunkBytes + 1;
  auto r = upload(channel, random_bf16_set(1, 1), v1::WEIGHT_FORMAT_BF16, big);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("chunk_bytes"), std::string::npos);
  model::WeightSet bad = random_bf16_set(1, 1);
  bad.tensors[0].bytes.pop_back();
  r = upload(channel, bad, v1::WEIGHT_FORMAT_BF16);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  model::WeightSet unversioned = random_bf16_set(0, 1);
  r = upload(channel, unversioned, v1::WEIGHT_FORMAT_BF16);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("manifest.version"), std::string::npos);
}

}  // namespace
}  // namespace fp8rl::weight_sync
