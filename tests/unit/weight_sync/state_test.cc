// Tests of the service's state: the bounded version store and its waits, worker versions and push
// latency, and the binary's flag/YAML configuration (registration flags included).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "services/weight_sync/version_store.h"
#include "services/weight_sync/weight_sync_config.h"
#include "services/weight_sync/worker_table.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;

StoredVersionPtr make_version(int64_t v, const std::string& payload) {
  auto out = std::make_shared<StoredVersion>();
  out->manifest.set_version(v);
  out->payload = payload;
  out->arrived = std::chrono::steady_clock::now();
  return out;
}

TEST(VersionStore, KeepsTheNewestKAndRefusesOlderVersions) {
  VersionStore store(2);
  EXPECT_EQ(store.latest(), nullptr);
  EXPECT_EQ(store.latest_version(), 0);
  ASSERT_TRUE(store.add(make_version(3, "abc")).ok());
  ASSERT_TRUE(store.add(make_version(5, "defg")).ok());
  const StoredVersionPtr held = store.get(3);  // a stream still sending version 3
  ASSERT_TRUE(store.add(make_version(9, "hi")).ok());
  EXPECT_EQ(store.versions(), (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(store.get(3), nullptr);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->payload, "abc");  // evicted but alive while shared
  EXPECT_EQ(store.latest()->payload, "hi");

  for (int64_t v : {9, 8}) {
    const absl::Status s = store.add(make_version(v, "x"));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("not newer than the latest stored version 9"), std::string::npos)
        << s;
  }
  EXPECT_EQ(store.latest_version(), 9);
}

TEST(VersionStore, WaitNewerWakesOnAddAndOnClose) {
  VersionStore store(1);
  ASSERT_TRUE(store.add(make_version(1, "one")).ok());
  EXPECT_EQ(store.wait_newer(0, 10ms)->version(), 1);  // already newer: immediate
  EXPECT_EQ(store.wait_newer(1, 20ms), nullptr);       // timeout
  std::thread adder([&] {
    std::this_thread::sleep_for(30ms);
    ASSERT_TRUE(store.add(make_version(2, "two")).ok());
  });
  const StoredVersionPtr got = store.wait_newer(1, 5s);
  adder.join();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->payload, "two");

  std::thread closer([&] {
    std::this_thread::sleep_for(30ms);
    store.close();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(store.wait_newer(2, 5s), nullptr);
  closer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_TRUE(store.closed());
  EXPECT_EQ(store.wait_newer(0, 5s), nullptr);  // closed: no more waiting
}

// A version being uploaded: announced to waiters while it arrives, its received prefix readable
// (the last byte only once it is stored), withdrawn when the upload fails, replaced by the stored
// version when it completes.
TEST(VersionStore, ArrivingVersionsAreAnnouncedReadInOrderAndWithdrawn) {
  VersionStore store(2);
  ASSERT_TRUE(store.add(make_version(1, "one")).ok());
  auto stored = std::make_shared<StoredVersion>();
  stored->manifest.set_version(2);
  stored->payload.assign(10, '\0');
  auto arriving = std::make_shared<ArrivingVersion>(stored, stored->payload.data());
  EXPECT_EQ(arriving->total_bytes(), 10u);

  // Not announced yet: a waiter holding version 1 times out.
  VersionStore::Newer none = store.wait_newer_or_arriving(1, 10ms);
  EXPECT_EQ(none.stored, nullptr);
  EXPECT_EQ(none.arriving, nullptr);
  std::thread announcer([&] {
    std::this_thread::sleep_for(30ms);
    store.begin_arrival(arriving);
  });
  VersionStore::Newer got = store.wait_newer_or_arriving(1, 5s);
  announcer.join();
  EXPECT_EQ(got.stored, nullptr);
  ASSERT_EQ(got.arriving, arriving);
  // A waiter that holds nothing gets the arriving version too (it is the newest).
  EXPECT_EQ(store.wait_newer_or_arriving(0, 10ms).arriving, arriving);
  // An older or equal arrival does not replace it; one not newer than the store is ignored.
  auto old_stored = std::make_shared<StoredVersion>();
  old_stored->manifest.set_version(1);
  old_stored->payload = "x";
  store.begin_arrival(std::make_shared<ArrivingVersion>(old_stored, old_stored->payload.data()));
  EXPECT_EQ(store.wait_newer_or_arriving(1, 10ms).arriving, arriving);

  uint64_t ready = 0;
  EXPECT_EQ(arriving->wait(4, 10ms, &ready), ArrivingVersion::State::kArriving);
  EXPECT_EQ(ready, 0u);
  std::memcpy(arriving->data(), "abcd", 4);
  arriving->advance(4);
  EXPECT_EQ(arriving->wait(4, 10ms, &ready), ArrivingVersion::State::kArriving);
  EXPECT_EQ(ready, 4u);
  EXPECT_EQ(std::string(stored->payload.data(), 4), "abcd");
  // All bytes in, but not stored: the last byte is held back.
  arriving->advance(10);
  EXPECT_EQ(arriving->wait(10, 10ms, &ready), ArrivingVersion::State::kArriving);
  EXPECT_EQ(ready, 9u);
  ASSERT_TRUE(store.add(stored).ok());  // the store replaces the arrival by the version
  arriving->finish(true);
  EXPECT_EQ(arriving->wait(10, 10ms, &ready), ArrivingVersion::State::kComplete);
  EXPECT_EQ(ready, 10u);
  got = store.wait_newer_or_arriving(1, 10ms);
  EXPECT_EQ(got.arriving, nullptr);
  EXPECT_EQ(got.stored, stored);

  // A failed upload: waiters see kFailed, and the store forgets the arrival.
  auto third = std::make_shared<StoredVersion>();
  third->manifest.set_version(3);
  third->payload.assign(8, 'z');
  auto failing = std::make_shared<ArrivingVersion>(third, third->payload.data());
  store.begin_arrival(failing);
  EXPECT_EQ(store.wait_newer_or_arriving(2, 10ms).arriving, failing);
  failing->advance(3);
  failing->finish(false);
  failing->finish(true);  // the first end counts
  EXPECT_EQ(failing->wait(8, 10ms, &ready), ArrivingVersion::State::kFailed);
  EXPECT_EQ(ready, 3u);
  store.end_arrival(failing.get());
  got = store.wait_newer_or_arriving(2, 10ms);
  EXPECT_EQ(got.arriving, nullptr);
  EXPECT_EQ(got.stored, nullptr);
  EXPECT_EQ(store.latest_version(), 2);
}

TEST(WorkerTable, TracksAcksAndStreams) {
  WorkerTable table;
  const auto now = std::chrono::steady_clock::now();
  table.stream_opened("gen-0");
  table.stream_opened("gen-1");
  EXPECT_EQ(table.subscribed_workers(), 2);
  ASSERT_TRUE(table.ack("gen-0", 4, true, "", 1000, now).ok());
  ASSERT_TRUE(table.ack("gen-0", 3, true, "", 2000, now).ok());  // older ack does not go back
  ASSERT_TRUE(table.ack("gen-1", 4, false, "crc mismatch", 3000, now).ok());
  table.stream_closed("gen-1");
  const auto snap = table.snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].worker_id, "gen-0");
  EXPECT_EQ(snap[0].version, 4);
  EXPECT_EQ(snap[0].acked_unix_ms, 1000);
  EXPECT_EQ(snap[0].open_streams, 1);
  EXPECT_EQ(snap[1].version, 0);
  EXPECT_EQ(snap[1].last_error, "crc mismatch");
  EXPECT_EQ(snap[1].open_streams, 0);
  EXPECT_EQ(table.subscribed_workers(), 1);

  EXPECT_EQ(table.ack("", 1, true, "", 0, now).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.ack("gen-0", 0, true, "", 0, now).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerTable, PushLatencyEndsAtTheLastSubscribedWorkersAck) {
  WorkerTable table;
  const auto t0 = std::chrono::steady_clock::now();
  table.stream_opened("a");
  table.stream_opened("b");
  table.stream_opened("c");
  table.published(2, t0);
  auto r = table.ack("a", 2, true, "", 1, t0 + 100ms);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  r = table.ack("b", 2, false, "bad", 1, t0 + 150ms);  // a rejection does not complete the push
  EXPECT_FALSE(r->has_value());
  r = table.ack("b", 2, true, "", 1, t0 + 250ms);
  EXPECT_FALSE(r->has_value());
  // c disconnects without acknowledging: the push is done at b's ack.
  const std::optional<double> latency = table.stream_closed("c");
  ASSERT_TRUE(latency.has_value());
  EXPECT_NEAR(*latency, 0.25, 1e-9);

  // A version published with nobody subscribed records nothing.
  WorkerTable empty;
  empty.published(1, t0);
  EXPECT_FALSE(empty.ack("x", 1, true, "", 1, t0 + 1s)->has_value());
}

TEST(Config, DefaultsFlagsAndYaml) {
  absl::StatusOr<WeightSyncConfig> c = parse_weight_sync_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.grpc_port, 50052);
  EXPECT_EQ(c->metrics_port, 9402);
  EXPECT_EQ(c->sync.keep_versions, 2);
  EXPECT_EQ(c->sync.chunk_bytes, kDefaultChunkBytes);

  c = parse_weight_sync_config({"--grpc-port", "6000", "--http-port=9999", "--keep-versions", "5",
                                "--chunk-bytes", "1048576"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.grpc_port, 6000);
  EXPECT_EQ(c->metrics_port, 9999);
  EXPECT_EQ(c->service.http_port, 9999);
  EXPECT_EQ(c->sync.keep_versions, 5);
  EXPECT_EQ(c->sync.chunk_bytes, 1u << 20);

  c = parse_weight_sync_config({"--metrics-port", "9500"});  // the deprecated old name
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_port, 9500);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0], "--metrics-port is deprecated; use --http-port");

  const std::string path = ::testing::TempDir() + "/weight_sync_config_test.yaml";
  {
    std::ofstream f(path);
    f << "keep_versions: 3\nhttp_port: 9411\ngrpc_port: 50111\n";
  }
  c = parse_weight_sync_config({"--config", path, "--keep-versions", "4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sync.keep_versions, 4);  // flags override the file
  EXPECT_EQ(c->metrics_port, 9411);
  EXPECT_EQ(c->service.grpc_port, 50111);
}

TEST(Config, CoordinatorAndAdvertiseHost) {
  absl::StatusOr<WeightSyncConfig> c = parse_weight_sync_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.coordinator, "localhost:50051");
  EXPECT_EQ(c->service.advertise_host, "127.0.0.1");
  EXPECT_TRUE(c->registers());

  c = parse_weight_sync_config({"--coordinator", "coord:51051", "--advertise-host", "ws-host"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.coordinator, "coord:51051");
  EXPECT_EQ(service::advertise_address(c->service, 51052), "ws-host:51052");
  EXPECT_TRUE(c->registers());

  // An empty coordinator, either spelling, turns registration off; the last one given wins.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--coordinator", ""}, std::vector<std::string>{"--coordinator="},
        std::vector<std::string>{"--coordinator", "c:1", "--coordinator", ""},
        std::vector<std::string>{"--coordinator", "", "--grpc-port", "6001"}}) {
    c = parse_weight_sync_config(args);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_FALSE(c->registers()) << args[0];
    EXPECT_EQ(c->service.coordinator, "");
  }
  c = parse_weight_sync_config({"--coordinator", "", "--coordinator=c:2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.coordinator, "c:2");
  EXPECT_TRUE(c->registers());

  c = parse_weight_sync_config({"--advertise-host", ""});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--advertise-host"), std::string::npos) << c.status();
}

TEST(Config, DeltaFlags) {
  absl::StatusOr<WeightSyncConfig> c = parse_weight_sync_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  const WeightSyncOptions defaults;
  EXPECT_EQ(c->sync.deltas, defaults.deltas);
  EXPECT_TRUE(c->sync.deltas);
  EXPECT_EQ(c->sync.delta_choice, WeightSyncOptions::DeltaChoice::kMeasured);
  EXPECT_DOUBLE_EQ(c->sync.delta_max_fraction, defaults.delta_max_fraction);
  EXPECT_EQ(c->sync.delta_zstd_level, kDefaultDeltaZstdLevel);
  EXPECT_TRUE(c->sync.cut_through);
  EXPECT_EQ(c->sync.part_timeout, std::chrono::seconds(60));

  c = parse_weight_sync_config({"--deltas", "off", "--delta-max-fraction", "0.25",
                                "--delta-zstd-level=19", "--cut-through", "off",
                                "--upload-part-timeout-ms", "2500"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sync.part_timeout, std::chrono::milliseconds(2500));
  EXPECT_FALSE(c->sync.deltas);
  EXPECT_FALSE(c->sync.cut_through);
  EXPECT_DOUBLE_EQ(c->sync.delta_max_fraction, 0.25);
  EXPECT_EQ(c->sync.delta_zstd_level, 19);

  c = parse_weight_sync_config(
      {"--deltas=on", "--delta-max-fraction", "1", "--delta-zstd-level", "1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->sync.deltas);
  EXPECT_DOUBLE_EQ(c->sync.delta_max_fraction, 1.0);
  EXPECT_EQ(c->sync.delta_zstd_level, 1);
  EXPECT_EQ(c->sync.delta_choice, WeightSyncOptions::DeltaChoice::kMeasured);

  c = parse_weight_sync_config({"--deltas", "always"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->sync.deltas);
  EXPECT_EQ(c->sync.delta_choice, WeightSyncOptions::DeltaChoice::kAlways);

  // YAML keys in snake_case; a flag overrides the file.
  const std::string path = ::testing::TempDir() + "/weight_sync_delta_config_test.yaml";
  {
    std::ofstream f(path);
    f << "deltas: off\ndelta_max_fraction: 0.5\ndelta_zstd_level: 7\n";
  }
  c = parse_weight_sync_config({"--config", path, "--delta-zstd-level", "3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->sync.deltas);
  EXPECT_DOUBLE_EQ(c->sync.delta_max_fraction, 0.5);
  EXPECT_EQ(c->sync.delta_zstd_level, 3);
}

TEST(Config, BadValuesNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--keep-versions", "0"}, "--keep-versions: must be in [1, 64], got 0"},
      {{"--keep-versions", "two"}, "--keep-versions: expected an integer, got 'two'"},
      {{"--chunk-bytes", "9000000000"}, "--chunk-bytes: must be in [1, 8388608]"},
      {{"--http-port", "70000"}, "--http-port: must be in [0, 65535]"},
      {{"--metrics-port", "9600", "--http-port", "9700"}, "--metrics-port: 9600 disagrees"},
      {{"--grpc-port", "-3"}, "--grpc-port"},
      {{"--bogus", "1"}, "--bogus: unknown flag"},
      {{"--deltas", "maybe"}, "--deltas: must be on, always or off, got 'maybe'"},
      {{"--deltas", ""}, "--deltas"},
      {{"--delta-max-fraction", "0"}, "--delta-max-fraction: must be in (0, 1], got 0"},
      {{"--delta-max-fraction", "1.5"}, "--delta-max-fraction: must be in (0, 1], got 1.5"},
      {{"--delta-max-fraction", "-0.1"}, "--delta-max-fraction: must be in (0, 1]"},
      {{"--delta-max-fraction", "nan"}, "--delta-max-fraction: expected a number, got 'nan'"},
      {{"--delta-max-fraction", "half"}, "--delta-max-fraction: expected a number, got 'half'"},
      {{"--delta-zstd-level", "0"}, "--delta-zstd-level: must be in [1, 19], got 0"},
      {{"--delta-zstd-level", "22"}, "--delta-zstd-level: must be in [1, 19], got 22"},
      {{"--delta-zstd-level", "fast"}, "--delta-zstd-level: expected an integer, got 'fast'"},
      {{"--cut-through", "yes"}, "--cut-through: must be on or off, got 'yes'"},
      {{"--upload-part-timeout-ms", "0"},
       "--upload-part-timeout-ms: must be in [1, 3600000], got 0"},
  };
  for (const auto& [args, expect] : cases) {
    SCOPED_TRACE(expect);
    const absl::StatusOr<WeightSyncConfig> c = parse_weight_sync_config(args);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(expect), std::string::npos) << c.status();
  }
}

}  // namespace
}  // namespace fp8rl::weight_sync
