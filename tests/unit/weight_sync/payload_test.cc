// Tests of the weight-sync wire format: manifests with per-tensor CRC-32C, chunking, verified
// reassembly (gaps, overlaps, corruption, short payloads) and the FP8 payload size of a real model.
#include "services/weight_sync/payload.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "common/service/crc32c.h"
#include "model/model.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using testing::chunks_of;
using testing::expect_same_set;
using testing::random_bf16_set;
using testing::random_fp8_set;

std::string concat_bytes(const model::WeightSet& set) {
  std::string out;
  for (const auto& t : set.tensors) out.append(t.bytes.begin(), t.bytes.end());
  return out;
}

TEST(Manifest, HasOffsetsChecksumsAndTotal) {
  const model::WeightSet set = random_fp8_set(3, 11);
  absl::StatusOr<v1::VersionManifest> m = build_manifest(set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version(), 3);
  EXPECT_EQ(m->model_config_json(), set.config_json);
  ASSERT_EQ(m->tensors_size(), static_cast<int>(set.tensors.size()));
  uint64_t offset = 0;
  for (int i = 0; i < m->tensors_size(); ++i) {
    const auto& e = m->tensors(i);
    const auto& t = set.tensors[i];
    EXPECT_EQ(e.name(), t.name);
    EXPECT_EQ(e.dtype(), dtype_name(t.dtype));
    EXPECT_EQ(e.offset(), offset);
    EXPECT_EQ(e.byte_size(), t.bytes.size());
    EXPECT_EQ(e.crc32c(), service::crc32c(t.bytes.data(), t.bytes.size()));
    EXPECT_NE(e.crc32c(), 0u);
    offset += t.bytes.size();
  }
  EXPECT_EQ(m->total_bytes(), offset);
  EXPECT_EQ(m->total_bytes(), static_cast<uint64_t>(set.nbytes()));
  EXPECT_GT(m->total_bytes(), 5u << 20);  // more than one 4 MiB chunk
}

TEST(Manifest, BuildRejectsFp8TensorsInABf16Version) {
  const absl::StatusOr<v1::VersionManifest> m =
      build_manifest(random_fp8_set(1, 1), v1::WEIGHT_FORMAT_BF16);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("F8_E4M3 in a WEIGHT_FORMAT_BF16 version"), std::string::npos)
      << m.status();
}

// Each mutation of a valid manifest and the text the error must contain.
TEST(Manifest, ValidationNamesTheBadField) {
  const v1::VersionManifest good =
      build_manifest(random_fp8_set(2, 5), v1::WEIGHT_FORMAT_FP8).value();
  ASSERT_TRUE(validate_manifest(good).ok());
  struct Case {
    std::string what;
    std::function<void(v1::VersionManifest&)> mutate;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"zero version", [](auto& m) { m.set_version(0); }, "manifest.version: must be > 0"},
      {"no format", [](auto& m) { m.set_format(v1::WEIGHT_FORMAT_UNSPECIFIED); },
       "manifest.format"},
      {"config not json", [](auto& m) { m.set_model_config_json("{oops"); },
       "manifest.model_config_json"},
      {"no tensors",
       [](auto& m) {
         m.clear_tensors();
         m.set_total_bytes(0);
       },
       "manifest.tensors: empty"},
      {"duplicate name", [](auto& m) { m.mutable_tensors(3)->set_name(m.tensors(0).name()); },
       "manifest.tensors[3] (model.embed_tokens.weight).name: duplicate of manifest.tensors[0]"},
      {"empty name", [](auto& m) { m.mutable_tensors(1)->set_name(""); },
       "manifest.tensors[1].name: empty"},
      {"unknown dtype", [](auto& m) { m.mutable_tensors(0)->set_dtype("F12"); },
       "manifest.tensors[0] (model.embed_tokens.weight).dtype: unknown dtype 'F12'"},
      {"negative dim", [](auto& m) { m.mutable_tensors(0)->set_shape(0, -640); },
       "negative dimension"},
      {"byte size",
       [](auto& m) { m.mutable_tensors(5)->set_byte_size(m.tensors(5).byte_size() + 2); },
       ".byte_size: 2050 but BF16 [1024] is 2048 bytes"},
      {"offset", [](auto& m) { m.mutable_tensors(2)->set_offset(m.tensors(2).offset() + 1); },
       "manifest.tensors[2] (model.layers.0.mlp.up_proj.weight_scale_inv).offset"},
      {"total", [](auto& m) { m.set_total_bytes(m.total_bytes() - 1); }, "manifest.total_bytes"},
      {"missing scale",
       [](auto& m) { m.mutable_tensors(2)->set_name("model.layers.0.mlp.up_proj.weight_scales"); },
       "without its scale tensor 'model.layers.0.mlp.up_proj.weight_scale_inv'"},
      {"scale shape",
       [](auto& m) {
         m.mutable_tensors(4)->set_shape(1, 2);  // [8, 3] -> [8, 2]
         m.mutable_tensors(4)->set_byte_size(8 * 2 * 4);
         for (int i = 5; i < m.tensors_size(); ++i) {
           m.mutable_tensors(i)->set_offset(m.tensors(i).offset() - 8 * 4);
         }
         m.set_total_bytes(m.total_bytes() - 8 * 4);
       },
       "expected F32 [8, 3] block scales for model.layers.0.self_attn.q_proj.weight [1000, 300]"},
      {"fp8 not 2-D",
       [](auto& m) {
         m.mutable_tensors(1)->clear_shape();
         m.mutable_tensors(1)->add_shape(2048 * 2048);
       },
       "an F8_E4M3 weight must be 2-D"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::VersionManifest m = good;
    c.mutate(m);
    const absl::Status s = validate_manifest(m);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s;
  }
  // An empty FP8 weight with a huge dim (and its empty scale tensor): 0 bytes, but the block
  // count (rows + 127) / 128 overflowed int64 (found by UBSan); a dim over the limit is refused.
  {
    v1::VersionManifest m = good;
    const int64_t huge = std::numeric_limits<int64_t>::max();
    v1::TensorManifestEntry* w = m.add_tensors();
    w->set_name("extra.weight");
    w->set_dtype("F8_E4M3");
    w->add_shape(huge);
    w->add_shape(0);
    w->set_offset(m.total_bytes());
    v1::TensorManifestEntry* s = m.add_tensors();
    s->set_name("extra.weight_scale_inv");
    s->set_dtype("F32");
    s->add_shape(huge / 128 + 1);
    s->add_shape(0);
    s->set_offset(m.total_bytes());
    const absl::Status st = validate_manifest(m);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("(extra.weight).shape: dimension 9223372036854775807 exceeds"),
              std::string::npos)
        << st;
  }
  // The size limit is checked before anything is allocated.
  const absl::Status too_big = validate_manifest(good, good.total_bytes() - 1);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("exceeds the limit"), std::string::npos) << too_big;
}

TEST(Chunks, CoverThePayloadInOrderWithinTheLimit) {
  const model::WeightSet set = random_fp8_set(1, 21);
  const std::string payload = concat_bytes(set);
  for (uint64_t size : {kDefaultChunkBytes, uint64_t{1} << 20, uint64_t{333331}}) {
    SCOPED_TRACE(size);
    const std::vector<v1::WeightChunk> chunks = chunks_of(set, size);
    ASSERT_EQ(chunks.size(), (payload.size() + size - 1) / size);
    std::string joined;
    for (size_t i = 0; i < chunks.size(); ++i) {
      EXPECT_EQ(chunks[i].offset(), joined.size());
      if (i + 1 < chunks.size()) {
        EXPECT_EQ(chunks[i].data().size(), size);
      }
      joined += chunks[i].data();
    }
    EXPECT_TRUE(joined == payload);
  }
  EXPECT_FALSE(
      for_each_chunk(set, 0, [](uint64_t, std::string_view) { return absl::OkStatus(); }).ok());
}

TEST(Assembler, RoundTripsAWeightSetExactly) {
  for (const model::WeightSet& set : {random_fp8_set(4, 31), random_bf16_set(5, 32)}) {
    const v1::WeightFormat format =
        set.find("model.norm.weight") ? v1::WEIGHT_FORMAT_BF16 : v1::WEIGHT_FORMAT_FP8;
    PayloadAssembler a;
    ASSERT_TRUE(a.begin(build_manifest(set, format).value()).ok());
    for (const auto& c : chunks_of(set, 333331)) {
      ASSERT_FALSE(a.complete());
      ASSERT_TRUE(a.add(c).ok());
    }
    ASSERT_TRUE(a.complete());
    absl::StatusOr<AssembledVersion> v = a.finish();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_FALSE(a.active());
    absl::StatusOr<model::WeightSet> back = to_weight_set(v->manifest, v->payload);
    ASSERT_TRUE(back.ok()) << back.status();
    expect_same_set(set, *back);
  }
}

class AssemblerErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    set_ = random_fp8_set(7, 41);
    manifest_ = build_manifest(set_, v1::WEIGHT_FORMAT_FP8).value();
    chunks_ = chunks_of(set_, 1 << 20);
    ASSERT_GE(chunks_.size(), 5u);
  }
  // Feeds the chunks until one fails; returns that error, or finish()'s status.
  absl::Status feed(const std::vector<v1::WeightChunk>& chunks) {
    PayloadAssembler a;
    if (absl::Status s = a.begin(manifest_); !s.ok()) return s;
    for (const auto& c : chunks) {
      if (absl::Status s = a.add(c); !s.ok()) {
        EXPECT_FALSE(a.active());  // reset after an error
        return s;
      }
    }
    return a.finish().status();
  }
  model::WeightSet set_;
  v1::VersionManifest manifest_;
  std::vector<v1::WeightChunk> chunks_;
};

TEST_F(AssemblerErrors, CorruptByteIsDataLossNamingTheTensor) {
  auto chunks = chunks_;
  chunks[2].mutable_data()->at(1000) ^= 0x10;  // inside up_proj.weight
  const absl::Status s = feed(chunks);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("tensor model.layers.0.mlp.up_proj.weight: crc32c mismatch"),
            std::string::npos)
      << s;
}

TEST_F(AssemblerErrors, WrongManifestChecksumIsDataLoss) {
  manifest_.mutable_tensors(6)->set_crc32c(manifest_.tensors(6).crc32c() ^ 1);
  const absl::Status s = feed(chunks_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.layers.0.self_attn.k_scale"), std::string::npos) << s;
}

TEST_F(AssemblerErrors, GapOverlapOverrunShortAndWrongVersion) {
  auto gap = chunks_;
  gap.erase(gap.begin() + 1);
  absl::Status s = feed(gap);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gap"), std::string::npos) << s;

  auto overlap = chunks_;
  overlap.insert(overlap.begin() + 2, overlap[1]);
  s = feed(overlap);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s;

  auto overrun = chunks_;
  v1::WeightChunk extra;
  extra.set_version(7);
  extra.set_offset(manifest_.total_bytes());
  extra.set_data("xyz");
  overrun.push_back(extra);
  s = feed(overrun);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("runs past total_bytes"), std::string::npos) << s;

  auto shorter = chunks_;
  shorter.pop_back();
  s = feed(shorter);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("incomplete payload for version 7"), std::string::npos) << s;

  auto wrong_version = chunks_;
  wrong_version[3].set_version(8);
  s = feed(wrong_version);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk.version: 8 but the manifest is version 7"), std::string::npos)
      << s;

  auto empty = chunks_;
  empty[1].clear_data();
  s = feed(empty);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("empty chunk"), std::string::npos) << s;

  PayloadAssembler a;
  s = a.add(chunks_[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk before a manifest"), std::string::npos) << s;
}

// docs/design/fp8-recipe.md "FP8 checkpoint format": FP8 payloads carry 1 byte per linear parameter
// plus the 128x128 block scales; embedding, lm_head and norms stay BF16; k_scale/v_scale are F32
// scalars.
TEST(Fp8Payload, OneBytePerLinearParameterPlusScalesPlusBf16Rest) {
  model::ModelConfig config;
  config.vocab_size = 300;
  config.hidden_size = 256;
  config.intermediate_size = 640;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 64;
  model::PrecisionPolicy policy;
  policy.linear = model::Precision::kFP8;
  auto net = model::Model::Init(config, policy, /*seed=*/7);
  ASSERT_TRUE(net.ok()) << net.status();
  absl::StatusOr<model::WeightSet> set = (*net)->export_weights(model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(set.ok()) << set.status();
  absl::StatusOr<v1::VersionManifest> m = build_manifest(*set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(m.ok()) << m.status();

  const int64_t h = config.hidden_size, q = config.q_dim(), kv = config.kv_dim(),
                inter = config.intermediate_size, layers = config.num_hidden_layers;
  // [N, K] of q, k, v, o, gate, up, down.
  const std::vector<std::pair<int64_t, int64_t>> linears = {
      {q, h}, {kv, h}, {kv, h}, {h, q}, {inter, h}, {inter, h}, {h, inter}};
  int64_t linear_params = 0, scale_bytes = 0;
  for (const auto& [n, k] : linears) {
    linear_params += n * k;
    scale_bytes += ((n + 127) / 128) * ((k + 127) / 128) * 4;
  }
  linear_params *= layers;
  scale_bytes *= layers;
  const int64_t bf16_params = 2 * config.vocab_size * h  // embed_tokens + lm_head (untied)
                              + (2 * layers + 1) * h;    // input/post-attention norms + final
  const int64_t kv_scale_bytes = layers * 2 * 4;
  EXPECT_EQ(m->total_bytes(),
            static_cast<uint64_t>(linear_params + scale_bytes + 2 * bf16_params + kv_scale_bytes));
  uint64_t fp8_bytes = 0;
  for (const auto& e : m->tensors()) {
    if (e.dtype() == "F8_E4M3") fp8_bytes += e.byte_size();
  }
  EXPECT_EQ(fp8_bytes, static_cast<uint64_t>(linear_params));

  // The same model as BF16 is 2 bytes per parameter: the FP8 payload is clearly smaller.
  absl::StatusOr<model::WeightSet> bf16 = (*net)->export_weights(model::WeightFormat::kBF16, 1);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  absl::StatusOr<v1::VersionManifest> mb = build_manifest(*bf16, v1::WEIGHT_FORMAT_BF16);
  ASSERT_TRUE(mb.ok()) << mb.status();
  EXPECT_EQ(mb->total_bytes(),
            static_cast<uint64_t>(2 * (linear_params + bf16_params) + kv_scale_bytes));
  EXPECT_LT(m->total_bytes(), mb->total_bytes());
}

}  // namespace
}  // namespace fp8rl::weight_sync
