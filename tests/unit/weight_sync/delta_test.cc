// Delta versions without the network: encode_delta / apply_delta round trip bit-exact on real
// consecutive versions (FP8 and BF16), reject a corrupted delta or a wrong base with a checksum or
// precondition error, and the delta manifest and chunk rules name the offending field.
#include "services/weight_sync/delta.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "services/weight_sync/payload.h"
#include "tests/unit/weight_sync/test_weights.h"
#include "tests/unit/weight_sync/trained_versions.h"

namespace fp8rl::weight_sync {
namespace {

using testing::payload_of;
using testing::trained_versions;
using testing::wire_format;

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
std::span<uint8_t> bytes(std::string& s) {
  return {reinterpret_cast<uint8_t*>(s.data()), s.size()};
}

struct Version {
  v1::VersionManifest manifest;
  std::string payload;
};

Version version_of(const model::WeightSet& set, v1::WeightFormat format) {
  return {build_manifest(set, format).value(), payload_of(set)};
}

EncodedDelta encode(const Version& base, const Version& target) {
  absl::StatusOr<EncodedDelta> d =
      encode_delta(base.manifest, base.payload, target.manifest, target.payload);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : EncodedDelta{};
}

class DeltaRoundTrip : public ::testing::TestWithParam<Precision> {};

TEST_P(DeltaRoundTrip, RealConsecutiveVersionsRebuildBitExact) {
  const std::vector<model::WeightSet> sets = trained_versions(3, GetParam(), 1e-3);
  ASSERT_EQ(sets.size(), 3u);
  for (int i = 1; i < 3; ++i) {
    SCOPED_TRACE(i);
    const Version base = version_of(sets[i - 1], wire_format(GetParam()));
    const Version target = version_of(sets[i], wire_format(GetParam()));
    ASSERT_NE(base.payload, target.payload);  // the step changed the weights
    const EncodedDelta d = encode(base, target);
    ASSERT_TRUE(validate_delta_manifest(d.manifest).ok());
    EXPECT_EQ(d.manifest.base_version(), i);
    EXPECT_EQ(d.manifest.target().version(), i + 1);
    int xor_tensors = 0;
    for (const v1::TensorDelta& t : d.manifest.tensors()) {
      xor_tensors += t.encoding() == v1::TENSOR_ENCODING_XOR_ZSTD;
    }
    EXPECT_GT(xor_tensors, 0);
    EXPECT_LT(d.payload.size(), target.payload.size());

    std::string out(target.payload.size(), '\x5a');
    const absl::Status s = apply_delta(d.manifest, bytes(base.payload), d.payload, bytes(out));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(out == target.payload);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, DeltaRoundTrip,
                         ::testing::Values(Precision::kFP8, Precision::kBF16),
                         [](const auto& info) {
                           return info.param == Precision::kFP8 ? std::string("FP8")
                                                                : std::string("BF16");
                         });

// A new tensor and incompressible changes travel RAW, and the delta still round trips.
TEST(Delta, UnrelatedVersionsFallBackToRawTensors) {
  const Version base = version_of(testing::random_fp8_set(1, 3), v1::WEIGHT_FORMAT_FP8);
  model::WeightSet next = testing::random_fp8_set(2, 4);
  next.tensors[0].name = "model.new_tensor.weight";
  const Version target = version_of(next, v1::WEIGHT_FORMAT_FP8);
  const EncodedDelta d = encode(base, target);
  for (int i = 0; i < d.manifest.tensors_size(); ++i) {
    const v1::TensorManifestEntry& t = d.manifest.target().tensors(i);
    SCOPED_TRACE(t.name());
    // The renamed tensor has no base; independent random E4M3 codes do not compress. (The
    // random F32 block scales share their exponent bytes, so their XOR does.)
    if (i == 0 || t.dtype() == "F8_E4M3") {
      EXPECT_EQ(d.manifest.tensors(i).encoding(), v1::TENSOR_ENCODING_RAW);
      EXPECT_EQ(d.manifest.tensors(i).byte_size(), t.byte_size());
    }
  }
  EXPECT_LE(d.payload.size(), target.payload.size());
  std::string out(target.payload.size(), '\0');
  ASSERT_TRUE(apply_delta(d.manifest, bytes(base.payload), d.payload, bytes(out)).ok());
  EXPECT_TRUE(out == target.payload);
}

TEST(Delta, CorruptedDeltaPayloadIsDataLoss) {
  const std::vector<model::WeightSet> sets = trained_versions(2, Precision::kFP8, 1e-3);
  ASSERT_EQ(sets.size(), 2u);
  const Version base = version_of(sets[0], v1::WEIGHT_FORMAT_FP8);
  const Version target = version_of(sets[1], v1::WEIGHT_FORMAT_FP8);
  EncodedDelta d = encode(base, target);
  // Corrupt the middle of every XOR_ZSTD tensor's frame in turn: each is caught, by zstd or by
  // the tensor's CRC-32C.
  int corrupted = 0;
  for (int i = 0; i < d.manifest.tensors_size(); ++i) {
    const v1::TensorDelta& t = d.manifest.tensors(i);
    if (t.encoding() != v1::TENSOR_ENCODING_XOR_ZSTD || t.byte_size() < 16) continue;
    std::string payload = d.payload;
    payload[t.offset() + t.byte_size() / 2] ^= 0x21;
    std::string out(target.payload.size(), '\0');
    const absl::Status s = apply_delta(d.manifest, bytes(base.payload), payload, bytes(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(d.manifest.target().tensors(i).name()), std::string::npos) << s;
    ++corrupted;
  }
  EXPECT_GT(corrupted, 0);
}

// The worker's base differs from the one the delta was made against (same size): the XOR lands
// on wrong bytes and the full version's CRC-32C catches it.
TEST(Delta, WrongBaseFailsTheFullManifestsCrc) {
  const std::vector<model::WeightSet> sets = trained_versions(2, Precision::kFP8, 1e-3);
  ASSERT_EQ(sets.size(), 2u);
  const Version base = version_of(sets[0], v1::WEIGHT_FORMAT_FP8);
  const Version target = version_of(sets[1], v1::WEIGHT_FORMAT_FP8);
  const EncodedDelta d = encode(base, target);
  int fp8_index = -1;
  for (int i = 0; i < d.manifest.tensors_size(); ++i) {
    if (d.manifest.target().tensors(i).dtype() == "F8_E4M3" &&
        d.manifest.tensors(i).encoding() == v1::TENSOR_ENCODING_XOR_ZSTD) {
      fp8_index = i;
      break;
    }
  }
  ASSERT_GE(fp8_index, 0);
  std::string other_base = base.payload;
  other_base[d.manifest.tensors(fp8_index).base_offset() + 5] ^= 0x01;
  std::string out(target.payload.size(), '\0');
  absl::Status s = apply_delta(d.manifest, bytes(other_base), d.payload, bytes(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("crc32c mismatch"), std::string::npos) << s;
  EXPECT_NE(s.message().find(d.manifest.target().tensors(fp8_index).name()), std::string::npos);

  const std::string short_base = base.payload.substr(1);
  s = apply_delta(d.manifest, bytes(short_base), d.payload, bytes(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  std::string short_out(target.payload.size() - 1, '\0');
  s = apply_delta(d.manifest, bytes(base.payload), d.payload, bytes(short_out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(Delta, EncodeChecksItsInputs) {
  const Version a = version_of(testing::random_bf16_set(2, 1), v1::WEIGHT_FORMAT_BF16);
  const Version b = version_of(testing::random_bf16_set(3, 2), v1::WEIGHT_FORMAT_BF16);
  EXPECT_EQ(encode_delta(b.manifest, b.payload, a.manifest, a.payload).status().code(),
            absl::StatusCode::kInvalidArgument);  // base newer than target
  EXPECT_EQ(encode_delta(a.manifest, a.payload.substr(1), b.manifest, b.payload).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Delta, ValidateNamesTheField) {
  const std::vector<model::WeightSet> sets = trained_versions(2, Precision::kFP8, 1e-3);
  ASSERT_EQ(sets.size(), 2u);
  const EncodedDelta good = encode(version_of(sets[0], v1::WEIGHT_FORMAT_FP8),
                                   version_of(sets[1], v1::WEIGHT_FORMAT_FP8));
  ASSERT_TRUE(validate_delta_manifest(good.manifest).ok());
  auto expect_error = [&](auto mutate, const std::string& field) {
    v1::DeltaManifest m = good.manifest;
    mutate(m);
    const absl::Status s = validate_delta_manifest(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(std::string(s.message()).find(field), std::string::npos) << s;
  };
  expect_error([](v1::DeltaManifest& m) { m.clear_target(); }, "delta.target");
  expect_error([](v1::DeltaManifest& m) { m.mutable_target()->set_total_bytes(1); },
               "delta.target: manifest.total_bytes");
  expect_error([](v1::DeltaManifest& m) { m.set_base_version(2); }, "delta.base_version");
  expect_error([](v1::DeltaManifest& m) { m.mutable_tensors()->RemoveLast(); }, "delta.tensors");
  expect_error(
      [](v1::DeltaManifest& m) { m.mutable_tensors(1)->set_encoding(v1::TensorEncoding(9)); },
      "delta.tensors[1]");
  expect_error([](v1::DeltaManifest& m) { m.mutable_tensors(2)->set_offset(3); },
               "delta.tensors[2]");
  expect_error([](v1::DeltaManifest& m) { m.set_total_bytes(m.total_bytes() + 1); },
               "delta.total_bytes");
  expect_error(
      [](v1::DeltaManifest& m) {
        m.mutable_tensors(0)->set_encoding(v1::TENSOR_ENCODING_RAW);  // RAW of the wrong size
      },
      "delta.tensors[0]");
}

TEST(DeltaReceiver, ReassemblesInOrderAndRejectsGaps) {
  const std::vector<model::WeightSet> sets = trained_versions(2, Precision::kFP8, 1e-3);
  ASSERT_EQ(sets.size(), 2u);
  const EncodedDelta d = encode(version_of(sets[0], v1::WEIGHT_FORMAT_FP8),
                                version_of(sets[1], v1::WEIGHT_FORMAT_FP8));
  ASSERT_GT(d.payload.size(), 100u);
  auto chunk = [&](int64_t version, uint64_t offset, uint64_t n) {
    v1::WeightChunk c;
    c.set_version(version);
    c.set_offset(offset);
    c.set_data(d.payload.substr(offset, n));
    return c;
  };
  DeltaReceiver r;
  ASSERT_TRUE(r.begin(d.manifest).ok());
  EXPECT_EQ(r.version(), 2);
  EXPECT_EQ(r.base_version(), 1);
  ASSERT_TRUE(r.add(chunk(2, 0, 50)).ok());
  EXPECT_FALSE(r.complete());
  ASSERT_TRUE(r.add(chunk(2, 50, d.payload.size() - 50)).ok());
  ASSERT_TRUE(r.complete());
  EXPECT_EQ(r.payload(), d.payload);

  ASSERT_TRUE(r.begin(d.manifest).ok());
  absl::Status s = r.add(chunk(2, 10, 20));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk.offset"), std::string::npos) << s;
  EXPECT_FALSE(r.active());
  ASSERT_TRUE(r.begin(d.manifest).ok());
  s = r.add(chunk(3, 0, 20));
  EXPECT_NE(s.message().find("chunk.version"), std::string::npos) << s;
  ASSERT_TRUE(r.begin(d.manifest).ok());
  v1::WeightChunk too_long = chunk(2, 0, d.payload.size());
  too_long.mutable_data()->push_back('x');
  s = r.add(too_long);
  EXPECT_NE(s.message().find("runs past"), std::string::npos) << s;
}

}  // namespace
}  // namespace fp8rl::weight_sync
