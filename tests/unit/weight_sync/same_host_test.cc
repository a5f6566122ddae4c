// Same-host shortcut (docs/design/weight-sync.md "Same-host mapping"), real gRPC on loopback: a
// worker that asks for it reads each version from weight sync's file and installs exactly the
// bytes a worker receiving over TCP installs; a corrupted file is refused by its CRC-32C and the
// version then arrives over TCP; a file the worker cannot open makes it fall back to TCP for good;
// nothing but complete, verified versions is ever installed; the files are removed afterwards.
#include "services/weight_sync/same_host.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "services/weight_sync/client.h"
#include "services/weight_sync/payload.h"
#include "services/weight_sync/weight_sync_config.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;
using testing::random_fp8_set;

SubscriberOptions options(const std::string& worker, bool same_host) {
  SubscriberOptions o;
  o.worker_id = worker;
  o.initial_backoff = 20ms;
  o.max_backoff = 100ms;
  o.same_host = same_host;
  return o;
}

// Two buffers handed out alternately (a worker's double buffer); records every install.
struct Receiver {
  std::mutex mu;
  std::vector<char> buffers[2];
  int next = 0;
  std::vector<std::pair<int64_t, std::string>> installed;  // version, bytes

  InPlaceReceiver receiver() {
    InPlaceReceiver r;
    r.target = [this](const v1::VersionManifest& m) -> absl::StatusOr<std::span<char>> {
      std::lock_guard lock(mu);
      std::vector<char>& b = buffers[next];
      next = 1 - next;
      b.assign(m.total_bytes(), 0);
      return std::span<char>(b);
    };
    r.install = [this](const v1::VersionManifest& m, std::span<const char> payload) {
      std::lock_guard lock(mu);
      installed.emplace_back(m.version(), std::string(payload.begin(), payload.end()));
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

// A fresh directory for one test's files.
std::string fresh_dir(const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/fp8rl-same-host-", name, "-", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

int files_in(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

WeightSyncOptions same_host_options(const std::string& dir) {
  WeightSyncOptions o = testing::fast_options();
  o.same_host = SameHostMode::kAuto;
  o.same_host_dir = dir;
  return o;
}

TEST(SameHost, FileAndStreamDeliverIdenticalBytes) {
  const std::string dir = fresh_dir("identical");
  {
    testing::TestServer server(same_host_options(dir));
    const model::WeightSet v1 = random_fp8_set(1, 301), v2 = random_fp8_set(2, 302);
    Receiver mapped_rx, tcp_rx;
    auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
    WeightSubscriber mapped(channel, options("gen-mapped", true), mapped_rx.receiver());
    WeightSubscriber tcp(channel, options("gen-tcp", false), tcp_rx.receiver());
    ASSERT_TRUE(mapped.start().ok());
    ASSERT_TRUE(tcp.start().ok());
    for (const model::WeightSet* set : {&v1, &v2}) {
      ASSERT_TRUE(upload(server.stub(), *set, v1::WEIGHT_FORMAT_FP8).ok());
      ASSERT_TRUE(mapped.wait_for_version(set->version, 10s));
      ASSERT_TRUE(tcp.wait_for_version(set->version, 10s));
    }
    mapped.stop();
    tcp.stop();
    EXPECT_EQ(mapped.stats().versions_same_host, 2);
    EXPECT_EQ(mapped.stats().same_host_fallbacks, 0);
    EXPECT_EQ(tcp.stats().versions_same_host, 0);
    EXPECT_EQ(server.metrics().pushes->with({"same_host"}).value(), 2);
    EXPECT_EQ(server.metrics().pushes->with({"full"}).value(), 2);
    std::lock_guard l1(mapped_rx.mu), l2(tcp_rx.mu);
    ASSERT_EQ(mapped_rx.installed.size(), 2u);
    ASSERT_EQ(tcp_rx.installed.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(mapped_rx.installed[i].first, i + 1);
      EXPECT_EQ(mapped_rx.installed[i].second, tcp_rx.installed[i].second) << "version " << i + 1;
      EXPECT_EQ(mapped_rx.installed[i].second, concat(i == 0 ? v1 : v2)) << "version " << i + 1;
    }
    // The newest version's file is kept for workers that subscribe later; older ones are gone.
    EXPECT_EQ(files_in(dir), 1);
  }
  EXPECT_EQ(files_in(dir), 0);  // removed with the service
  std::filesystem::remove_all(dir);
}

// One byte flipped in the file after weight sync wrote it: the worker's CRC-32C check refuses the
// version (acked as rejected), nothing of it is installed, and the same version then arrives
// over TCP intact.
TEST(SameHost, CorruptedFileIsRefusedAndTheVersionArrivesOverTcp) {
  const std::string dir = fresh_dir("corrupt");
  testing::TestServer server(same_host_options(dir));
  server.service().same_host_files().set_after_write([](const std::string& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    f.seekp(1000);
    f.write(&c, 1);
  });
  const model::WeightSet v1 = random_fp8_set(1, 311), v2 = random_fp8_set(2, 312);
  Receiver rx;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  WeightSubscriber sub(channel, options("gen-corrupt", true), rx.receiver());
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(upload(server.stub(), v1, v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(sub.wait_for_version(1, 10s));
  ASSERT_TRUE(upload(server.stub(), v2, v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(sub.wait_for_version(2, 10s));
  sub.stop();
  const WeightSubscriber::Stats stats = sub.stats();
  EXPECT_EQ(stats.same_host_fallbacks, 1);
  EXPECT_EQ(stats.versions_rejected, 1);
  EXPECT_NE(stats.last_error.find("crc32c"), std::string::npos) << stats.last_error;
  std::lock_guard lock(rx.mu);
  ASSERT_EQ(rx.installed.size(), 2u);  // only complete, verified versions
  EXPECT_EQ(rx.installed[0].first, 1);
  EXPECT_EQ(rx.installed[0].second, concat(v1));
  EXPECT_EQ(rx.installed[1].first, 2);
  EXPECT_EQ(rx.installed[1].second, concat(v2));
  server.stop();
  std::filesystem::remove_all(dir);
}

// A worker that cannot open the file (here it is gone before the worker reads it; on another
// host, or without the shared directory, likewise) falls back to TCP for this and every later
// version, and counts it.
TEST(SameHost, WorkerThatCannotOpenTheFileFallsBackToTcp) {
  const std::string dir = fresh_dir("fallback");
  testing::TestServer server(same_host_options(dir));
  server.service().same_host_files().set_after_write(
      [](const std::string& path) { std::filesystem::remove(path); });
  const model::WeightSet v1 = random_fp8_set(1, 321), v2 = random_fp8_set(2, 322);
  Receiver rx;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  WeightSubscriber sub(channel, options("gen-fallback", true), rx.receiver());
  ASSERT_TRUE(sub.start().ok());
  for (const model::WeightSet* set : {&v1, &v2}) {
    ASSERT_TRUE(upload(server.stub(), *set, v1::WEIGHT_FORMAT_FP8).ok());
    ASSERT_TRUE(sub.wait_for_version(set->version, 10s));
  }
  sub.stop();
  EXPECT_EQ(sub.stats().same_host_fallbacks, 1);  // the second version was not offered
  EXPECT_EQ(sub.stats().versions_same_host, 0);
  EXPECT_EQ(sub.stats().versions_rejected, 0);  // nothing was wrong with the version
  EXPECT_EQ(server.metrics().pushes->with({"same_host"}).value(), 1);
  std::lock_guard lock(rx.mu);
  ASSERT_EQ(rx.installed.size(), 2u);
  EXPECT_EQ(rx.installed[0].second, concat(v1));
  EXPECT_EQ(rx.installed[1].second, concat(v2));
  server.stop();
  std::filesystem::remove_all(dir);
}

// Off (the service's default, or switched at run time): workers that ask get the stream.
TEST(SameHost, OffSendsOverTheStream) {
  const std::string dir = fresh_dir("off");
  testing::TestServer server(same_host_options(dir));
  server.service().set_same_host(false);
  const model::WeightSet v1 = random_fp8_set(1, 331);
  Receiver rx;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  WeightSubscriber sub(channel, options("gen-off", true), rx.receiver());
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(upload(server.stub(), v1, v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(sub.wait_for_version(1, 10s));
  sub.stop();
  EXPECT_EQ(sub.stats().versions_same_host, 0);
  EXPECT_EQ(files_in(dir), 0);
  server.stop();
  std::filesystem::remove_all(dir);
}

// Files left by a weight sync that was killed (its pid no longer runs) are removed before the
// first file is written; files of running processes and other files are left alone.
TEST(SameHost, OrphanedFilesOfDeadProcessesAreRemoved) {
  const std::string dir = fresh_dir("orphans");
  const std::string dead = dir + "/fp8rl-weights-99999999-7-0";  // above any pid_max
  const std::string mine = absl::StrCat(dir, "/fp8rl-weights-", ::getpid(), "-7-1");
  const std::string other = dir + "/not-ours";
  for (const std::string& path : {dead, mine, other}) std::ofstream(path) << "bytes";
  EXPECT_EQ(remove_orphaned_same_host_files(dir), 1);
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(mine));
  EXPECT_TRUE(std::filesystem::exists(other));
  std::filesystem::remove_all(dir);
}

TEST(SameHost, FlagsNameTheirErrors) {
  absl::StatusOr<SameHostMode> bad = parse_same_host_mode("on", "--same-host");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--same-host: must be off or auto, got 'on'");
  absl::StatusOr<WeightSyncConfig> config = parse_weight_sync_config({"--same-host", "maybe"});
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("--same-host"), std::string::npos) << config.status();
  config = parse_weight_sync_config({"--same-host", "auto", "--same-host-dir", ""});
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("same"), std::string::npos) << config.status();
  config = parse_weight_sync_config({"--same-host", "auto"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sync.same_host, SameHostMode::kAuto);
  EXPECT_EQ(config->sync.same_host_dir, "/dev/shm");
}

TEST(SameHost, HostIdIsStableAndNonEmpty) {
  EXPECT_FALSE(local_host_id().empty());
  EXPECT_EQ(local_host_id(), local_host_id());
}

}  // namespace
}  // namespace fp8rl::weight_sync
