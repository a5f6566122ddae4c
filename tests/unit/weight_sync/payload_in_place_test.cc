// PayloadAssembler::begin_into and to_weight_view: chunks written straight into a caller's
// buffer with the same per-tensor CRC-32C checks, and views of the verified tensors that point
// into that buffer (what a generation worker installs from without copying the payload).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "services/weight_sync/payload.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using testing::chunks_of;
using testing::random_fp8_set;

TEST(InPlace, ChunksLandInTheTargetAndViewsPointIntoIt) {
  const model::WeightSet set = random_fp8_set(4, 21);
  auto manifest = build_manifest(set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::vector<char> target(manifest->total_bytes() + 100, 'x');
  PayloadAssembler a;
  ASSERT_TRUE(a.begin_into(*manifest, target).ok());
  // An odd chunk size: chunk boundaries fall inside tensors.
  for (const auto& c : chunks_of(set, 1000003)) ASSERT_TRUE(a.add(c).ok());
  ASSERT_TRUE(a.complete());
  auto done = a.finish();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->payload.empty());  // the bytes are in the target, not copied
  EXPECT_EQ(target.back(), 'x');       // nothing written past total_bytes
  const std::span<const char> payload(target.data(), manifest->total_bytes());
  auto view = to_weight_view(done->manifest, payload);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->tensors().size(), set.tensors.size());
  for (const model::NamedTensor& t : set.tensors) {
    const model::TensorView* v = view->find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    EXPECT_TRUE(std::equal(v->bytes.begin(), v->bytes.end(), t.bytes.begin(), t.bytes.end()))
        << t.name;
    EXPECT_GE(reinterpret_cast<const char*>(v->bytes.data()), payload.data());
    EXPECT_LE(reinterpret_cast<const char*>(v->bytes.data() + v->bytes.size()),
              payload.data() + payload.size());
  }
  EXPECT_EQ(view->version, 4);
  EXPECT_EQ(view->config_json, set.config_json);
}

TEST(InPlace, CorruptionIsDataLossNamingTheTensorAsItLands) {
  const model::WeightSet set = random_fp8_set(5, 22);
  auto manifest = build_manifest(set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(manifest.ok());
  std::vector<char> target(manifest->total_bytes());
  PayloadAssembler a;
  ASSERT_TRUE(a.begin_into(*manifest, target).ok());
  auto cs = chunks_of(set, 1 << 20);
  ASSERT_GT(cs.size(), 3u);
  // Flip a byte of the embedding (tensor 0: 1.25 MiB, so its last byte is in chunk 1).
  cs[0].mutable_data()->at(12345) ^= 0x10;
  absl::Status error;
  size_t failed_at = 0;
  for (size_t i = 0; i < cs.size() && error.ok(); ++i) {
    error = a.add(cs[i]);
    failed_at = i;
  }
  EXPECT_EQ(error.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(error.message().find("model.embed_tokens.weight"), std::string::npos) << error;
  EXPECT_EQ(failed_at, 1u);  // detected when the tensor's last byte landed
  EXPECT_FALSE(a.active());
}

// chunk_target / commit_chunk, the zero-copy receive's add(): the same checks, bytes written by
// the caller where it says.
TEST(InPlace, ChunkTargetChecksTheHeaderAndCommitVerifies) {
  const model::WeightSet set = random_fp8_set(4, 44);
  v1::VersionManifest manifest = build_manifest(set, v1::WEIGHT_FORMAT_FP8).value();
  std::string payload;
  for (const auto& t : set.tensors) payload.append(t.bytes.begin(), t.bytes.end());
  std::vector<char> target(payload.size());
  PayloadAssembler assembler;
  // Only for begin_into: a string-backed version refuses.
  ASSERT_TRUE(assembler.begin(manifest).ok());
  EXPECT_EQ(assembler.chunk_target(4, 0, 10).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(assembler.begin_into(manifest, std::span<char>(target)).ok());
  EXPECT_EQ(assembler.commit_chunk().code(), absl::StatusCode::kFailedPrecondition);
  const uint64_t half = payload.size() / 2;
  absl::StatusOr<char*> at = assembler.chunk_target(4, 0, half);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, target.data());
  std::memcpy(*at, payload.data(), half);
  ASSERT_TRUE(assembler.commit_chunk().ok());
  // A gap is refused before anything is written; the assembler is reset.
  EXPECT_NE(std::string(assembler.chunk_target(4, half + 1, 5).status().message())
                .find("chunk.offset: gap"),
            std::string::npos);
  EXPECT_FALSE(assembler.active());
  // A corrupted byte written through chunk_target is DataLoss at commit.
  ASSERT_TRUE(assembler.begin_into(manifest, std::span<char>(target)).ok());
  at = assembler.chunk_target(4, 0, payload.size());
  ASSERT_TRUE(at.ok());
  std::memcpy(*at, payload.data(), payload.size());
  (*at)[payload.size() - 3] ^= 0x01;
  const absl::Status bad = assembler.commit_chunk();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  // The same bytes intact complete the version.
  ASSERT_TRUE(assembler.begin_into(manifest, std::span<char>(target)).ok());
  at = assembler.chunk_target(4, 0, payload.size());
  ASSERT_TRUE(at.ok());
  std::memcpy(*at, payload.data(), payload.size());
  ASSERT_TRUE(assembler.commit_chunk().ok());
  EXPECT_TRUE(assembler.complete());
  EXPECT_TRUE(assembler.finish().ok());
}

TEST(InPlace, TargetTooSmallIsResourceExhausted) {
  const model::WeightSet set = random_fp8_set(6, 23);
  auto manifest = build_manifest(set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(manifest.ok());
  std::vector<char> target(manifest->total_bytes() - 1);
  PayloadAssembler a;
  const absl::Status s = a.begin_into(*manifest, target);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("manifest.total_bytes"), std::string::npos) << s;
  EXPECT_FALSE(a.active());
}

TEST(InPlace, ViewOfAPayloadOfTheWrongSizeIsRejected) {
  const model::WeightSet set = random_fp8_set(7, 24);
  auto manifest = build_manifest(set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(manifest.ok());
  std::vector<char> short_payload(manifest->total_bytes() - 2);
  auto view = to_weight_view(*manifest, short_payload);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(view.status().message().find("manifest.total_bytes"), std::string::npos);
}

}  // namespace
}  // namespace fp8rl::weight_sync
