// Parallel upload: one version in N parts on N concurrent UploadVersion streams
// (docs/design/weight-sync-fanout.md "Parallel upload from N trainer ranks"). The part format
// (part_range, plan_parts, manifest_difference), one part's assembly, the ready ranges of an
// arriving version, and the service over real gRPC on loopback: N = 1, 2, 3, 5 parts of odd
// sizes arrive bit-exact, in any order, pushed cut-through while parts still arrive, and every
// malformed case fails the version with a named error and stores nothing; the trainer's publisher
// uploads on several streams.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/service/crc32c.h"
#include "services/trainer_worker/weight_publisher.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/payload.h"
#include "services/weight_sync/version_store.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using namespace std::chrono_literals;
using testing::add_fp8_linear;
using testing::expect_same_set;
using testing::random_bf16;
using testing::random_f32;
using testing::TestServer;
using testing::wait_until;

// ~0.9 MB of tensors with odd sizes (no size a multiple of a chunk), 13 non-empty tensors.
model::WeightSet odd_set(int64_t version, uint32_t seed) {
  std::mt19937 rng(seed);
  model::WeightSet set;
  set.version = version;
  set.config_json =
      R"({"model_type": "llama", "hidden_size": 300, "quantization_config": {"quant_method": )"
      R"("fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}})";
  set.tensors.push_back(
      {"model.embed_tokens.weight", DType::kBF16, {517, 129}, random_bf16(517 * 129, rng)});
  add_fp8_linear(set, "model.layers.0.self_attn.q_proj.weight", 1000, 300, rng);
  set.tensors.push_back(
      {"model.layers.0.input_layernorm.weight", DType::kBF16, {301}, random_bf16(301, rng)});
  add_fp8_linear(set, "model.layers.0.mlp.up_proj.weight", 257, 333, rng);
  set.tensors.push_back(
      {"model.layers.0.self_attn.k_scale", DType::kF32, {}, random_f32(1, rng, 0.01f, 0.1f)});
  add_fp8_linear(set, "model.layers.0.mlp.down_proj.weight", 701, 131, rng);
  set.tensors.push_back(
      {"model.layers.1.input_layernorm.weight", DType::kBF16, {299}, random_bf16(299, rng)});
  add_fp8_linear(set, "model.layers.1.mlp.gate_proj.weight", 129, 1001, rng);
  set.tensors.push_back(
      {"model.layers.0.self_attn.v_scale", DType::kF32, {}, random_f32(1, rng, 0.01f, 0.1f)});
  return set;
}

std::string payload_of(const model::WeightSet& set) {
  std::string out;
  for (const model::NamedTensor& t : set.tensors) {
    out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return out;
}

v1::VersionManifest planned(const model::WeightSet& set, uint32_t parts) {
  v1::VersionManifest m = build_manifest(set, v1::WEIGHT_FORMAT_FP8).value();
  EXPECT_TRUE(plan_parts(&m, parts).ok());
  return m;
}

v1::VersionManifest with_index(v1::VersionManifest m, uint32_t index) {
  m.set_part_index(index);
  return m;
}

void expect_error(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(text), std::string::npos) << "wanted '" << text << "' in: " << s;
}

// ---- the part format ----

TEST(PartFormat, PlannedPartsCoverThePayloadOnceAtTensorBoundaries) {
  const model::WeightSet set = odd_set(1, 11);
  for (uint32_t parts : {1u, 2u, 3u, 5u, 13u}) {
    SCOPED_TRACE(parts);
    const v1::VersionManifest m = planned(set, parts);
    uint64_t next = 0;
    int next_tensor = 0;
    for (uint32_t p = 0; p < parts; ++p) {
      absl::StatusOr<PartRange> r = part_range(with_index(m, p));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->begin, next);
      EXPECT_EQ(r->first_tensor, next_tensor);
      EXPECT_LT(r->begin, r->end);
      EXPECT_LT(r->first_tensor, r->end_tensor);
      EXPECT_EQ(m.tensors(r->first_tensor).offset(), r->begin);
      next = r->end;
      next_tensor = r->end_tensor;
    }
    EXPECT_EQ(next, m.total_bytes());
    EXPECT_EQ(next_tensor, m.tensors_size());
    if (parts > 1) {
      // About equal bytes: no part above twice the mean plus the largest tensor.
      uint64_t largest = 0;
      for (const auto& t : m.tensors()) largest = std::max<uint64_t>(largest, t.byte_size());
      for (uint32_t p = 0; p < parts; ++p) {
        const PartRange r = part_range(with_index(m, p)).value();
        EXPECT_LE(r.end - r.begin, 2 * m.total_bytes() / parts + largest);
      }
    }
  }
  v1::VersionManifest m = build_manifest(set, v1::WEIGHT_FORMAT_FP8).value();
  expect_error(plan_parts(&m, 14), absl::StatusCode::kInvalidArgument, "parts: 14 parts");
  expect_error(plan_parts(&m, 0), absl::StatusCode::kInvalidArgument, "parts: must be in");
}

TEST(PartFormat, BadPartFieldsNameTheField) {
  const model::WeightSet set = odd_set(1, 12);
  const v1::VersionManifest good = planned(set, 3);
  struct Case {
    std::string name;
    v1::VersionManifest m;
    std::string text;
  };
  std::vector<Case> cases;
  {
    v1::VersionManifest m = with_index(good, 3);
    cases.push_back({"index out of range", m, "manifest.part_index: 3 is out of range [0, 3)"});
  }
  {
    v1::VersionManifest m = good;
    m.add_part_offsets(m.total_bytes() - 1);
    cases.push_back({"offsets count", m, "manifest.part_offsets: 4 offsets for part_count 3"});
  }
  {
    v1::VersionManifest m = good;
    m.set_part_offsets(0, m.tensors(1).offset());
    cases.push_back({"not from 0", m, "manifest.part_offsets[0]: must be 0"});
  }
  {
    v1::VersionManifest m = good;
    m.set_part_offsets(2, m.part_offsets(1));
    cases.push_back({"overlap", m, "manifest.part_offsets[2]"});
  }
  {
    v1::VersionManifest m = good;
    const uint64_t second = m.part_offsets(1);
    m.set_part_offsets(1, m.part_offsets(2));
    m.set_part_offsets(2, second);
    cases.push_back({"decreasing", m, "manifest.part_offsets[2]"});
  }
  {
    v1::VersionManifest m = good;
    m.set_upload_id(0);
    cases.push_back({"no upload id", m, "manifest.upload_id: must be non-zero"});
  }
  {
    v1::VersionManifest m = good;
    m.set_part_offsets(2, m.total_bytes());
    cases.push_back({"past the end", m, "is not below total_bytes"});
  }
  {
    v1::VersionManifest m = good;
    m.set_part_offsets(1, m.part_offsets(1) + 7);
    cases.push_back({"splits a tensor", m, "manifest.part_offsets[1]"});
  }
  {
    v1::VersionManifest m = good;
    m.set_part_count(kMaxUploadParts + 1);
    cases.push_back({"too many parts", m, "manifest.part_count: must be in [1, 256]"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_error(part_range(c.m).status(), absl::StatusCode::kInvalidArgument, c.text);
  }
  // A split names the tensor it would cut.
  v1::VersionManifest split = good;
  split.set_part_offsets(1, split.part_offsets(1) + 7);
  EXPECT_NE(part_range(split).status().message().find("splits manifest.tensors["),
            std::string::npos);
}

TEST(PartFormat, ManifestDifferenceNamesTheFieldAndIgnoresThePartIndex) {
  const v1::VersionManifest a = planned(odd_set(4, 13), 3);
  EXPECT_EQ(manifest_difference(a, with_index(a, 2)), "");
  v1::VersionManifest b = a;
  b.mutable_tensors(4)->set_crc32c(a.tensors(4).crc32c() ^ 1);
  EXPECT_EQ(manifest_difference(a, b), "tensors[4].crc32c");
  b = a;
  b.set_model_config_json("{}");
  EXPECT_EQ(manifest_difference(a, b), "model_config_json");
  b = a;
  b.set_part_offsets(1, a.part_offsets(2));
  EXPECT_EQ(manifest_difference(a, b), "part_offsets[1]");
  b = a;
  b.mutable_tensors(0)->set_name("other");
  EXPECT_EQ(manifest_difference(a, b), "tensors[0].name");
  b = a;
  b.set_version(5);
  EXPECT_EQ(manifest_difference(a, b), "version");
  b = a;
  b.set_upload_id(a.upload_id() + 1);
  EXPECT_EQ(manifest_difference(a, b), "upload_id");
}

// One part's chunks land in the shared buffer at their payload offsets; its tensors are checked;
// chunks outside the part are refused.
TEST(PartFormat, AssemblerReceivesOnePartIntoTheSharedBuffer) {
  const model::WeightSet set = odd_set(2, 14);
  const std::string payload = payload_of(set);
  const v1::VersionManifest m = planned(set, 3);
  std::string buffer(payload.size(), '\0');
  for (uint32_t p = 0; p < 3; ++p) {
    const PartRange r = part_range(with_index(m, p)).value();
    PayloadAssembler a;
    ASSERT_TRUE(a.begin_part_into(with_index(m, p), std::span<char>(buffer), r).ok());
    for (uint64_t at = r.begin; at < r.end; at += 4099) {
      v1::WeightChunk c;
      c.set_version(2);
      c.set_offset(at);
      c.set_data(payload.substr(at, std::min<uint64_t>(4099, r.end - at)));
      ASSERT_TRUE(a.add(c).ok()) << "part " << p << " at " << at;
    }
    EXPECT_TRUE(a.complete());
    ASSERT_TRUE(a.finish().ok());
  }
  EXPECT_TRUE(buffer == payload);

  const PartRange r1 = part_range(with_index(m, 1)).value();
  PayloadAssembler a;
  // A chunk that starts before the part, one after its start, one running past its end.
  ASSERT_TRUE(a.begin_part_into(with_index(m, 1), std::span<char>(buffer), r1).ok());
  v1::WeightChunk c;
  c.set_version(2);
  c.set_offset(0);
  c.set_data(payload.substr(0, 10));
  expect_error(a.add(c), absl::StatusCode::kInvalidArgument, "chunk.offset: overlap");
  ASSERT_TRUE(a.begin_part_into(with_index(m, 1), std::span<char>(buffer), r1).ok());
  c.set_offset(r1.begin + 1);
  expect_error(a.add(c), absl::StatusCode::kInvalidArgument, "chunk.offset: gap");
  ASSERT_TRUE(a.begin_part_into(with_index(m, 1), std::span<char>(buffer), r1).ok());
  c.set_offset(r1.begin);
  c.set_data(payload.substr(r1.begin, r1.end - r1.begin + 1));
  expect_error(a.add(c), absl::StatusCode::kInvalidArgument, "runs past the part's end");
  // A flipped byte in the part's first tensor fails its CRC when its last byte lands.
  ASSERT_TRUE(a.begin_part_into(with_index(m, 1), std::span<char>(buffer), r1).ok());
  std::string bad = payload.substr(r1.begin, r1.end - r1.begin);
  bad[3] ^= 0x20;
  c.set_data(bad);
  expect_error(a.add(c), absl::StatusCode::kDataLoss,
               absl::StrCat("tensor ", m.tensors(r1.first_tensor).name(), ": crc32c mismatch"));
  // Short: finish() names the part.
  ASSERT_TRUE(a.begin_part_into(with_index(m, 1), std::span<char>(buffer), r1).ok());
  c.set_data(payload.substr(r1.begin, 10));
  ASSERT_TRUE(a.add(c).ok());
  expect_error(a.finish().status(), absl::StatusCode::kDataLoss, "received 10 of");
}

TEST(ArrivingVersionRanges, ReadersSeeTheLowestMissingRange) {
  auto v = std::make_shared<StoredVersion>();
  v->payload.assign(1000, 'x');
  ArrivingVersion a(v, v->payload.data());
  uint64_t ready = 0;
  a.add_ready(600, 800);
  a.wait(1, 1ms, &ready);
  EXPECT_EQ(ready, 0u);
  a.add_ready(200, 400);
  a.add_ready(400, 500);  // touches [200, 400)
  a.wait(1, 1ms, &ready);
  EXPECT_EQ(ready, 0u);
  a.add_ready(0, 150);
  a.wait(1, 1ms, &ready);
  EXPECT_EQ(ready, 150u);
  a.add_ready(150, 200);  // joins [200, 500)
  a.wait(1, 1ms, &ready);
  EXPECT_EQ(ready, 500u);
  a.add_ready(800, 1000);
  a.add_ready(500, 600);  // everything: the last byte still waits for finish(true)
  a.wait(1, 1ms, &ready);
  EXPECT_EQ(ready, 999u);
  EXPECT_EQ(a.wait(1000, 1ms, &ready), ArrivingVersion::State::kArriving);
  a.finish(true);
  EXPECT_EQ(a.wait(1000, 1ms, &ready), ArrivingVersion::State::kComplete);
  EXPECT_EQ(ready, 1000u);
}

TEST(ParallelUpload, PartTimeoutMustBePositive) {
  WeightSyncOptions o;
  ASSERT_TRUE(validate_options(o).ok());
  o.part_timeout = 0ms;
  expect_error(validate_options(o), absl::StatusCode::kInvalidArgument,
               "part_timeout: must be > 0");
}

// ---- the service over loopback ----

WeightSyncOptions part_options() {
  WeightSyncOptions o = testing::fast_options();
  o.chunk_bytes = 16 << 10;  // pushes of small chunks, so cut-through is visible
  // Long enough that parts on a loaded machine (slow connects) are not missed, short enough for
  // a test that waits for it (the missing-part case sets its own).
  o.part_timeout = 5s;
  return o;
}

// Each part on its own channel (its own TCP connection).
std::vector<std::shared_ptr<grpc::ChannelInterface>> part_channels(const TestServer& server,
                                                                   int n) {
  std::vector<std::shared_ptr<grpc::ChannelInterface>> out;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    out.push_back(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
  }
  return out;
}

// The bytes a plain Subscribe stream receives for the next version, checked per tensor.
model::WeightSet subscribe_once(TestServer& server, const std::string& worker) {
  grpc::ClientContext context;
  v1::SubscribeRequest request;
  request.set_worker_id(worker);
  auto reader = server.stub()->Subscribe(&context, request);
  v1::SubscribeResponse response;
  PayloadAssembler assembler;
  model::WeightSet out;
  if (!reader->Read(&response) || !response.has_manifest()) {
    ADD_FAILURE() << "no manifest";
    return out;
  }
  EXPECT_EQ(response.manifest().part_count(), 0u);  // pushed as a single-part version
  EXPECT_EQ(response.manifest().part_offsets_size(), 0);
  EXPECT_TRUE(assembler.begin(response.manifest()).ok());
  while (!assembler.complete() && reader->Read(&response)) {
    const absl::Status s = assembler.add(response.chunk());  // CRC-32C per tensor
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
  }
  context.TryCancel();
  reader->Finish();
  absl::StatusOr<AssembledVersion> done = assembler.finish();
  EXPECT_TRUE(done.ok()) << done.status();
  if (done.ok()) out = to_weight_set(done->manifest, done->payload).value();
  return out;
}

TEST(ParallelUpload, PartsOfOddSizesArriveBitExact) {
  TestServer server(part_options());
  int64_t version = 0;
  for (uint32_t parts : {1u, 2u, 3u, 5u}) {
    SCOPED_TRACE(parts);
    ++version;
    const model::WeightSet set = odd_set(version, 100 + parts);
    UploadOptions options;
    options.chunk_bytes = 10007;  // chunks that end inside tensors
    absl::StatusOr<v1::UploadVersionResponse> up = upload_parallel(
        part_channels(server, static_cast<int>(parts)), set, v1::WEIGHT_FORMAT_FP8, parts, options);
    ASSERT_TRUE(up.ok()) << up.status();
    EXPECT_EQ(up->version(), version);
    EXPECT_EQ(up->bytes_received(), static_cast<uint64_t>(set.nbytes()));
    const StoredVersionPtr stored = server.service().store().get(version);
    ASSERT_NE(stored, nullptr);
    EXPECT_TRUE(stored->payload == payload_of(set));
    EXPECT_EQ(stored->manifest.part_count(), 0u);
    // The stored manifest's CRCs are the ones of the whole set, recomputed here.
    for (int i = 0; i < stored->manifest.tensors_size(); ++i) {
      const auto& t = set.tensors[static_cast<size_t>(i)];
      EXPECT_EQ(stored->manifest.tensors(i).crc32c(),
                service::crc32c(t.bytes.data(), t.bytes.size(), 0));
    }
    expect_same_set(set, subscribe_once(server, absl::StrCat("w", parts)));
  }
  EXPECT_EQ(server.status().rejected_uploads(), 0u);
}

// A raw UploadVersion stream for one part, written message by message.
struct PartStream {
  grpc::ClientContext context;
  v1::UploadVersionResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadVersionRequest>> writer;
  explicit PartStream(v1::WeightSyncService::Stub* stub)
      : writer(stub->UploadVersion(&context, &response)) {}
  bool manifest(const v1::VersionManifest& m) {
    v1::UploadVersionRequest r;
    *r.mutable_manifest() = m;
    return writer->Write(r);
  }
  bool chunk(int64_t version, uint64_t offset, std::string data) {
    v1::UploadVersionRequest r;
    r.mutable_chunk()->set_version(version);
    r.mutable_chunk()->set_offset(offset);
    r.mutable_chunk()->set_data(std::move(data));
    return writer->Write(r);
  }
  grpc::Status finish() {
    writer->WritesDone();
    return writer->Finish();
  }
};

// Chunks of one part's range, in order.
std::vector<std::pair<uint64_t, std::string>> part_chunks(const std::string& payload,
                                                          const PartRange& r, uint64_t size) {
  std::vector<std::pair<uint64_t, std::string>> out;
  for (uint64_t at = r.begin; at < r.end; at += size) {
    out.emplace_back(at, payload.substr(at, std::min(size, r.end - at)));
  }
  return out;
}

TEST(ParallelUpload, PartsArrivingOutOfOrderAndInterleavedAssemble) {
  TestServer server(part_options());
  const model::WeightSet set = odd_set(7, 21);
  const std::string payload = payload_of(set);
  const uint32_t parts = 5;
  const v1::VersionManifest m = planned(set, parts);
  std::vector<std::unique_ptr<PartStream>> streams;
  std::vector<std::vector<std::pair<uint64_t, std::string>>> chunks;
  auto channels = part_channels(server, parts);
  std::vector<std::unique_ptr<v1::WeightSyncService::Stub>> stubs;
  // Manifests in reverse part order; then one chunk of each part in turn, last part first.
  for (int p = parts - 1; p >= 0; --p) {
    stubs.push_back(v1::WeightSyncService::NewStub(channels[static_cast<size_t>(p)]));
    streams.push_back(std::make_unique<PartStream>(stubs.back().get()));
    ASSERT_TRUE(streams.back()->manifest(with_index(m, static_cast<uint32_t>(p))));
    chunks.push_back(
        part_chunks(payload, part_range(with_index(m, static_cast<uint32_t>(p))).value(), 3001));
  }
  for (size_t round = 0;; ++round) {
    bool any = false;
    for (size_t s = 0; s < streams.size(); ++s) {
      if (round < chunks[s].size()) {
        any = true;
        ASSERT_TRUE(streams[s]->chunk(7, chunks[s][round].first, chunks[s][round].second));
      }
    }
    if (!any) break;
  }
  EXPECT_EQ(server.status().latest_version(), 0);  // no part has ended yet
  // End the parts in a shuffled order, each on its own thread (an ended part waits for the rest).
  std::vector<std::thread> enders;
  std::vector<grpc::Status> results(parts);
  for (size_t s : {2u, 0u, 4u, 1u, 3u}) {
    enders.emplace_back([&, s] { results[s] = streams[s]->finish(); });
    std::this_thread::sleep_for(5ms);
  }
  for (auto& t : enders) t.join();
  for (size_t s = 0; s < parts; ++s) EXPECT_TRUE(results[s].ok()) << results[s].error_message();
  const StoredVersionPtr stored = server.service().store().get(7);
  ASSERT_NE(stored, nullptr);
  EXPECT_TRUE(stored->payload == payload);
  expect_same_set(set, subscribe_once(server, "w"));
}

// A subscriber receives the version while parts still arrive: it gets every chunk below the
// lowest part that has not landed, before the last part has sent anything past its manifest; it
// completes the version only once it is stored.
TEST(ParallelUpload, SubscribersReceiveCutThroughWhilePartsArrive) {
  TestServer server(part_options());
  const model::WeightSet set = odd_set(3, 31);
  const std::string payload = payload_of(set);
  const v1::VersionManifest m = planned(set, 3);
  const PartRange r0 = part_range(with_index(m, 0)).value();
  const PartRange r2 = part_range(with_index(m, 2)).value();

  grpc::ClientContext sub_context;
  v1::SubscribeRequest request;
  request.set_worker_id("cut-through");
  auto reader = server.stub()->Subscribe(&sub_context, request);
  ASSERT_TRUE(wait_until([&] { return server.service().workers().subscribed_workers() == 1; }));

  auto channels = part_channels(server, 3);
  std::vector<std::unique_ptr<v1::WeightSyncService::Stub>> stubs;
  std::vector<std::unique_ptr<PartStream>> streams;
  for (uint32_t p = 0; p < 3; ++p) {
    stubs.push_back(v1::WeightSyncService::NewStub(channels[p]));
    streams.push_back(std::make_unique<PartStream>(stubs.back().get()));
    ASSERT_TRUE(streams.back()->manifest(with_index(m, p)));
  }
  // Parts 2 then 0 send all their bytes; part 1 sends nothing yet.
  for (uint32_t p : {2u, 0u}) {
    for (auto& [at, data] : part_chunks(payload, part_range(with_index(m, p)).value(), 5000)) {
      ASSERT_TRUE(streams[p]->chunk(3, at, data));
    }
  }
  // The subscriber gets the manifest and part 0's bytes (whole push chunks below r0.end).
  v1::SubscribeResponse response;
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_TRUE(response.has_manifest());
  EXPECT_EQ(response.manifest().version(), 3);
  std::string got;
  const uint64_t push_chunk = 16 << 10;
  const uint64_t expect_before = r0.end / push_chunk * push_chunk;
  while (got.size() < expect_before) {
    ASSERT_TRUE(reader->Read(&response));
    ASSERT_TRUE(response.has_chunk());
    ASSERT_EQ(response.chunk().offset(), got.size());
    got += response.chunk().data();
  }
  EXPECT_EQ(server.status().latest_version(), 0);  // not stored: part 1 is missing
  EXPECT_EQ(server.status().arriving_version(), 3);
  // Part 1 arrives; every part ends; the rest follows, the last byte once stored.
  for (auto& [at, data] : part_chunks(payload, part_range(with_index(m, 1)).value(), 5000)) {
    ASSERT_TRUE(streams[1]->chunk(3, at, data));
  }
  std::vector<std::thread> enders;
  for (uint32_t p = 0; p < 3; ++p) {
    enders.emplace_back([&, p] { EXPECT_TRUE(streams[p]->finish().ok()); });
  }
  while (got.size() < payload.size()) {
    ASSERT_TRUE(reader->Read(&response));
    ASSERT_TRUE(response.has_chunk());
    ASSERT_EQ(response.chunk().offset(), got.size());
    got += response.chunk().data();
  }
  for (auto& t : enders) t.join();
  EXPECT_TRUE(got == payload);
  EXPECT_EQ(server.status().latest_version(), 3);
  EXPECT_GT(r2.begin, r0.end);
  sub_context.TryCancel();
  reader->Finish();
}

// Uploads parts `send` of a version as one attempt (`upload_id`) with manifests from
// `manifest_for`, each part's chunks from `chunks_for`; returns each part's status.
std::vector<grpc::Status> upload_some(
    TestServer& server, const std::vector<uint32_t>& send,
    const std::function<v1::VersionManifest(uint32_t)>& manifest_for,
    const std::function<std::vector<std::pair<uint64_t, std::string>>(uint32_t)>& chunks_for,
    int64_t version, uint64_t upload_id) {
  auto channels = part_channels(server, static_cast<int>(send.size()));
  std::vector<grpc::Status> results(send.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < send.size(); ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::WeightSyncService::NewStub(channels[i]);
      PartStream s(stub.get());
      v1::VersionManifest manifest = manifest_for(send[i]);
      manifest.set_upload_id(upload_id);
      if (s.manifest(manifest)) {
        for (auto& [at, data] : chunks_for(send[i])) {
          if (!s.chunk(version, at, data)) break;
        }
      }
      results[i] = s.finish();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

void expect_status(const grpc::Status& s, grpc::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(text), std::string::npos)
      << "wanted '" << text << "' in: " << s.error_message();
}

TEST(ParallelUpload, MalformedPartsFailTheVersionWithANamedErrorAndStoreNothing) {
  TestServer server(part_options());
  const model::WeightSet set = odd_set(9, 41);
  const std::string payload = payload_of(set);
  const v1::VersionManifest m = planned(set, 3);
  auto good_manifest = [&](uint32_t p) { return with_index(m, p); };
  auto good_chunks = [&](uint32_t p) {
    return part_chunks(payload, part_range(with_index(m, p)).value(), 7001);
  };
  // Part 1's manifest differs from the others (one tensor's CRC).
  {
    SCOPED_TRACE("manifest differs");
    // Part 0 begins first, so part 1 is the one that differs.
    auto results = upload_some(
        server, {0, 1, 2},
        [&](uint32_t p) {
          if (p != 1) return good_manifest(p);
          std::this_thread::sleep_for(50ms);
          v1::VersionManifest bad = with_index(m, 1);
          bad.mutable_tensors(5)->set_crc32c(bad.tensors(5).crc32c() ^ 4);
          return bad;
        },
        good_chunks, 9, 100);
    expect_status(results[1], grpc::StatusCode::INVALID_ARGUMENT, "manifest.tensors[5].crc32c");
    expect_status(results[0], grpc::StatusCode::ABORTED, "part 1 of 3: manifest.tensors[5]");
    EXPECT_EQ(server.status().latest_version(), 0);
  }
  // A part index beyond part_count.
  {
    SCOPED_TRACE("index out of range");
    auto results = upload_some(
        server, {3}, [&](uint32_t p) { return with_index(m, p); },
        [](uint32_t) { return std::vector<std::pair<uint64_t, std::string>>{}; }, 9, 200);
    expect_status(results[0], grpc::StatusCode::INVALID_ARGUMENT,
                  "manifest.part_index: 3 is out of range [0, 3)");
  }
  // Overlapping offsets.
  {
    SCOPED_TRACE("overlapping offsets");
    v1::VersionManifest bad = m;
    bad.set_part_offsets(2, bad.part_offsets(1));
    auto results = upload_some(
        server, {0}, [&](uint32_t) { return bad; }, good_chunks, 9, 300);
    expect_status(results[0], grpc::StatusCode::INVALID_ARGUMENT, "manifest.part_offsets[2]");
  }
  // A chunk outside its part (part 2 sends a chunk of part 1's range).
  {
    SCOPED_TRACE("chunk outside its part");
    auto results = upload_some(
        server, {0, 1, 2}, good_manifest,
        [&](uint32_t p) {
          if (p != 2) return good_chunks(p);
          return good_chunks(1);
        },
        9, 400);
    expect_status(results[2], grpc::StatusCode::INVALID_ARGUMENT, "chunk.offset: overlap");
    EXPECT_EQ(server.status().latest_version(), 0);
  }
  // A corrupt byte in part 2: DATA_LOSS there, the others ABORTED.
  {
    SCOPED_TRACE("corrupt part");
    auto results = upload_some(
        server, {0, 1, 2}, good_manifest,
        [&](uint32_t p) {
          auto c = good_chunks(p);
          if (p == 2) c.back().second[0] ^= 1;
          return c;
        },
        9, 500);
    expect_status(results[2], grpc::StatusCode::DATA_LOSS, "crc32c mismatch");
    EXPECT_EQ(server.status().latest_version(), 0);
    for (size_t i : {0u, 1u}) {
      if (!results[i].ok()) expect_status(results[i], grpc::StatusCode::ABORTED, "part 2 of 3");
      EXPECT_FALSE(results[i].ok());
    }
    // A part of that attempt arriving late is refused, as is one of an earlier attempt.
    for (uint64_t id : {500u, 450u}) {
      results = upload_some(server, {1}, good_manifest, good_chunks, 9, id);
      expect_status(results[0], grpc::StatusCode::ABORTED, "is a stale attempt");
    }
    EXPECT_EQ(server.status().latest_version(), 0);
  }
  // The same part twice.
  {
    SCOPED_TRACE("duplicate part");
    auto results = upload_some(
        server, {0, 0}, good_manifest,
        [&](uint32_t p) {
          std::this_thread::sleep_for(30ms);
          return good_chunks(p);
        },
        9, 600);
    const bool first_failed =
        !results[0].ok() && results[0].error_code() == grpc::StatusCode::INVALID_ARGUMENT;
    expect_status(results[first_failed ? 0 : 1], grpc::StatusCode::INVALID_ARGUMENT,
                  "manifest.part_index: part 0 of version 9 was already uploaded");
    EXPECT_EQ(server.status().latest_version(), 0);
  }
  // A part that never comes: the others fail at the part deadline.
  {
    SCOPED_TRACE("missing part");
    WeightSyncOptions o = part_options();
    o.part_timeout = 400ms;
    TestServer quick(o);
    const auto start = std::chrono::steady_clock::now();
    auto results = upload_some(quick, {0, 2}, good_manifest, good_chunks, 9, 700);
    for (const grpc::Status& s : results) {
      expect_status(s, grpc::StatusCode::DEADLINE_EXCEEDED, "part(s) 1 of 3 did not begin");
    }
    EXPECT_GE(std::chrono::steady_clock::now() - start, 400ms);
    EXPECT_EQ(quick.status().latest_version(), 0);
    EXPECT_EQ(quick.status().arriving_version(), 0);
  }
  // After all that, the same version in full parts is accepted and bit-exact.
  auto results = upload_some(server, {1, 2, 0}, good_manifest, good_chunks, 9, 800);
  for (const grpc::Status& s : results) EXPECT_TRUE(s.ok()) << s.error_message();
  const StoredVersionPtr stored = server.service().store().get(9);
  ASSERT_NE(stored, nullptr);
  EXPECT_TRUE(stored->payload == payload);
}

// A part of a later attempt (larger upload_id) ends the attempt in progress; the later attempt's
// version is stored bit-exact.
TEST(ParallelUpload, ALaterAttemptSupersedesTheOneInProgress) {
  TestServer server(part_options());
  const model::WeightSet set = odd_set(8, 81);
  const std::string payload = payload_of(set);
  v1::VersionManifest m = planned(set, 2);
  auto channels = part_channels(server, 1);
  auto stub = v1::WeightSyncService::NewStub(channels[0]);
  // Attempt 10: part 0 begins and sends one chunk, then waits.
  PartStream early(stub.get());
  m.set_upload_id(10);
  ASSERT_TRUE(early.manifest(with_index(m, 0)));
  ASSERT_TRUE(early.chunk(8, 0, payload.substr(0, 1000)));
  ASSERT_TRUE(wait_until([&] { return server.status().arriving_version() == 8; }));
  // Attempt 20, both parts.
  auto results = upload_some(
      server, {0, 1}, [&](uint32_t p) { return with_index(m, p); },
      [&](uint32_t p) { return part_chunks(payload, part_range(with_index(m, p)).value(), 9000); },
      8, 20);
  for (const grpc::Status& r : results) EXPECT_TRUE(r.ok()) << r.error_message();
  expect_status(early.finish(), grpc::StatusCode::ABORTED, "superseded by upload_id 20");
  const StoredVersionPtr stored = server.service().store().get(8);
  ASSERT_NE(stored, nullptr);
  EXPECT_TRUE(stored->payload == payload);
  expect_same_set(set, subscribe_once(server, "w"));
}

// A subscriber that was pushed a version cut-through never completes it when a part fails.
TEST(ParallelUpload, AFailedVersionIsNeverCompletedBySubscribers) {
  TestServer server(part_options());
  const model::WeightSet set = odd_set(5, 51);
  const std::string payload = payload_of(set);
  const v1::VersionManifest m = planned(set, 2);
  std::atomic<int> installs{0};
  SubscriberOptions options;
  options.worker_id = "gen";
  options.initial_backoff = 20ms;
  options.max_backoff = 100ms;
  WeightSubscriber sub(server.channel(), options, [&](const model::WeightSet&) {
    installs.fetch_add(1);
    return absl::OkStatus();
  });
  ASSERT_TRUE(sub.start().ok());
  ASSERT_TRUE(wait_until([&] { return server.service().workers().subscribed_workers() == 1; }));
  auto results = upload_some(
      server, {0, 1}, [&](uint32_t p) { return with_index(m, p); },
      [&](uint32_t p) {
        auto c = part_chunks(payload, part_range(with_index(m, p)).value(), 6000);
        if (p == 1) c.pop_back();  // part 1 ends short
        return c;
      },
      5, 1);
  expect_status(results[1], grpc::StatusCode::DATA_LOSS, "incomplete payload");
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(installs.load(), 0);
  EXPECT_EQ(sub.held_version(), 0);
  // The retry lands.
  ASSERT_TRUE(upload_parallel(part_channels(server, 2), set, v1::WEIGHT_FORMAT_FP8, 2).ok());
  ASSERT_TRUE(sub.wait_for_version(5, 10s));
  EXPECT_EQ(installs.load(), 1);
}

TEST(ParallelUpload, UploadPartChecksItsTensorsBeforeSending) {
  TestServer server(part_options());
  const model::WeightSet set = odd_set(6, 61);
  const v1::VersionManifest m = with_index(planned(set, 3), 1);
  const PartRange r = part_range(m).value();
  const std::span<const model::NamedTensor> all(set.tensors);
  // The tensors of part 0 given as part 1's.
  expect_error(upload_part(server.stub(), m,
                           all.subspan(0, static_cast<size_t>(r.end_tensor - r.first_tensor)))
                   .status(),
               absl::StatusCode::kInvalidArgument, "tensors[0]: 'model.embed_tokens.weight'");
  expect_error(upload_part(server.stub(), m, all.subspan(0, 1)).status(),
               absl::StatusCode::kInvalidArgument, "tensors: 1 given but part 1 holds");
  EXPECT_EQ(server.status().rejected_uploads(), 0u);  // nothing was sent
}

// The trainer's publisher with upload_streams > 1 goes through the parallel upload: the version
// arrives bit-exact, and more streams than the version has tensors is the planner's error.
TEST(ParallelUpload, TrainerPublisherUploadsOnSeveralStreams) {
  TestServer server(part_options());
  const model::WeightSet set = odd_set(12, 71);
  auto publisher = trainer::make_grpc_weight_publisher(30s, {}, 3);
  absl::StatusOr<uint64_t> bytes = publisher->upload(server.address(), set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, static_cast<uint64_t>(set.nbytes()));
  const StoredVersionPtr stored = server.service().store().get(12);
  ASSERT_NE(stored, nullptr);
  EXPECT_TRUE(stored->payload == payload_of(set));
  auto too_many = trainer::make_grpc_weight_publisher(30s, {}, 14);
  expect_error(too_many->upload(server.address(), odd_set(13, 72), v1::WEIGHT_FORMAT_FP8).status(),
               absl::StatusCode::kInvalidArgument, "parts: 14 parts need 14 tensors");
}

}  // namespace
}  // namespace fp8rl::weight_sync
