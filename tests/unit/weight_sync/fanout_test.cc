// Fan-out through relays (docs/design/weight-sync-fanout.md): weight sync feeds the first worker(s)
// of a chain or tree, each worker's relay passes chunks on as they land; every worker ends holding
// the same bytes; a relay that dies or stalls mid-push is skipped and its successors re-attached
// to its predecessor without losing the version. Real gRPC on loopback ports, one server per
// worker relay.
#include "services/weight_sync/fanout.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/service/crc32c.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/relay.h"
#include "services/weight_sync/send_pacer.h"
#include "services/weight_sync/weight_sync_config.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;
using testing::random_fp8_set;

// CRC-32C of a version's payload (every tensor's bytes in manifest order).
uint32_t payload_crc(const model::WeightSet& set) {
  uint32_t crc = 0;
  for (const model::NamedTensor& t : set.tensors) {
    crc = service::crc32c(t.bytes.data(), t.bytes.size(), crc);
  }
  return crc;
}

// Passes everything to the relay, except that the first bytes() of version `gate` block until
// open() (a worker whose forwarding hangs mid-version).
class GatedTap final : public VersionTap {
 public:
  GatedTap(VersionTap* inner, int64_t gate) : inner_(inner), gate_(gate) {}
  void begin(const v1::VersionManifest& manifest) override {
    version_ = manifest.version();
    inner_->begin(manifest);
  }
  void bytes(uint64_t offset, std::span<const char> data) override {
    if (version_ == gate_) {
      std::unique_lock<std::mutex> lock(mu_);
      blocked_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    inner_->bytes(offset, data);
  }
  void end(bool complete) override { inner_->end(complete); }
  bool wait_blocked(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return blocked_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  VersionTap* const inner_;
  const int64_t gate_;
  int64_t version_ = 0;  // subscriber thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool blocked_ = false;  // guarded by mu_
  bool open_ = false;     // guarded by mu_
};

// A generation worker as far as weight sync can tell: a relay on its own loopback gRPC server and
// a subscriber that receives in place into two alternating buffers (as WeightDoubleBuffer does)
// and records the CRC-32C of each version it installs.
class RelayWorker {
 public:
  RelayWorker(const std::string& id, std::shared_ptr<grpc::Channel> root, int64_t gate_version = 0,
              std::chrono::milliseconds stall = 10s) {
    server_ = service::GrpcServer::start({.address = "127.0.0.1:0"}, {&relay_.service()}).value();
    VersionTap* tap = &relay_;
    if (gate_version > 0) {
      gate_ = std::make_unique<GatedTap>(&relay_, gate_version);
      tap = gate_.get();
    }
    SubscriberOptions options;
    options.worker_id = id;
    options.initial_backoff = 20ms;
    options.max_backoff = 200ms;
    options.relay_address = absl::StrCat("127.0.0.1:", server_->port());
    options.relay_stall_timeout = stall;
    options.tap = tap;
    InPlaceReceiver receiver;
    receiver.target = [this](const v1::VersionManifest& m) -> absl::StatusOr<std::span<char>> {
      std::lock_guard<std::mutex> lock(mu_);
      // Never the buffer holding the installed version (the base of a delta).
      const int slot = slot_version_[0] == installed_ ? 1 : 0;
      slot_version_[slot] = m.version();
      buffers_[slot].resize(m.total_bytes());
      return std::span<char>(buffers_[slot].data(), buffers_[slot].size());
    };
    receiver.install = [this](const v1::VersionManifest& m, std::span<const char> payload) {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead_) return absl::AbortedError("worker killed");  // a dead process installs nothing
      installed_ = m.version();
      crcs_[m.version()] = service::crc32c(payload.data(), payload.size());
      return absl::OkStatus();
    };
    receiver.base = [this](int64_t version) -> std::span<const char> {
      std::lock_guard<std::mutex> lock(mu_);
      for (int slot : {0, 1}) {
        if (version > 0 && slot_version_[slot] == version && installed_ == version) {
          return std::span<const char>(buffers_[slot].data(), buffers_[slot].size());
        }
      }
      return {};
    };
    subscriber_ = std::make_unique<WeightSubscriber>(std::move(root), options, std::move(receiver));
    EXPECT_TRUE(subscriber_->start().ok());
  }
  ~RelayWorker() { kill(); }

  // The process dies: its relay's server goes away (successors' streams break), then it stops.
  void kill() {
    {
      // Before the gate opens: the subscriber thread it releases must not install anything.
      std::lock_guard<std::mutex> lock(mu_);
      dead_ = true;
    }
    if (server_ != nullptr) {
      relay_.begin_shutdown();
      server_->shutdown(0ms);
      server_.reset();
    }
    if (gate_ != nullptr) gate_->open();
    subscriber_->stop();
  }

  // The CRC-32C of `version` as installed here (nullopt: not installed).
  std::optional<uint32_t> crc(int64_t version) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = crcs_.find(version);
    if (it == crcs_.end()) return std::nullopt;
    return it->second;
  }
  WeightSubscriber& subscriber() { return *subscriber_; }
  WeightRelay& relay() { return relay_; }
  GatedTap* gate() { return gate_.get(); }

 private:
  WeightRelay relay_;
  std::unique_ptr<GatedTap> gate_;
  std::unique_ptr<service::GrpcServer> server_;
  std::unique_ptr<WeightSubscriber> subscriber_;
  std::mutex mu_;
  std::string buffers_[2];            // guarded by mu_
  int64_t slot_version_[2] = {0, 0};  // guarded by mu_
  bool dead_ = false;                 // guarded by mu_: kill() ran
  int64_t installed_ = 0;             // guarded by mu_
  std::map<int64_t, uint32_t> crcs_;  // guarded by mu_
};

WeightSyncOptions root_options(const std::string& fanout) {
  WeightSyncOptions o = testing::fast_options();
  o.fanout = parse_fanout(fanout).value();
  return o;
}

// Starts `n` workers one after the other, each placed in the relay order before the next starts
// (so worker i is at position i). gates[i] > 0 gates worker i's relay on that version.
std::vector<std::unique_ptr<RelayWorker>> start_workers(testing::TestServer& root, int n,
                                                        std::map<int, int64_t> gates = {},
                                                        std::chrono::milliseconds stall = 10s) {
  std::vector<std::unique_ptr<RelayWorker>> workers;
  for (int i = 0; i < n; ++i) {
    workers.push_back(std::make_unique<RelayWorker>(absl::StrCat("w", i), root.channel(),
                                                    gates.count(i) ? gates[i] : 0, stall));
    const size_t want = static_cast<size_t>(i + 1);
    EXPECT_TRUE(testing::wait_until(
        [&] { return root.service().relay_topology().order().size() == want; }));
  }
  return workers;
}

void publish(testing::TestServer& root, const model::WeightSet& set) {
  ASSERT_TRUE(upload(root.channel(), set, v1::WEIGHT_FORMAT_FP8).ok());
}

// Every worker in `which` installs `set`'s version with `set`'s bytes within `timeout`.
void expect_all_hold(std::vector<std::unique_ptr<RelayWorker>>& workers, std::vector<int> which,
                     const model::WeightSet& set, std::chrono::milliseconds timeout = 20s) {
  const uint32_t want = payload_crc(set);
  for (int i : which) {
    SCOPED_TRACE(absl::StrCat("worker w", i));
    ASSERT_TRUE(workers[i]->subscriber().wait_for_version(set.version, timeout))
        << workers[i]->subscriber().stats().last_error;
    EXPECT_EQ(workers[i]->crc(set.version), want);
  }
}

// Payload bytes weight sync itself streamed to subscribers.
// Bytes weight sync has sent, once the count reaches `expected` or 5 s have passed: a stream
// counts its bytes after the write completes, which can trail the worker holding the version on a
// loaded machine (seen once under a full ctest: 14.2 MB of 17.4 MB counted).
double sent_bytes(testing::TestServer& root, double expected) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  double sent = root.metrics().sent_bytes->get().value();
  while (sent < expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    sent = root.metrics().sent_bytes->get().value();
  }
  return sent;
}

TEST(Fanout, ParsesModesAndRefusesOthers) {
  EXPECT_EQ(parse_fanout("direct")->kind, Fanout::Kind::kDirect);
  EXPECT_EQ(parse_fanout("chain")->kind, Fanout::Kind::kChain);
  absl::StatusOr<Fanout> tree = parse_fanout("tree:3");
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(tree->kind, Fanout::Kind::kTree);
  EXPECT_EQ(tree->k, 3);
  EXPECT_EQ(fanout_name(*tree), "tree:3");
  for (const char* bad : {"", "star", "tree", "tree:", "tree:0", "tree:65", "tree:2x", "Chain"}) {
    absl::StatusOr<Fanout> f = parse_fanout(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(f.status().message(),
              absl::StrCat("--fanout: must be direct, chain or tree:K with K in [1, 64], got '",
                           bad, "'"));
  }
}

TEST(Fanout, ConfigFlagDefaultsToDirectAndNamesItselfWhenBad) {
  absl::StatusOr<WeightSyncConfig> c = parse_weight_sync_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->sync.fanout.relays());
  c = parse_weight_sync_config({"--fanout", "tree:4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sync.fanout.kind, Fanout::Kind::kTree);
  EXPECT_EQ(c->sync.fanout.k, 4);
  c = parse_weight_sync_config({"--fanout=ring"});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "--fanout: must be direct, chain or tree:K"))
      << c.status();
}

TEST(RelayTopology, ChainTreeAndRemoval) {
  RelayTopology chain(*parse_fanout("chain"));
  EXPECT_FALSE(chain.join("a", "h:1").has_value());  // first: fed by weight sync
  EXPECT_EQ(chain.join("b", "h:2")->worker_id, "a");
  EXPECT_EQ(chain.join("c", "h:3")->worker_id, "b");
  EXPECT_EQ(chain.join("d", "h:4")->worker_id, "c");
  EXPECT_EQ(chain.join("c", "h:33")->address, "h:2");  // a known worker keeps its place
  EXPECT_TRUE(chain.remove("b"));
  EXPECT_FALSE(chain.remove("b"));
  EXPECT_EQ(chain.join("c", "h:3")->worker_id, "a");  // re-attached to b's predecessor
  EXPECT_EQ(chain.join("d", "h:4")->worker_id, "c");
  EXPECT_EQ(chain.order(), (std::vector<std::string>{"a", "c", "d"}));

  RelayTopology tree(*parse_fanout("tree:2"));
  std::vector<std::string> parents;
  for (const char* w : {"a", "b", "c", "d", "e", "f", "g"}) {
    std::optional<RelayTopology::Upstream> up = tree.join(w, absl::StrCat("addr-", w));
    parents.push_back(up ? up->worker_id : "-");
  }
  EXPECT_EQ(parents, (std::vector<std::string>{"-", "-", "a", "a", "b", "b", "c"}));
}

TEST(RelayFanout, ChainOfFourAllHoldEveryVersionAndWeightSyncSendsOneCopy) {
  testing::TestServer root(root_options("chain"));
  auto workers = start_workers(root, 4);
  const model::WeightSet v1 = random_fp8_set(1, 11), v2 = random_fp8_set(2, 12);
  publish(root, v1);
  expect_all_hold(workers, {0, 1, 2, 3}, v1);
  publish(root, v2);
  expect_all_hold(workers, {0, 1, 2, 3}, v2);
  // Weight sync sent each version once (to w0), whatever the number of workers; w0..w2 relayed.
  const double version_bytes = static_cast<double>(v1.nbytes() + v2.nbytes());
  EXPECT_EQ(sent_bytes(root, version_bytes), version_bytes);
  for (int i = 1; i < 4; ++i) EXPECT_GE(workers[i]->subscriber().stats().relay_redirects, 1);
  EXPECT_EQ(workers[0]->subscriber().stats().relay_redirects, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(workers[i]->relay().service().store().latest_version(), 2);
}

TEST(RelayFanout, TreeOfTwoAllHoldAndWeightSyncSendsTwoCopies) {
  testing::TestServer root(root_options("tree:2"));
  auto workers = start_workers(root, 5);
  const model::WeightSet v1 = random_fp8_set(1, 21);
  publish(root, v1);
  expect_all_hold(workers, {0, 1, 2, 3, 4}, v1);
  EXPECT_EQ(sent_bytes(root, 2.0 * v1.nbytes()), 2.0 * v1.nbytes());
  // w2 and w3 behind w0, w4 behind w1.
  EXPECT_GT(workers[0]->relay().service().store().latest_version(), 0);
  EXPECT_EQ(workers[1]->relay().service().store().latest_version(), 1);
}

TEST(RelayFanout, KilledMiddleWorkerIsSkippedAndTheRestGetTheVersion) {
  testing::TestServer root(root_options("chain"));
  // w1 hangs inside version 2 (after its manifest, before its first bytes go on), then dies.
  auto workers = start_workers(root, 4, {{1, 2}});
  const model::WeightSet v1 = random_fp8_set(1, 31), v2 = random_fp8_set(2, 32);
  publish(root, v1);
  expect_all_hold(workers, {0, 1, 2, 3}, v1);
  publish(root, v2);
  ASSERT_TRUE(workers[1]->gate()->wait_blocked(10s));
  workers[1]->kill();
  expect_all_hold(workers, {0, 2, 3}, v2);
  EXPECT_FALSE(workers[1]->crc(2).has_value());
  EXPECT_EQ(root.service().relay_topology().order(), (std::vector<std::string>{"w0", "w2", "w3"}));
  EXPECT_GE(workers[2]->subscriber().stats().upstream_failures, 1);
}

TEST(RelayFanout, StalledMiddleWorkerIsSkippedByDeadlineThenCatchesUp) {
  testing::TestServer root(root_options("chain"));
  // w1 stays up but stops forwarding inside version 2; w2 leaves it after 1.5 s of owing (long
  // enough that a loaded machine's scheduling delays do not make a healthy relay look stalled).
  auto workers = start_workers(root, 3, {{1, 2}}, 1500ms);
  const model::WeightSet v1 = random_fp8_set(1, 41), v2 = random_fp8_set(2, 42);
  publish(root, v1);
  expect_all_hold(workers, {0, 1, 2}, v1);
  publish(root, v2);
  ASSERT_TRUE(workers[1]->gate()->wait_blocked(10s));
  expect_all_hold(workers, {0, 2}, v2);
  EXPECT_FALSE(workers[1]->crc(2).has_value());
  EXPECT_GE(workers[2]->subscriber().stats().upstream_failures, 1);
  EXPECT_EQ(root.service().relay_topology().order(), (std::vector<std::string>{"w0", "w2"}));
  workers[1]->gate()->open();  // it recovers and still gets the version from w0
  expect_all_hold(workers, {0, 1, 2}, v2);
}

TEST(RelayFanout, DirectModeIgnoresRelayAddresses) {
  testing::TestServer root(testing::fast_options());
  std::vector<std::unique_ptr<RelayWorker>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<RelayWorker>(absl::StrCat("w", i), root.channel()));
  }
  const model::WeightSet v1 = random_fp8_set(1, 51);
  publish(root, v1);
  expect_all_hold(workers, {0, 1, 2}, v1);
  EXPECT_EQ(sent_bytes(root, 3.0 * v1.nbytes()), 3.0 * v1.nbytes());
  for (auto& w : workers) EXPECT_EQ(w->subscriber().stats().relay_redirects, 0);
}

TEST(SendPacer, HoldsChunksToTheLinkRate) {
  SendPacer unlimited(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) unlimited.take(1 << 20);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  // 3 x 1 MB on a 10 MB/s link: at least 0.3 s, shared by two threads as one link.
  SendPacer link(10e6);
  const auto t1 = std::chrono::steady_clock::now();
  std::thread other([&] { link.take(1000000); });
  link.take(1000000);
  link.take(1000000);
  other.join();
  EXPECT_GE(std::chrono::steady_clock::now() - t1, 300ms);
}

TEST(RelayFanout, RelayRefusesUploads) {
  WeightRelay relay;
  auto server = service::GrpcServer::start({.address = "127.0.0.1:0"}, {&relay.service()}).value();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                     grpc::InsecureChannelCredentials());
  absl::StatusOr<v1::UploadVersionResponse> r =
      upload(channel, random_fp8_set(1, 61), v1::WEIGHT_FORMAT_FP8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  relay.begin_shutdown();
  server->shutdown(0ms);
}

}  // namespace
}  // namespace fp8rl::weight_sync
