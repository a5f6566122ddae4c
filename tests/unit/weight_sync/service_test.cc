// The weight-sync service over real gRPC on a loopback port: uploads reach every subscriber
// byte-identical, late subscribers get the latest version at once, corrupt or incomplete uploads
// are rejected and never served, acks show up in GetStatus, the metrics follow docs/metrics.md,
// and shutdown ends open streams promptly.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
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
using testing::TestServer;
using testing::wait_until;

// Collects what a subscriber hands over.
class Received {
 public:
  WeightSetHandler handler() {
    return [this](model::WeightSet set) {
      std::lock_guard<std::mutex> lock(mu_);
      sets_.push_back(std::move(set));
      return absl::OkStatus();
    };
  }
  std::vector<int64_t> versions() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int64_t> out;
    for (const auto& s : sets_) out.push_back(s.version);
    return out;
  }
  model::WeightSet last() {
    std::lock_guard<std::mutex> lock(mu_);
    return sets_.back();
  }

 private:
  std::mutex mu_;
  std::vector<model::WeightSet> sets_;
};

std::unique_ptr<WeightSubscriber> subscribe(TestServer& server, const std::string& worker,
                                            Received& received, int64_t held = 0) {
  SubscriberOptions options;
  options.worker_id = worker;
  options.held_version = held;
  options.initial_backoff = 20ms;
  options.max_backoff = 200ms;
  auto sub = std::make_unique<WeightSubscriber>(server.channel(), options, received.handler());
  EXPECT_TRUE(sub->start().ok());
  return sub;
}

// Waits until the service reports `n` workers with an open stream.
void wait_subscribed(TestServer& server, int n) {
  wait_until([&] { return server.service().workers().subscribed_workers() >= n; });
  ASSERT_EQ(server.service().workers().subscribed_workers(), n);
}

// The value of one series in the Prometheus text ("name{label=\"x\"}"), or -1 when absent.
double metric(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

const v1::WorkerVersion* find_worker(const v1::WeightSyncStatus& status, const std::string& id) {
  for (const auto& w : status.workers()) {
    if (w.worker_id() == id) return &w;
  }
  return nullptr;
}

TEST(WeightSyncService, UploadThenSubscribeDeliversTheIdenticalWeightSet) {
  TestServer server;
  const model::WeightSet set = random_fp8_set(1, 101);
  absl::StatusOr<v1::UploadVersionResponse> up = upload(server.stub(), set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->version(), 1);
  EXPECT_EQ(up->bytes_received(), static_cast<uint64_t>(set.nbytes()));

  Received received;
  auto sub = subscribe(server, "gen-0", received);
  ASSERT_TRUE(sub->wait_for_version(1, 10s));
  ASSERT_EQ(received.versions(), std::vector<int64_t>{1});
  expect_same_set(set, received.last());

  // The ack follows the swap; wait for the service to record it.
  ASSERT_TRUE(wait_until([&] {
    return metric(server.registry().render(),
                  "fp8rl_weight_sync_worker_version{worker=\"gen-0\"}") == 1;
  }));
  const v1::WeightSyncStatus status = server.status();
  EXPECT_EQ(status.latest_version(), 1);
  ASSERT_EQ(status.stored_versions_size(), 1);
  const v1::WorkerVersion* w = find_worker(status, "gen-0");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->version(), 1);
  EXPECT_TRUE(w->subscribed());
  EXPECT_GT(w->acked_unix_ms(), 0);

  const std::string text = server.registry().render();
  const double total = static_cast<double>(set.nbytes());
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_uploads_total{result=\"accepted\"}"), 1);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_uploads_total{result=\"rejected\"}"), 0);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_received_bytes_total"), total);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_sent_bytes_total"), total);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_latest_version"), 1);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_version_bytes{format=\"fp8\"}"), total);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_subscribers"), 1);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_worker_version{worker=\"gen-0\"}"), 1);
}

// Chunks go out as gRPC slices over the stored version's bytes (zero-copy send) or, switched off,
// copied into messages as before. A client reading plain SubscribeResponse messages sees the same
// chunks either way (a version and offsets of several varint bytes, the first offset 0), and
// they cover the stored payload in order.
TEST(WeightSyncService, ZeroCopyChunksParseAsTheSameMessages) {
  WeightSyncOptions options = testing::fast_options();
  options.chunk_bytes = 1000;
  TestServer server(options);
  const model::WeightSet set = random_fp8_set(300, 17);
  ASSERT_TRUE(upload(server.stub(), set, v1::WEIGHT_FORMAT_FP8).ok());
  const StoredVersionPtr stored = server.service().store().get(300);
  ASSERT_NE(stored, nullptr);
  ASSERT_GT(stored->payload.size(), 20 * options.chunk_bytes);

  auto receive = [&](bool zero_copy) {
    server.service().set_zero_copy_send(zero_copy);
    grpc::ClientContext context;
    v1::SubscribeRequest request;
    request.set_worker_id(zero_copy ? "zero-copy" : "copied");
    auto reader = server.stub()->Subscribe(&context, request);
    std::vector<v1::WeightChunk> chunks;
    v1::SubscribeResponse response;
    EXPECT_TRUE(reader->Read(&response));
    EXPECT_TRUE(response.has_manifest());
    EXPECT_EQ(response.manifest().version(), 300);
    uint64_t got = 0;
    while (got < stored->payload.size() && reader->Read(&response)) {
      EXPECT_TRUE(response.has_chunk());
      got += response.chunk().data().size();
      chunks.push_back(response.chunk());
    }
    context.TryCancel();
    reader->Finish();
    return chunks;
  };
  const std::vector<v1::WeightChunk> zero_copy = receive(true);
  const std::vector<v1::WeightChunk> copied = receive(false);
  ASSERT_EQ(zero_copy.size(), copied.size());
  std::string joined;
  for (size_t i = 0; i < zero_copy.size(); ++i) {
    EXPECT_EQ(zero_copy[i].version(), 300);
    EXPECT_EQ(zero_copy[i].offset(), joined.size());
    EXPECT_EQ(zero_copy[i].SerializeAsString(), copied[i].SerializeAsString()) << "chunk " << i;
    joined += zero_copy[i].data();
  }
  EXPECT_TRUE(joined == stored->payload);
}

// The upload fills each chunk straight from the tensors: chunks that end inside a tensor, span
// several tensors, or hold the whole payload all arrive intact (the service checks every tensor's
// CRC-32C, so an accepted upload is byte-exact).
TEST(WeightSyncService, UploadChunksStraddlingTensorsArriveIntact) {
  TestServer server;
  const int64_t total = random_fp8_set(1, 105).nbytes();
  const std::vector<uint64_t> chunk_sizes = {4093, 1 << 16, static_cast<uint64_t>(total),
                                             static_cast<uint64_t>(total) + 1};
  model::WeightSet last;
  for (size_t i = 0; i < chunk_sizes.size(); ++i) {
    const int64_t version = static_cast<int64_t>(i) + 1;
    last = random_fp8_set(version, 105 + static_cast<uint32_t>(i));
    UploadOptions options;
    options.chunk_bytes = chunk_sizes[i];
    absl::StatusOr<v1::UploadVersionResponse> up =
        upload(server.channel(), last, v1::WEIGHT_FORMAT_FP8, options);
    ASSERT_TRUE(up.ok()) << "chunk_bytes " << chunk_sizes[i] << ": " << up.status();
    EXPECT_EQ(up->bytes_received(), static_cast<uint64_t>(last.nbytes()));
  }
  Received received;
  auto sub = subscribe(server, "gen-0", received);
  ASSERT_TRUE(sub->wait_for_version(4, 10s));
  expect_same_set(last, received.last());
}

TEST(WeightSyncService, TwoSubscribersReceiveEveryNewVersion) {
  TestServer server;
  Received r0, r1;
  auto s0 = subscribe(server, "gen-0", r0);
  auto s1 = subscribe(server, "gen-1", r1);
  wait_subscribed(server, 2);

  const model::WeightSet v1 = random_fp8_set(1, 201);
  const model::WeightSet v2 = random_fp8_set(2, 202);
  ASSERT_TRUE(upload(server.channel(), v1, v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(s0->wait_for_version(1, 10s));
  ASSERT_TRUE(s1->wait_for_version(1, 10s));
  expect_same_set(v1, r0.last());
  expect_same_set(v1, r1.last());

  UploadOptions small_chunks;
  small_chunks.chunk_bytes = 1 << 20;
  ASSERT_TRUE(upload(server.channel(), v2, v1::WEIGHT_FORMAT_FP8, small_chunks).ok());
  ASSERT_TRUE(s0->wait_for_version(2, 10s));
  ASSERT_TRUE(s1->wait_for_version(2, 10s));
  expect_same_set(v2, r0.last());
  expect_same_set(v2, r1.last());
  EXPECT_EQ(r0.versions(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r1.versions(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(s0->stats().streams_opened, 1);  // one stream carried both versions

  // Each push finishes when both workers acknowledged it: two latency samples.
  ASSERT_TRUE(wait_until([&] {
    return metric(server.registry().render(), "fp8rl_weight_sync_push_seconds_count") == 2;
  }));
  const v1::WeightSyncStatus st = server.status();
  ASSERT_NE(find_worker(st, "gen-0"), nullptr);
  ASSERT_NE(find_worker(st, "gen-1"), nullptr);
  EXPECT_EQ(find_worker(st, "gen-0")->version(), 2);
  EXPECT_EQ(find_worker(st, "gen-1")->version(), 2);
  EXPECT_EQ(metric(server.registry().render(), "fp8rl_weight_sync_sent_bytes_total"),
            2.0 * static_cast<double>(v1.nbytes() + v2.nbytes()));
}

TEST(WeightSyncService, LateSubscriberGetsOnlyTheLatestVersionAtOnce) {
  TestServer server(testing::fast_options(/*keep=*/2));
  for (int64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(upload(server.stub(), random_bf16_set(v, 300 + v), v1::WEIGHT_FORMAT_BF16).ok());
  }
  const v1::WeightSyncStatus status = server.status();
  EXPECT_EQ(status.latest_version(), 3);
  EXPECT_EQ(std::vector<int64_t>(status.stored_versions().begin(), status.stored_versions().end()),
            (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(metric(server.registry().render(), "fp8rl_weight_sync_version_bytes{format=\"bf16\"}"),
            static_cast<double>(random_bf16_set(3, 303).nbytes()));

  Received late;
  auto sub = subscribe(server, "gen-late", late);
  ASSERT_TRUE(sub->wait_for_version(3, 10s));
  expect_same_set(random_bf16_set(3, 303), late.last());

  // A worker that already holds the latest gets nothing until a newer version arrives.
  Received current;
  auto up_to_date = subscribe(server, "gen-current", current, /*held=*/3);
  wait_subscribed(server, 2);
  std::this_thread::sleep_for(150ms);
  EXPECT_TRUE(current.versions().empty());
  ASSERT_TRUE(upload(server.stub(), random_bf16_set(4, 304), v1::WEIGHT_FORMAT_BF16).ok());
  ASSERT_TRUE(up_to_date->wait_for_version(4, 10s));
  ASSERT_TRUE(sub->wait_for_version(4, 10s));
  EXPECT_EQ(current.versions(), std::vector<int64_t>{4});
  EXPECT_EQ(late.versions(), (std::vector<int64_t>{3, 4}));
}

// A hand-made upload stream (to send what the client library never would).
grpc::Status raw_upload(v1::WeightSyncService::Stub* stub,
                        const std::vector<v1::UploadVersionRequest>& messages) {
  grpc::ClientContext context;
  v1::UploadVersionResponse response;
  auto writer = stub->UploadVersion(&context, &response);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

// Upload chunks are copied from gRPC's slices straight into the payload buffer (zero-copy
// receive) or, switched off, parsed into messages first: the same weights give the same stored
// bytes either way, and a chunk that breaks a tensor's checksum is rejected on both paths.
TEST(WeightSyncService, ZeroCopyUploadReceiveStoresTheSameBytes) {
  WeightSyncOptions options = testing::fast_options(4);
  TestServer server(options);
  UploadOptions small_chunks;
  small_chunks.chunk_bytes = 777;
  model::WeightSet set = random_fp8_set(1, 23);
  server.service().set_zero_copy_receive(false);
  ASSERT_TRUE(upload(server.stub(), set, v1::WEIGHT_FORMAT_FP8, small_chunks).ok());
  server.service().set_zero_copy_receive(true);
  set.version = 2;
  ASSERT_TRUE(upload(server.stub(), set, v1::WEIGHT_FORMAT_FP8, small_chunks).ok());
  const StoredVersionPtr copied = server.service().store().get(1);
  const StoredVersionPtr zero_copy = server.service().store().get(2);
  ASSERT_NE(copied, nullptr);
  ASSERT_NE(zero_copy, nullptr);
  EXPECT_GT(zero_copy->payload.size(), 10 * small_chunks.chunk_bytes);
  EXPECT_TRUE(zero_copy->payload == copied->payload);

  for (bool on : {false, true}) {
    server.service().set_zero_copy_receive(on);
    const int64_t version = on ? 4 : 3;
    auto m = stream_messages<v1::UploadVersionRequest>(random_fp8_set(version, 31),
                                                       v1::WEIGHT_FORMAT_FP8);
    ASSERT_GE(m.size(), 3u);
    (*m[2].mutable_chunk()->mutable_data())[100] ^= 0x01;
    const grpc::Status s = raw_upload(server.stub(), m);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << on << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("crc32c mismatch"), std::string::npos) << s.error_message();
    EXPECT_EQ(server.service().store().get(version), nullptr);
  }
}

TEST(WeightSyncService, CorruptOrIncompleteUploadsAreRejectedAndNeverServed) {
  TestServer server;
  Received received;
  auto sub = subscribe(server, "gen-0", received);
  wait_subscribed(server, 1);
  ASSERT_TRUE(upload(server.stub(), random_fp8_set(5, 500), v1::WEIGHT_FORMAT_FP8).ok());
  ASSERT_TRUE(sub->wait_for_version(5, 10s));

  const model::WeightSet next = random_fp8_set(6, 600);
  const std::vector<v1::UploadVersionRequest> good =
      stream_messages<v1::UploadVersionRequest>(next, v1::WEIGHT_FORMAT_FP8);
  ASSERT_GE(good.size(), 6u);
  struct Case {
    std::string what;
    std::vector<v1::UploadVersionRequest> messages;
    grpc::StatusCode code;
    std::string expect;
  };
  std::vector<Case> cases;
  {
    auto m = good;
    (*m[3].mutable_chunk()->mutable_data())[12345] ^= 0x01;
    cases.push_back({"corrupt byte", m, grpc::StatusCode::DATA_LOSS, "crc32c mismatch"});
  }
  {
    auto m = good;
    m[0].mutable_manifest()->mutable_tensors(0)->set_crc32c(good[0].manifest().tensors(0).crc32c() +
                                                            1);
    cases.push_back({"wrong checksum", m, grpc::StatusCode::DATA_LOSS,
                     "tensor model.embed_tokens.weight: crc32c mismatch"});
  }
  {
    auto m = good;
    m.erase(m.begin() + 2);
    cases.push_back({"gap", m, grpc::StatusCode::INVALID_ARGUMENT, "chunk.offset: gap"});
  }
  {
    auto m = good;
    m.insert(m.begin() + 3, m[2]);
    cases.push_back({"overlap", m, grpc::StatusCode::INVALID_ARGUMENT, "chunk.offset: overlap"});
  }
  {
    auto m = good;
    m.pop_back();
    cases.push_back({"short", m, grpc::StatusCode::DATA_LOSS, "incomplete payload for version 6"});
  }
  {
    auto m = good;
    v1::UploadVersionRequest extra;
    extra.mutable_chunk()->set_version(6);
    extra.mutable_chunk()->set_offset(good[0].manifest().total_bytes());
    extra.mutable_chunk()->set_data("tail");
    m.push_back(extra);
    cases.push_back({"beyond total", m, grpc::StatusCode::INVALID_ARGUMENT, "runs past"});
  }
  for (int64_t stale : {5, 4}) {
    auto m = stream_messages<v1::UploadVersionRequest>(random_fp8_set(stale, 700 + stale),
                                                       v1::WEIGHT_FORMAT_FP8);
    cases.push_back({"stale version", m, grpc::StatusCode::INVALID_ARGUMENT,
                     "is not newer than the latest stored version 5"});
  }
  {
    auto m = good;
    m[0].mutable_manifest()->mutable_tensors(1)->set_name("model.embed_tokens.weight");
    cases.push_back({"duplicate names", m, grpc::StatusCode::INVALID_ARGUMENT, "duplicate"});
  }
  {
    auto m = good;
    m[0].mutable_manifest()->set_total_bytes(good[0].manifest().total_bytes() + 7);
    cases.push_back(
        {"total mismatch", m, grpc::StatusCode::INVALID_ARGUMENT, "manifest.total_bytes"});
  }
  {
    std::vector<v1::UploadVersionRequest> m(good.begin() + 1, good.end());
    cases.push_back({"no manifest", m, grpc::StatusCode::INVALID_ARGUMENT,
                     "first upload message must be a manifest"});
  }
  {
    auto m = good;
    m.insert(m.begin() + 2, good[0]);
    cases.push_back({"two manifests", m, grpc::StatusCode::INVALID_ARGUMENT, "second manifest"});
  }
  cases.push_back({"empty stream", {}, grpc::StatusCode::INVALID_ARGUMENT, "no manifest"});

  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const grpc::Status s = raw_upload(server.stub(), c.messages);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_NE(s.error_message().find(c.expect), std::string::npos) << s.error_message();
  }
  const v1::WeightSyncStatus status = server.status();
  EXPECT_EQ(status.latest_version(), 5);
  EXPECT_EQ(std::vector<int64_t>(status.stored_versions().begin(), status.stored_versions().end()),
            std::vector<int64_t>{5});
  EXPECT_EQ(status.rejected_uploads(), cases.size());
  const std::string text = server.registry().render();
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_uploads_total{result=\"rejected\"}"),
            static_cast<double>(cases.size()));
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_uploads_total{result=\"accepted\"}"), 1);

  // Nothing rejected reached the subscriber; the intact upload of the same version still works.
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(received.versions(), std::vector<int64_t>{5});
  ASSERT_TRUE(raw_upload(server.stub(), good).ok());
  ASSERT_TRUE(sub->wait_for_version(6, 10s));
  expect_same_set(next, received.last());
}

// Cut-through: a full version goes out to subscribers while its upload is still arriving, yet a
// worker completes it only once it is stored. An upload refused after part of it was pushed
// (corrupt chunk) or after all of its bytes were (a message beyond the end) never completes on the
// worker, and the intact upload of the same version that follows arrives whole.
TEST(WeightSyncService, CutThroughPushesAVersionWhileItsUploadArrives) {
  WeightSyncOptions options = testing::fast_options(2);
  options.chunk_bytes = 256 << 10;  // relayed in quarters of the upload's 1 MiB chunks
  options.deltas = false;           // full versions only: a delta waits for the whole version
  TestServer server(options);
  Received received;
  auto sub = subscribe(server, "gen-0", received);
  wait_subscribed(server, 1);
  auto sent = [&] {
    return metric(server.registry().render(), "fp8rl_weight_sync_sent_bytes_total");
  };
  const model::WeightSet set = random_fp8_set(1, 41);
  const std::vector<v1::UploadVersionRequest> messages =
      stream_messages<v1::UploadVersionRequest>(set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_GE(messages.size(), 5u);
  const double total = static_cast<double>(messages[0].manifest().total_bytes());
  {
    grpc::ClientContext context;
    v1::UploadVersionResponse response;
    auto writer = server.stub()->UploadVersion(&context, &response);
    // The manifest and half of the chunks: the service pushes what it has.
    const size_t half = messages.size() / 2;
    for (size_t i = 0; i <= half; ++i) ASSERT_TRUE(writer->Write(messages[i]));
    const double expect_at_least = static_cast<double>(half - 1) * (1 << 20);
    EXPECT_TRUE(wait_until([&] { return sent() >= expect_at_least; }))
        << "sent " << sent() << " bytes before the upload ended";
    EXPECT_LT(sent(), total);
    EXPECT_EQ(server.status().latest_version(), 0);
    EXPECT_TRUE(received.versions().empty());
    for (size_t i = half + 1; i < messages.size(); ++i) ASSERT_TRUE(writer->Write(messages[i]));
    ASSERT_TRUE(writer->WritesDone());
    const grpc::Status status = writer->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_TRUE(sub->wait_for_version(1, 10s));
  expect_same_set(set, received.last());
  EXPECT_EQ(sent(), total);

  // Version 2 refused part-way (a flipped byte in chunk 3) and after its last byte (an extra
  // message beyond the end): the worker gets neither; then the intact version 2 arrives whole.
  const model::WeightSet next = random_fp8_set(2, 42);
  const std::vector<v1::UploadVersionRequest> good =
      stream_messages<v1::UploadVersionRequest>(next, v1::WEIGHT_FORMAT_FP8);
  std::vector<v1::UploadVersionRequest> corrupt = good;
  (*corrupt[3].mutable_chunk()->mutable_data())[4321] ^= 0x10;
  std::vector<v1::UploadVersionRequest> beyond = good;
  v1::UploadVersionRequest extra;
  extra.mutable_chunk()->set_version(2);
  extra.mutable_chunk()->set_offset(good[0].manifest().total_bytes());
  extra.mutable_chunk()->set_data("tail");
  beyond.push_back(extra);
  const double before = sent();
  EXPECT_EQ(raw_upload(server.stub(), corrupt).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(raw_upload(server.stub(), beyond).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  std::this_thread::sleep_for(200ms);
  EXPECT_GT(sent(), before) << "nothing of the refused uploads was pushed while they arrived";
  EXPECT_EQ(received.versions(), std::vector<int64_t>{1});
  EXPECT_EQ(server.status().latest_version(), 1);
  ASSERT_TRUE(raw_upload(server.stub(), good).ok());
  ASSERT_TRUE(sub->wait_for_version(2, 10s));
  EXPECT_EQ(received.versions(), (std::vector<int64_t>{1, 2}));
  expect_same_set(next, received.last());
  ASSERT_TRUE(wait_until([&] {
    const v1::WeightSyncStatus status = server.status();
    const v1::WorkerVersion* w = find_worker(status, "gen-0");
    return w != nullptr && w->version() == 2;
  }));
}

TEST(WeightSyncService, AcksAreValidatedAndTracked) {
  TestServer server;
  ASSERT_TRUE(upload(server.stub(), random_bf16_set(1, 900), v1::WEIGHT_FORMAT_BF16).ok());
  ASSERT_TRUE(upload(server.stub(), random_bf16_set(2, 901), v1::WEIGHT_FORMAT_BF16).ok());
  auto ack = [&](const std::string& worker, int64_t version, bool ok, const std::string& error) {
    grpc::ClientContext context;
    v1::AckRequest request;
    request.set_worker_id(worker);
    request.set_version(version);
    request.set_ok(ok);
    request.set_error(error);
    v1::AckResponse response;
    return server.stub()->Ack(&context, request, &response);
  };
  EXPECT_TRUE(ack("gen-a", 2, true, "").ok());
  EXPECT_TRUE(ack("gen-b", 1, true, "").ok());
  EXPECT_TRUE(ack("gen-b", 2, false, "tensor x: crc32c mismatch").ok());
  grpc::Status s = ack("gen-a", 9, true, "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("version: 9 was never published (latest is 2)"),
            std::string::npos)
      << s.error_message();
  s = ack("", 1, true, "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("worker_id: empty"), std::string::npos);

  const v1::WeightSyncStatus status = server.status();
  ASSERT_EQ(status.workers_size(), 2);
  EXPECT_EQ(find_worker(status, "gen-a")->version(), 2);
  EXPECT_EQ(find_worker(status, "gen-b")->version(), 1);  // the rejection did not move it
  EXPECT_FALSE(find_worker(status, "gen-a")->subscribed());
  const std::string text = server.registry().render();
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_worker_version{worker=\"gen-a\"}"), 2);
  EXPECT_EQ(metric(text, "fp8rl_weight_sync_worker_version{worker=\"gen-b\"}"), 1);

  // Subscribe argument checks.
  grpc::ClientContext context;
  v1::SubscribeRequest request;
  request.set_held_version(0);
  auto reader = server.stub()->Subscribe(&context, request);
  v1::SubscribeResponse response;
  EXPECT_FALSE(reader->Read(&response));
  s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("worker_id: empty"), std::string::npos);
}

// The names the weight-sync section of docs/metrics.md lists.
std::set<std::string> documented_names() {
  const char* root = std::getenv("FP8RL_SOURCE_DIR");
  std::ifstream in(std::string(root ? root : ".") + "/docs/metrics.md");
  EXPECT_TRUE(in.good()) << "docs/metrics.md not found (FP8RL_SOURCE_DIR)";
  std::set<std::string> names;
  std::string line;
  bool in_section = false;
  const std::regex row(R"(^\| (fp8rl_[a-z0-9_]+) \|)");
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line.find("Weight sync") != std::string::npos;
    std::smatch m;
    if (in_section && std::regex_search(line, m, row)) names.insert(m[1]);
  }
  return names;
}

TEST(WeightSyncService, MetricsAreExactlyTheDocumentedNamesAndPassPromtool) {
  TestServer server;
  ASSERT_TRUE(upload(server.stub(), random_bf16_set(1, 1000), v1::WEIGHT_FORMAT_BF16).ok());
  const std::string text = server.registry().render();
  const std::set<std::string> documented = documented_names();
  ASSERT_EQ(documented.size(), 15u);
  std::set<std::string> exported;
  const std::regex type_line(R"(^# TYPE (fp8rl_weight_sync_[a-z0-9_]+) )");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, type_line)) exported.insert(m[1]);
  }
  // prometheus-cpp writes a labelled family once it has a series: worker_version appears with
  // the first worker's ack, which this test has none of.
  std::set<std::string> expected = documented;
  expected.erase("fp8rl_weight_sync_worker_version");
  EXPECT_EQ(exported, expected);
  EXPECT_NE(text.find("fp8rl_build_info{service=\"weight-sync\"} 1"), std::string::npos);
  EXPECT_NE(text.find("# TYPE fp8rl_process_start_time_seconds gauge"), std::string::npos);
  EXPECT_NE(text.find("# TYPE fp8rl_weight_sync_push_seconds histogram"), std::string::npos);

  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed";
  }
  const std::string path = ::testing::TempDir() + "/weight_sync_metrics.txt";
  std::ofstream(path) << text;
  EXPECT_EQ(std::system(("promtool check metrics < " + path + " >/dev/null 2>&1").c_str()), 0)
      << text;
}

TEST(WeightSyncService, ShutdownEndsOpenStreamsPromptly) {
  TestServer server;
  Received r0, r1;
  auto s0 = subscribe(server, "gen-0", r0);
  auto s1 = subscribe(server, "gen-1", r1);
  wait_subscribed(server, 2);
  const auto t0 = std::chrono::steady_clock::now();
  server.stop(/*grace=*/10s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  // New uploads are refused once shutdown began (the server is gone: UNAVAILABLE).
  const auto up = upload(server.channel(), random_bf16_set(1, 1), v1::WEIGHT_FORMAT_BF16,
                         UploadOptions{.chunk_bytes = kDefaultChunkBytes, .timeout = 2s});
  EXPECT_FALSE(up.ok());
  s0->stop();
  s1->stop();
}

}  // namespace
}  // namespace fp8rl::weight_sync
