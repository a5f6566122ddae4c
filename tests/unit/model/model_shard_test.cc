// ZeRO-2 with the fp32 master per shard (model/model_shard.cc, docs/design/sharding.md): the
// working copies encoded shard by shard and installed from the concatenated streams equal
// refresh() of the whole master bit for bit, and a model that keeps one shard of its master
// still exports the publishing formats from its working copies.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine/cpu/train_ops.h"
#include "model/model.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

// Every flat offset a shard may start or end at.
std::vector<int64_t> cut_points(const Model& m) {
  std::vector<int64_t> out;
  for (int64_t at = 0; at <= m.num_params(); ++at) {
    if (m.shard_cut_allowed(at)) out.push_back(at);
  }
  return out;
}

// `ranks` + 1 bounds: each cut the allowed point nearest to r * total / ranks, never falling.
std::vector<int64_t> cut(const Model& m, int ranks) {
  const std::vector<int64_t> points = cut_points(m);
  std::vector<int64_t> bounds = {0};
  for (int r = 1; r < ranks; ++r) {
    const int64_t want = m.num_params() * r / ranks;
    int64_t best = points.front();
    for (int64_t p : points) {
      if (std::abs(p - want) < std::abs(best - want)) best = p;
    }
    bounds.push_back(std::max(best, bounds.back()));
  }
  bounds.push_back(m.num_params());
  return bounds;
}

std::unique_ptr<Model> random_model(const ModelConfig& c, const PrecisionPolicy& policy,
                                    uint64_t seed) {
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Init(c, policy, seed);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  testing::randomize(**m, seed);
  return std::move(*m);
}

void expect_same_linear(const LinearWeight& got, const LinearWeight& want,
                        const std::string& what) {
  EXPECT_EQ(got.precision, want.precision) << what;
  EXPECT_EQ(got.q.data, want.q.data) << what;
  EXPECT_EQ(got.q.scale_inv, want.q.scale_inv) << what;
  EXPECT_EQ(got.qt.data, want.qt.data) << what;
  EXPECT_EQ(got.qt.scale_inv, want.qt.scale_inv) << what;
  EXPECT_EQ(got.bf16, want.bf16) << what;
  EXPECT_EQ(got.exact, want.exact) << what;
}

void expect_same_tensors(const WeightSet& got, const WeightSet& want, const std::string& what) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    EXPECT_EQ(got.tensors[i].name, want.tensors[i].name) << what;
    EXPECT_EQ(got.tensors[i].dtype, want.tensors[i].dtype) << what << " " << want.tensors[i].name;
    EXPECT_EQ(got.tensors[i].bytes, want.tensors[i].bytes) << what << " " << want.tensors[i].name;
  }
}

void expect_same_logits(const Model& got, const Model& want, const std::string& what) {
  Rng rng(3);
  const std::vector<int32_t> tokens = testing::random_tokens(rng, 19, want.config().vocab_size);
  absl::StatusOr<std::vector<float>> a = engine::cpu_logits(got, tokens),
                                     b = engine::cpu_logits(want, tokens);
  ASSERT_TRUE(a.ok() && b.ok()) << what;
  ASSERT_EQ(a->size(), b->size());
  EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float))) << what;
}

struct Case {
  std::string name;
  ModelConfig config;
  PrecisionPolicy policy;
};

std::vector<Case> cases() {
  // Odd widths: FP8 weights [264, 64] hold two full and one partial 128-row block row, so cuts
  // fall inside tensors at 128-row boundaries and a partial block sits at a shard's end.
  ModelConfig dense = testing::make_config(300, 64, 264, 2, 4, 2, /*tied=*/false, /*qwen2=*/true);
  ModelConfig moe = testing::make_qwen2_moe_config(300, 64, 264, 2, 4, 2, /*tied=*/true, 4, 2,
                                                   /*moe_inter=*/136, /*shared_inter=*/200);
  const PrecisionPolicy fp8{.linear = Precision::kFP8,
                            .kv_cache = KvCacheDtype::kFP8,
                            .bf16_first_layers = 1,
                            .pow2_scales = true};
  const PrecisionPolicy bf16{.linear = Precision::kBF16, .kv_cache = KvCacheDtype::kBF16};
  return {{"dense fp8 (bf16 first layer)", dense, fp8},
          {"dense bf16", dense, bf16},
          {"moe fp8", moe, PrecisionPolicy{.linear = Precision::kFP8}}};
}

TEST(ShardedMaster, WorkingCopiesFromShardsEqualRefreshBitForBit) {
  for (const Case& c : cases()) {
    std::unique_ptr<Model> want = random_model(c.config, c.policy, 5);
    ASSERT_NE(want, nullptr);
    for (int ranks : {1, 2, 3, 4}) {
      const std::string what = c.name + ", " + std::to_string(ranks) + " shards";
      const std::vector<int64_t> bounds = cut(*want, ranks);
      // Another model's working copies, replaced by the streams of `want`'s shards.
      std::unique_ptr<Model> got = random_model(c.config, c.policy, 99);
      ASSERT_NE(got, nullptr);
      Model::WorkingStreams all;
      Model::WorkingCounts sum;
      for (int r = 0; r < ranks; ++r) {
        absl::StatusOr<Model::WorkingStreams> piece =
            want->encode_working(bounds[r], bounds[r + 1]);
        ASSERT_TRUE(piece.ok()) << what << ": " << piece.status();
        absl::StatusOr<Model::WorkingCounts> n = want->working_counts(bounds[r], bounds[r + 1]);
        ASSERT_TRUE(n.ok()) << n.status();
        EXPECT_EQ(n->codes, std::ssize(piece->codes)) << what;
        EXPECT_EQ(n->scales, std::ssize(piece->scales)) << what;
        EXPECT_EQ(n->bf16, std::ssize(piece->bf16)) << what;
        sum.codes += n->codes;
        sum.scales += n->scales;
        sum.bf16 += n->bf16;
        all.codes.insert(all.codes.end(), piece->codes.begin(), piece->codes.end());
        all.scales.insert(all.scales.end(), piece->scales.begin(), piece->scales.end());
        all.bf16.insert(all.bf16.end(), piece->bf16.begin(), piece->bf16.end());
      }
      absl::StatusOr<Model::WorkingCounts> whole = want->working_counts(0, want->num_params());
      ASSERT_TRUE(whole.ok());
      EXPECT_EQ(sum.codes, whole->codes) << what;
      EXPECT_EQ(sum.scales, whole->scales) << what;
      EXPECT_EQ(sum.bf16, whole->bf16) << what;
      if (c.policy.linear == Precision::kFP8) {
        EXPECT_GT(whole->codes, 0) << what;
      }
      ASSERT_TRUE(got->install_working(all).ok()) << what;
      for (int64_t l = 0; l < c.config.num_hidden_layers; ++l) {
        for (int j = 0; j < 7; ++j) {
          if (c.config.sparse_layer(l) && j >= 4) continue;
          expect_same_linear(got->layer_linear(l, j), want->layer_linear(l, j),
                             what + " layer " + std::to_string(l) + " linear " + std::to_string(j));
        }
      }
      expect_same_linear(got->embedding_weight(), want->embedding_weight(), what + " embedding");
      expect_same_linear(got->lm_head_weight(), want->lm_head_weight(), what + " lm_head");
      // Norms, biases, routers and experts through the forward itself.
      expect_same_logits(*got, *want, what);
    }
  }
}

TEST(ShardedMaster, KeepsItsShardAndExportsFromTheWorkingCopies) {
  for (const Case& c : cases()) {
    std::unique_ptr<Model> whole = random_model(c.config, c.policy, 5);
    ASSERT_NE(whole, nullptr);
    const std::vector<int64_t> bounds = cut(*whole, 3);
    ASSERT_GT(bounds[1], 0);
    ASSERT_LT(bounds[2], whole->num_params());
    std::unique_ptr<Model> shard = random_model(c.config, c.policy, 5);
    ASSERT_TRUE(shard->shard_master(bounds[1], bounds[2]).ok()) << c.name;
    EXPECT_TRUE(shard->master_sharded());
    EXPECT_EQ(shard->master_begin(), bounds[1]);
    ASSERT_EQ(std::ssize(shard->params()), bounds[2] - bounds[1]) << c.name;
    EXPECT_EQ(0, std::memcmp(shard->params().data(), whole->params().data() + bounds[1],
                             shard->params().size() * sizeof(float)));
    expect_same_logits(*shard, *whole, c.name + ", sharded");

    // The training format's export needs no master; fp32 needs the gathered one.
    const WeightFormat own =
        c.policy.linear == Precision::kFP8 ? WeightFormat::kFP8 : WeightFormat::kBF16;
    EXPECT_FALSE(shard->export_needs_master(own)) << c.name;
    absl::StatusOr<WeightSet> got = shard->export_weights(own, 3),
                              want = whole->export_weights(own, 3);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok());
    expect_same_tensors(*got, *want, c.name + ", " + (own == WeightFormat::kFP8 ? "fp8" : "bf16"));
    absl::StatusOr<WeightSet> f32 = shard->export_weights(WeightFormat::kF32, 3);
    EXPECT_EQ(f32.status().code(), absl::StatusCode::kFailedPrecondition) << f32.status();
    if (c.policy.linear == Precision::kFP8) {
      // bf16 of an FP8 linear's master is not in any working copy.
      EXPECT_EQ(shard->export_weights(WeightFormat::kBF16, 3).status().code(),
                absl::StatusCode::kFailedPrecondition);
    }
    f32 = shard->export_weights(WeightFormat::kF32, 3, whole->params());
    ASSERT_TRUE(f32.ok()) << f32.status();
    want = whole->export_weights(WeightFormat::kF32, 3);
    ASSERT_TRUE(want.ok());
    expect_same_tensors(*f32, *want, c.name + ", f32 with the gathered master");
    EXPECT_EQ(shard->export_weights(WeightFormat::kF32, 3, shard->params()).status().code(),
              absl::StatusCode::kInvalidArgument);

    // The shard's streams come from the master it holds; outside it they cannot.
    absl::StatusOr<Model::WorkingStreams> mine = shard->encode_working(bounds[1], bounds[2]);
    absl::StatusOr<Model::WorkingStreams> same = whole->encode_working(bounds[1], bounds[2]);
    ASSERT_TRUE(mine.ok() && same.ok()) << mine.status();
    EXPECT_EQ(mine->codes, same->codes);
    EXPECT_EQ(mine->scales, same->scales);
    EXPECT_EQ(mine->bf16, same->bf16);
    EXPECT_EQ(shard->encode_working(0, bounds[2]).status().code(),
              absl::StatusCode::kInvalidArgument);
    // Streams of the wrong size change nothing.
    Model::WorkingStreams short_streams = *mine;
    EXPECT_EQ(shard->install_working(short_streams).code(), absl::StatusCode::kInvalidArgument);
    expect_same_logits(*shard, *whole, c.name + ", after a refused install");
    EXPECT_EQ(shard->shard_master(bounds[1], bounds[2]).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST(ShardedMaster, RefusesCutsInsideBlocksAndFp32WorkingCopies) {
  const Case c = cases()[0];
  std::unique_ptr<Model> m = random_model(c.config, c.policy, 5);
  ASSERT_NE(m, nullptr);
  // The first FP8 linear of layer 1 (q_proj [64, 64]: one block row) and gate_proj [264, 64].
  const LayerOffsets& lo = m->layout().layer(1);
  EXPECT_TRUE(m->shard_cut_allowed(lo.gate + 128 * 64));
  EXPECT_FALSE(m->shard_cut_allowed(lo.gate + 64 * 64));  // inside a block row
  EXPECT_FALSE(m->shard_cut_allowed(lo.input_norm + 1));  // inside a 1-D tensor
  absl::Status s = m->shard_master(lo.gate + 64 * 64, m->num_params());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("cut points"), std::string::npos) << s;
  EXPECT_FALSE(m->master_sharded());
  EXPECT_EQ(std::ssize(m->params()), m->num_params());

  // fp32 linears read the master itself: it cannot be sharded.
  std::unique_ptr<Model> f32 = random_model(c.config, PrecisionPolicy{}, 5);
  ASSERT_NE(f32, nullptr);
  s = f32->shard_master(0, lo.gate);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("fp32 working copies"), std::string::npos) << s;
  EXPECT_EQ(std::ssize(f32->params()), f32->num_params());
}

}  // namespace
}  // namespace fp8rl::model
