// Same-host upload (docs/design/weight-sync.md "Same-host upload"), real gRPC on loopback: an
// uploader on weight sync's host hands a version over as a file in weight sync's same-host
// directory; weight sync verifies it (CRC-32C per tensor), stores exactly the uploaded bytes and
// keeps the file as the version's same-host file, which the workers on the host then read (it is
// not written a second time). What is refused (weight sync off, another host, a path outside the
// directory, a second message, a corrupted or missing file) stores nothing and says which; the
// trainer's publisher falls back to the stream when refused and goes back to the file once
// weight sync's GetStatus offers it again (also after a restart).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "services/trainer_worker/weight_publisher.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/payload.h"
#include "services/weight_sync/same_host.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;
using testing::random_fp8_set;

std::string concat(const model::WeightSet& set) {
  std::string out;
  for (const auto& t : set.tensors) out.append(t.bytes.begin(), t.bytes.end());
  return out;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/fp8rl-same-host-upload-", name, "-", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Files under `dir` whose name starts with `prefix`.
int files_with(const std::string& dir, const std::string& prefix) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

WeightSyncOptions same_host_options(const std::string& dir) {
  WeightSyncOptions o = testing::fast_options();
  o.same_host = SameHostMode::kAuto;
  o.same_host_dir = dir;
  return o;
}

// A worker's double buffer; records every install.
struct Receiver {
  std::mutex mu;
  std::vector<char> buffers[2];
  int next = 0;
  std::vector<std::pair<int64_t, std::string>> installed;  // guarded by mu

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

SubscriberOptions subscriber_options(const std::string& worker, bool same_host) {
  SubscriberOptions o;
  o.worker_id = worker;
  o.initial_backoff = 20ms;
  o.max_backoff = 100ms;
  o.same_host = same_host;
  return o;
}

// Sends one raw UploadVersionRequest with `mapped` (and `extra` messages after it).
grpc::Status send_mapped(testing::TestServer& server, const v1::MappedUpload& mapped,
                         int extra = 0) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::UploadVersionResponse response;
  auto writer = server.stub()->UploadVersion(&context, &response);
  v1::UploadVersionRequest request;
  *request.mutable_mapped() = mapped;
  bool ok = writer->Write(request);
  for (int i = 0; ok && i < extra; ++i) ok = writer->Write(request);
  if (ok) writer->WritesDone();
  return writer->Finish();
}

// A MappedUpload of `set` whose file was written under `dir` (flip_at >= 0: that byte flipped).
v1::MappedUpload write_mapped(const std::string& dir, const model::WeightSet& set,
                              int64_t flip_at = -1) {
  std::string bytes = concat(set);
  if (flip_at >= 0) bytes[static_cast<size_t>(flip_at)] ^= 0x10;
  const std::span<const char> piece(bytes.data(), bytes.size());
  absl::StatusOr<std::string> path =
      write_upload_file(dir, set.version, std::span<const std::span<const char>>(&piece, 1));
  EXPECT_TRUE(path.ok()) << path.status();
  v1::MappedUpload mapped;
  *mapped.mutable_manifest() = build_manifest(set, v1::WEIGHT_FORMAT_FP8).value();
  mapped.set_path(path.ok() ? *path : "");
  mapped.set_local_host(local_host_id());
  return mapped;
}

TEST(SameHostUpload, FileIsVerifiedStoredAndServedToTheWorkersWithoutAnotherWrite) {
  const std::string dir = fresh_dir("served");
  {
    testing::TestServer server(same_host_options(dir));
    std::atomic<int> written{0};  // files weight sync wrote itself
    server.service().same_host_files().set_after_write([&](const std::string&) { ++written; });
    const model::WeightSet v1 = random_fp8_set(1, 401), v2 = random_fp8_set(2, 402);
    Receiver mapped_rx, tcp_rx;
    auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
    WeightSubscriber mapped(channel, subscriber_options("gen-mapped", true), mapped_rx.receiver());
    WeightSubscriber tcp(channel, subscriber_options("gen-tcp", false), tcp_rx.receiver());
    ASSERT_TRUE(mapped.start().ok());
    ASSERT_TRUE(tcp.start().ok());
    for (const model::WeightSet* set : {&v1, &v2}) {
      absl::StatusOr<v1::UploadVersionResponse> up =
          upload_same_host(channel, *set, v1::WEIGHT_FORMAT_FP8, dir);
      ASSERT_TRUE(up.ok()) << up.status();
      EXPECT_TRUE(up->same_host());
      EXPECT_EQ(up->version(), set->version);
      EXPECT_EQ(up->bytes_received(), concat(*set).size());
      // Taken over: no upload file is left under its own name.
      EXPECT_EQ(files_with(dir, "fp8rl-upload-"), 0);
      ASSERT_TRUE(mapped.wait_for_version(set->version, 10s));
      ASSERT_TRUE(tcp.wait_for_version(set->version, 10s));
    }
    mapped.stop();
    tcp.stop();
    EXPECT_EQ(mapped.stats().versions_same_host, 2);
    EXPECT_EQ(mapped.stats().same_host_fallbacks, 0);
    // The worker read the uploaded file itself: weight sync wrote none.
    EXPECT_EQ(written.load(), 0);
    EXPECT_EQ(server.metrics().pushes->with({"same_host"}).value(), 2);
    std::lock_guard l1(mapped_rx.mu), l2(tcp_rx.mu);
    ASSERT_EQ(mapped_rx.installed.size(), 2u);
    ASSERT_EQ(tcp_rx.installed.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const std::string want = concat(i == 0 ? v1 : v2);
      EXPECT_EQ(mapped_rx.installed[i].second, want) << "version " << i + 1;
      EXPECT_EQ(tcp_rx.installed[i].second, want) << "version " << i + 1;
    }
    EXPECT_EQ(files_with(dir, "fp8rl-weights-"), 1);  // the newest version's, kept
  }
  EXPECT_EQ(files_with(dir, ""), 0);  // removed with the service
  std::filesystem::remove_all(dir);
}

TEST(SameHostUpload, RefusedWhenWeightSyncDoesNotTakeThemAndTheFileIsRemoved) {
  const std::string dir = fresh_dir("off");
  WeightSyncOptions o = testing::fast_options();
  o.same_host_dir = dir;  // but --same-host off
  testing::TestServer server(o);
  const model::WeightSet set = random_fp8_set(1, 411);
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  absl::StatusOr<v1::UploadVersionResponse> up =
      upload_same_host(channel, set, v1::WEIGHT_FORMAT_FP8, dir);
  ASSERT_EQ(up.status().code(), absl::StatusCode::kFailedPrecondition) << up.status();
  EXPECT_NE(up.status().message().find("--same-host auto"), std::string::npos) << up.status();
  EXPECT_EQ(files_with(dir, ""), 0);
  EXPECT_EQ(server.service().store().latest_version(), 0);
  // The stream still works for the same version.
  ASSERT_TRUE(upload(channel, set, v1::WEIGHT_FORMAT_FP8).ok());
  EXPECT_EQ(server.service().store().latest_version(), 1);
  std::filesystem::remove_all(dir);
}

TEST(SameHostUpload, BadRequestsAreRefusedNamingTheProblemAndStoreNothing) {
  const std::string dir = fresh_dir("bad");
  testing::TestServer server(same_host_options(dir));
  const model::WeightSet set = random_fp8_set(3, 421);

  v1::MappedUpload other_host = write_mapped(dir, set);
  other_host.set_local_host("another-boot-id/another-host");
  grpc::Status s = send_mapped(server, other_host);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("mapped.local_host"), std::string::npos) << s.error_message();

  // A file outside the directory, or not an upload file, is never read.
  const std::string outside = fresh_dir("bad-outside") + "/fp8rl-upload-1-3-0";
  std::ofstream(outside) << concat(set);
  for (const std::string& path :
       {outside, dir + "/fp8rl-weights-1-3-0",
        dir + "/../" + std::filesystem::path(dir).filename().string() + "/fp8rl-upload-1-3-0",
        std::string("fp8rl-upload-1-3-0")}) {
    v1::MappedUpload bad = write_mapped(dir, set);
    std::filesystem::remove(bad.path());
    bad.set_path(path);
    s = send_mapped(server, bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << path;
    EXPECT_NE(s.error_message().find("mapped.path"), std::string::npos) << s.error_message();
  }

  v1::MappedUpload twice = write_mapped(dir, set);
  s = send_mapped(server, twice, /*extra=*/1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("one message"), std::string::npos) << s.error_message();

  // A missing file: the uploader is told to use the stream.
  v1::MappedUpload missing = write_mapped(dir, set);
  std::filesystem::remove(missing.path());
  s = send_mapped(server, missing);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find(missing.path()), std::string::npos) << s.error_message();

  // One byte flipped in the middle of the payload: its tensor's CRC-32C fails.
  const int64_t middle = static_cast<int64_t>(concat(set).size() / 2);
  v1::MappedUpload corrupt = write_mapped(dir, set, middle);
  s = send_mapped(server, corrupt);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  // A refused file is not taken over: it is still the uploader's.
  EXPECT_TRUE(std::filesystem::exists(corrupt.path()));

  EXPECT_EQ(server.service().store().latest_version(), 0);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(std::filesystem::path(outside).parent_path());
}

TEST(SameHostUpload, OrphanedUploadFilesOfDeadProcessesAreRemoved) {
  const std::string dir = fresh_dir("orphans");
  const std::string dead = dir + "/fp8rl-upload-99999999-7-0";  // above any pid_max
  const std::string mine = absl::StrCat(dir, "/fp8rl-upload-", ::getpid(), "-7-1");
  for (const std::string& path : {dead, mine}) std::ofstream(path) << "bytes";
  EXPECT_EQ(remove_orphaned_same_host_files(dir), 1);
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(mine));
  std::filesystem::remove_all(dir);
}

// The trainer's publisher: by file while weight sync takes same-host uploads (weight sync then
// writes no file of its own for a same-host worker), by the stream once it was refused and while
// weight sync offers what it offered then, by file again once it offers same-host uploads again,
// and by the stream when its --weight-same-host is off.
TEST(SameHostUpload, PublisherUsesTheStreamAfterARefusalUntilWeightSyncOffersTheFileAgain) {
  const std::string dir = fresh_dir("publisher");
  testing::TestServer server(same_host_options(dir));
  std::atomic<int> written{0};
  server.service().same_host_files().set_after_write([&](const std::string&) { ++written; });
  Receiver rx;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  WeightSubscriber worker(channel, subscriber_options("gen", true), rx.receiver());
  ASSERT_TRUE(worker.start().ok());
  std::unique_ptr<trainer::WeightPublisher> publisher =
      trainer::make_grpc_weight_publisher(10s, {}, 1, SameHostMode::kAuto);
  std::unique_ptr<trainer::WeightPublisher> off =
      trainer::make_grpc_weight_publisher(10s, {}, 1, SameHostMode::kOff);
  const std::string address = server.address();
  auto publish = [&](trainer::WeightPublisher& p, int64_t version) {
    absl::StatusOr<int64_t> latest = p.latest_version(address);
    ASSERT_TRUE(latest.ok()) << latest.status();
    ASSERT_EQ(*latest, version - 1);
    const model::WeightSet set = random_fp8_set(version, 430 + static_cast<uint32_t>(version));
    absl::StatusOr<uint64_t> bytes = p.upload(address, set, v1::WEIGHT_FORMAT_FP8);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_TRUE(worker.wait_for_version(version, 10s));
  };
  publish(*publisher, 1);
  EXPECT_EQ(written.load(), 0) << "version 1 went by file";
  publish(*off, 2);
  EXPECT_EQ(written.load(), 1) << "version 2 went over the stream";
  // Weight sync stops taking them after the publisher's GetStatus: the upload is refused and
  // sent over the stream; the next publish finds it still off and stays on the stream.
  absl::StatusOr<int64_t> latest = publisher->latest_version(address);
  ASSERT_TRUE(latest.ok()) << latest.status();
  server.service().set_same_host(false);
  const model::WeightSet v3 = random_fp8_set(3, 433);
  ASSERT_TRUE(publisher->upload(address, v3, v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(worker.wait_for_version(3, 10s));
  publish(*publisher, 4);
  // Taken again: the next GetStatus offers the directory, so the file is used again.
  server.service().set_same_host(true);
  publish(*publisher, 5);
  EXPECT_EQ(written.load(), 1) << "version 5 went by file";
  publish(*off, 6);
  EXPECT_EQ(written.load(), 2) << "version 6 went over the stream";
  EXPECT_EQ(files_with(dir, "fp8rl-upload-"), 0);
  worker.stop();
  std::lock_guard lock(rx.mu);
  ASSERT_EQ(rx.installed.size(), 6u);
  for (int64_t v = 1; v <= 6; ++v) {
    EXPECT_EQ(rx.installed[static_cast<size_t>(v - 1)].first, v);
    EXPECT_EQ(rx.installed[static_cast<size_t>(v - 1)].second,
              concat(random_fp8_set(v, 430 + static_cast<uint32_t>(v))))
        << "version " << v;
  }
  std::filesystem::remove_all(dir);
}

// A weight sync restarted on the same address with same-host uploads on gets files again: after
// a refusal by the process before it, and after an upload that failed because weight sync was
// down (the publisher could not ask it why).
TEST(SameHostUpload, PublisherUsesTheFileAgainWhenWeightSyncRestartsWithSameHostOn) {
  const std::string dir = fresh_dir("restart");
  auto server = std::make_unique<testing::TestServer>(same_host_options(dir));
  const int port = server->port();
  ASSERT_GT(port, 0);
  const std::string address = server->address();
  std::atomic<int> written{0};
  auto count_writes = [&] {
    server->service().same_host_files().set_after_write([&](const std::string&) { ++written; });
  };
  auto restart = [&] {
    server.reset();
    server = std::make_unique<testing::TestServer>(same_host_options(dir), port);
    ASSERT_EQ(server->port(), port);
    count_writes();
  };
  count_writes();
  Receiver rx;
  WeightSubscriber worker(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()),
                          subscriber_options("gen", true), rx.receiver());
  ASSERT_TRUE(worker.start().ok());
  std::unique_ptr<trainer::WeightPublisher> publisher =
      trainer::make_grpc_weight_publisher(10s, {}, 1, SameHostMode::kAuto);
  // GetStatus until the (restarted) weight sync answers: the channel reconnects with backoff.
  auto ask = [&] {
    absl::StatusOr<int64_t> latest = absl::UnknownError("not asked");
    EXPECT_TRUE(testing::wait_until([&] {
      return (latest = publisher->latest_version(address)).ok();
    })) << latest.status();
  };
  auto upload = [&](int64_t version) {
    return publisher->upload(address, random_fp8_set(version, 450 + static_cast<uint32_t>(version)),
                             v1::WEIGHT_FORMAT_FP8);
  };
  ask();
  ASSERT_TRUE(upload(1).ok());
  ASSERT_TRUE(worker.wait_for_version(1, 10s));
  EXPECT_EQ(written.load(), 0) << "version 1 went by file";

  // Refused (same-host off after the GetStatus): version 2 over the stream.
  server->service().set_same_host(false);
  absl::StatusOr<uint64_t> bytes = upload(2);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_TRUE(worker.wait_for_version(2, 10s));

  // Restarted with it on: the next GetStatus offers the directory again; version 3 by file.
  restart();
  ask();
  ASSERT_TRUE(upload(3).ok());
  ASSERT_TRUE(worker.wait_for_version(3, 10s));
  EXPECT_EQ(written.load(), 0) << "version 3 went by file";

  // Down during an upload (the file is written, the call fails), then back with it on.
  server.reset();
  EXPECT_FALSE(upload(4).ok());
  EXPECT_EQ(files_with(dir, "fp8rl-upload-"), 0) << "the refused file was removed";
  restart();
  ask();
  ASSERT_TRUE(upload(4).ok());
  ASSERT_TRUE(worker.wait_for_version(4, 10s));
  EXPECT_EQ(written.load(), 0) << "version 4 went by file";
  // The control: an upload over the stream to a same-host weight sync writes its file.
  std::unique_ptr<trainer::WeightPublisher> stream =
      trainer::make_grpc_weight_publisher(10s, {}, 1, SameHostMode::kOff);
  ASSERT_TRUE(stream->upload(address, random_fp8_set(5, 455), v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(worker.wait_for_version(5, 10s));
  EXPECT_EQ(written.load(), 1) << "version 5 went over the stream";

  worker.stop();
  std::lock_guard lock(rx.mu);
  ASSERT_FALSE(rx.installed.empty());
  EXPECT_EQ(rx.installed.back().first, 5);
  for (const auto& [v, payload] : rx.installed) {
    EXPECT_EQ(payload, concat(random_fp8_set(v, 450 + static_cast<uint32_t>(v)))) << v;
  }
  server.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp8rl::weight_sync
