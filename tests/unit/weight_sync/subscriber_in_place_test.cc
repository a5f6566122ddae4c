// WeightSubscriber with an InPlaceReceiver: chunks land in the buffer the receiver hands out and
// install() reads them there, a receiver that cannot give a buffer rejects the version, and
// start() names a missing receiver function.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "services/weight_sync/client.h"
#include "services/weight_sync/payload.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;
using testing::random_fp8_set;
using testing::wait_until;

SubscriberOptions options(const std::string& worker) {
  SubscriberOptions o;
  o.worker_id = worker;
  o.initial_backoff = 20ms;
  o.max_backoff = 100ms;
  return o;
}

// Two buffers handed out alternately, as a worker's double buffer does.
struct Receiver {
  std::mutex mu;
  std::vector<char> buffers[2];
  int next = 0;
  size_t max_bytes = size_t{1} << 30;
  std::vector<std::pair<int64_t, std::string>> installed;  // version, bytes (copied for checks)
  std::vector<const char*> installed_from;

  InPlaceReceiver receiver() {
    InPlaceReceiver r;
    r.target = [this](const v1::VersionManifest& m) -> absl::StatusOr<std::span<char>> {
      std::lock_guard lock(mu);
      if (m.total_bytes() > max_bytes) return absl::ResourceExhaustedError("buffer too small");
      std::vector<char>& b = buffers[next];
      next = 1 - next;
      b.assign(m.total_bytes(), 0);
      return std::span<char>(b);
    };
    r.install = [this](const v1::VersionManifest& m, std::span<const char> payload) {
      std::lock_guard lock(mu);
      installed.emplace_back(m.version(), std::string(payload.begin(), payload.end()));
      installed_from.push_back(payload.data());
      return absl::OkStatus();
    };
    return r;
  }
};

std::string concat(const model::WeightSet& set) {
  std::string out;
  for (const auto& t : set.tensors) out.append(t.bytes.begin(), t.bytes.end());
  return out;
}

TEST(WeightSubscriberInPlace, InstallsEachVersionFromTheBufferItWasReceivedInto) {
  testing::TestServer server;
  const model::WeightSet v1 = random_fp8_set(1, 91), v2 = random_fp8_set(2, 92);
  Receiver rx;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  WeightSubscriber sub(channel, options("gen-in-place"), rx.receiver());
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(upload(server.stub(), v1, v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(sub.wait_for_version(1, 10s));
  ASSERT_TRUE(upload(server.stub(), v2, v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(sub.wait_for_version(2, 10s));
  sub.stop();
  std::lock_guard lock(rx.mu);
  ASSERT_EQ(rx.installed.size(), 2u);
  EXPECT_EQ(rx.installed[0].first, 1);
  EXPECT_EQ(rx.installed[0].second, concat(v1));
  EXPECT_EQ(rx.installed[1].second, concat(v2));
  // Each version was installed from the buffer it was received into (no copy in between).
  EXPECT_EQ(rx.installed_from[0], rx.buffers[0].data());
  EXPECT_EQ(rx.installed_from[1], rx.buffers[1].data());
  EXPECT_EQ(sub.stats().versions_loaded, 2);
}

TEST(WeightSubscriberInPlace, ABufferTooSmallIsARejection) {
  testing::TestServer server;
  Receiver rx;
  rx.max_bytes = 1000;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  WeightSubscriber sub(channel, options("gen-small"), rx.receiver());
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(upload(server.stub(), random_fp8_set(3, 93), v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(wait_until([&] { return sub.stats().versions_rejected == 1; }));
  sub.stop();
  EXPECT_EQ(sub.held_version(), 0);
  EXPECT_NE(sub.stats().last_error.find("buffer too small"), std::string::npos);
  std::lock_guard lock(rx.mu);
  EXPECT_TRUE(rx.installed.empty());
}

TEST(WeightSubscriberInPlace, StartNamesAMissingReceiverFunction) {
  auto channel = grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  Receiver rx;
  InPlaceReceiver no_install = rx.receiver();
  no_install.install = nullptr;
  absl::Status s = WeightSubscriber(channel, options("w"), no_install).start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("receiver.install"), std::string::npos) << s;
  InPlaceReceiver no_target = rx.receiver();
  no_target.target = nullptr;
  s = WeightSubscriber(channel, options("w"), no_target).start();
  EXPECT_NE(s.message().find("receiver.target"), std::string::npos) << s;
}

}  // namespace
}  // namespace fp8rl::weight_sync
