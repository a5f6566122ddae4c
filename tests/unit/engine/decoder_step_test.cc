// The CUDA backend's host-side logic without a GPU: the step tables (block table, row arrays),
// the arena's bookkeeping, and decoder_step() over the CPU ops (CpuDecoderOps, what the CPU
// backend generates with) against the training forwards: the logprobs of a KV-cache decode equal
// train_forward's, and its MoE routing record equals the training forward's.
#include "engine/decoder_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "engine/arena.h"
#include "engine/cpu/decoder_ops.h"
#include "engine/cpu/train_ops.h"
#include "model/inference_backend.h"
#include "model/ops.h"
#include "model/weight_view.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::engine {
namespace {

TEST(ArenaPlan, AlignsNamesAndRefusesOverBudget) {
  ArenaPlan a(4096);
  auto w = a.reserve(100, "weights");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, 0);
  auto k = a.reserve(300, "kv");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, 256);  // 100 rounded up to 256
  EXPECT_EQ(*a.reserve(1, "weights"), 256 + 512);
  EXPECT_EQ(a.used(), 256 + 512 + 256);
  EXPECT_EQ(a.remaining(), 4096 - 1024);
  ASSERT_EQ(a.regions().size(), 2u);
  EXPECT_EQ(a.regions()[0], (std::pair<std::string, int64_t>{"weights", 512}));
  auto big = a.reserve(4000, "scratch");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("scratch needs 4096 bytes, 3072 of 4096 left"),
            std::string::npos)
      << big.status();
  EXPECT_EQ(a.used(), 1024);  // a refused reservation takes nothing
  EXPECT_EQ(a.reserve(-1, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepTables, RowsBlocksAndOutputRows) {
  const std::vector<int32_t> b0 = {4, 1, 7}, b1 = {2};
  const std::vector<int32_t> t0 = {10, 11, 12, 13, 14}, t1 = {20};
  // Segment 0: prefill of 5 tokens at [0, 5); segment 1: one decode token at position 3.
  std::vector<SegmentBlocks> segs = {{&b0, 12, t0.data(), 5, 0}, {&b1, 4, t1.data(), 1, 3}};
  auto t = build_step_tables(segs, 4, 100, 64, OutputRows::kLastOfSegment);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rows, 6);
  EXPECT_EQ(t->width, 3);
  EXPECT_EQ(t->tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 20}));
  EXPECT_EQ(t->pos, (std::vector<int32_t>{0, 1, 2, 3, 4, 3}));
  EXPECT_EQ(t->row_seq, (std::vector<int32_t>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(t->block_table, (std::vector<int32_t>{4, 1, 7, 2, 2, 2}));
  EXPECT_EQ(t->out_rows, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(t->targets.empty());
  // Where the paged layout puts (segment, position): position 5 of segment 0 is block 1, slot 1.
  kernels::dm::PagedKvView kv;
  kv.block_size = 4;
  kv.n_kv = 2;
  kv.head_dim = 8;
  kv.block_table = t->block_table.data();
  kv.max_blocks = t->width;
  EXPECT_EQ(kernels::dm::paged_kv_offset(kv, 0, 5, 1), ((1 * 4 + 1) * 2 + 1) * 8);
  EXPECT_EQ(kernels::dm::paged_kv_offset(kv, 1, 3, 0), ((2 * 4 + 3) * 2 + 0) * 8);

  auto s = build_step_tables(segs, 4, 100, 64, OutputRows::kAllButLast);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->out_rows, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s->targets, (std::vector<int32_t>{11, 12, 13, 14}));
}

TEST(StepTables, BadSegmentsNameTheSegment) {
  const std::vector<int32_t> b = {0}, none = {};
  const std::vector<int32_t> tok = {1, 2, 3, 4, 5};
  auto err = [&](std::vector<SegmentBlocks> segs) {
    return build_step_tables(segs, 4, 10, 64, OutputRows::kLastOfSegment).status();
  };
  EXPECT_TRUE(err({{&b, 4, tok.data(), 4, 0}}).ok());
  absl::Status s = err({{&b, 4, tok.data(), 1, 0}, {&b, 4, tok.data(), 5, 0}});  // 5 > capacity
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("segment 1"), std::string::npos) << s;
  EXPECT_FALSE(err({{&b, 5, tok.data(), 1, 0}}).ok());     // capacity > 1 block of 4
  EXPECT_FALSE(err({{&none, 4, tok.data(), 1, 0}}).ok());  // no blocks
  EXPECT_FALSE(err({{&b, 4, tok.data(), 0, 0}}).ok());     // no tokens
  EXPECT_FALSE(err({{&b, 4, tok.data(), 1, -1}}).ok());    // negative position
  const std::vector<int32_t> bad_tok = {10};
  s = err({{&b, 4, bad_tok.data(), 1, 0}});
  EXPECT_NE(s.message().find("token id 10 is out of range [0, 10)"), std::string::npos) << s;
}

struct IdentityCase {
  model::Precision linear;
  int arch;  // 0: qwen2 (q/k/v bias), 1: qwen3 (q/k norm), 2: qwen3_moe, 3: qwen2_moe
  model::KvCacheDtype kv = model::KvCacheDtype::kF32;
};

std::string identity_name(const IdentityCase& c) {
  static const char* kArch[] = {"qwen2", "qwen3", "qwen3_moe", "qwen2_moe"};
  return std::string(precision_name(c.linear)) + "_" + kArch[c.arch] + "_kv_" +
         std::string(precision_name(c.kv));
}

// fp32 linears run OpenBLAS sgemm, whose last bits depend on the rows of the call (one row per
// sequence in a decode step, every row of the batch in the training forward): logprobs agree to a
// few ulp (measured <= 5e-7 here), not bit for bit. bf16 and FP8 linears accumulate each row
// alone, so their logprobs are bit-identical.
constexpr float kF32RowsTol = 1e-5f;

class SamplerLearnerTest : public ::testing::TestWithParam<IdentityCase> {};

// The sampler and the learner compute the same function: three sequences decoded through a KV
// cache (decoder_step over CpuDecoderOps: one prefill of 1, 4 and 7 tokens, then one token per
// step), the logprob of each next token taken from the step's logits as the sampler takes it
// (model/sampler.cc: z[token] / T - logsumexp(z / T)), equal the training forward's logprobs of
// the same tokens bit for bit (fp32 linears: kF32RowsTol): train_forward over
// CpuTrainOps (mixture-of-experts models too, with the same routing record). An FP8 or BF16 cache
// matches the training forward's KV fake-quantization (train_kv_fake_quant) exactly too.
TEST_P(SamplerLearnerTest, DecodeLogprobsEqualTheTrainingForwards) {
  const IdentityCase c = GetParam();
  constexpr int64_t kVocab = 160, kBlock = 4;
  model::PrecisionPolicy policy;
  policy.linear = c.linear;
  policy.kv_cache = c.kv;
  namespace mt = model::testing;
  const model::ModelConfig config =
      c.arch == 0   ? mt::make_config(kVocab, 128, 256, 2, 4, 2, false, /*qwen2=*/true)
      : c.arch == 1 ? mt::make_qwen3_config(kVocab, 128, 256, 2, 4, 2, 48, true)
      : c.arch == 2
          ? mt::make_qwen3_moe_config(kVocab, 128, 256, 2, 4, 2, 48, false, 4, 2, 64, true)
          : mt::make_qwen2_moe_config(kVocab, 128, 256, 2, 4, 2, true, 4, 2, 64, 96);
  const bool moe = config.num_sparse_layers() > 0;
  auto made = model::Model::Init(config, policy, 5, 0.05f);
  ASSERT_TRUE(made.ok()) << made.status();
  model::Model& model = **made;
  mt::randomize(model, 13, 0.1);
  if (c.kv == model::KvCacheDtype::kFP8) {
    model::KvScales s = model.kv_scales();
    for (auto& k : s.k) k = 0.03f;
    for (auto& v : s.v) v = 0.02f;
    ASSERT_TRUE(model.set_kv_scales(s).ok());
  }
  const std::vector<int64_t> prefill = {1, 4, 7};
  const std::vector<int64_t> lens = {14, 9, 20};
  model::Rng rng(17);
  model::TokenBatch seqs;
  for (int64_t n : lens) seqs.push_back(mt::random_tokens(rng, n, kVocab));
  // Blocks: a permutation of the pool, so a sequence's blocks are neither contiguous nor in order.
  model::KvBlockPool pool(32);
  std::vector<std::vector<int32_t>> blocks(seqs.size());
  for (size_t s = seqs.size(); s-- > 0;) {  // the last sequence gets the low ids
    blocks[s] = *pool.acquire((lens[s] + kBlock - 1) / kBlock);
    std::reverse(blocks[s].begin(), blocks[s].end());
  }
  CpuDecoderOps ops(model, 32, kBlock);
  CpuStepBuffers buf(config, 32);
  // routing[s]: the experts each fed token of sequence s went to, [token, sparse layer, k].
  const int64_t k = config.moe.num_experts_per_tok, n_sparse = config.num_sparse_layers();
  std::vector<std::vector<int32_t>> routing(seqs.size());
  const float temperature = 0.8f, inv_t = 1.0f / temperature;
  // decoded[s][i]: logprob of token i + 1 of sequence s (from prefill[s] - 1 on).
  std::vector<std::vector<float>> decoded(seqs.size());
  std::vector<float> logits(seqs.size() * kVocab);
  for (int64_t step = 0;; ++step) {
    std::vector<SegmentBlocks> segs;
    std::vector<size_t> which;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t pos0 = step == 0 ? 0 : prefill[s] + step - 1, n = step == 0 ? prefill[s] : 1;
      if (pos0 + n >= lens[s]) continue;  // the last token is never fed
      segs.push_back({&blocks[s], lens[s], seqs[s].data() + pos0, n, pos0});
      which.push_back(s);
    }
    if (segs.empty()) break;
    auto t = build_step_tables(segs, kBlock, kVocab, config.max_position_embeddings,
                               OutputRows::kLastOfSegment);
    ASSERT_TRUE(t.ok()) << t.status();
    const StepBuffers b = buf.view();
    ASSERT_TRUE(decoder_step(config, policy, model.layout(), ops, b, *t, nullptr).ok());
    ASSERT_TRUE(ops.linear(-1, 0, b.sel, t->n_seg, nullptr, logits.data()).ok());
    ASSERT_EQ(b.routing != nullptr, moe);
    for (int64_t r = 0; moe && r < t->rows; ++r) {
      std::vector<int32_t>& out = routing[which[t->row_seq[r]]];
      for (int64_t li = 0; li < n_sparse; ++li) {
        const int32_t* sel = b.routing + (li * t->rows + r) * k;
        out.insert(out.end(), sel, sel + k);
      }
    }
    for (size_t i = 0; i < which.size(); ++i) {
      const size_t s = which[i];
      const float* z = logits.data() + i * kVocab;
      const int32_t next = seqs[s][segs[i].pos0 + segs[i].n];
      decoded[s].push_back(z[next] * inv_t - model::ops::logsumexp_scaled(z, kVocab, inv_t));
    }
  }
  engine::CpuTrainStep ctx;
  auto ref = ctx.forward(model, seqs, {.temperature = temperature});
  ASSERT_TRUE(ref.ok()) << ref.status();
  if (moe) {
    // Every token but the last was fed: the record is the training forward's routing of them.
    for (size_t s = 0; s < seqs.size(); ++s) {
      const std::vector<int32_t>& used = ctx.routing.used[s];
      ASSERT_EQ(static_cast<int64_t>(routing[s].size()), (lens[s] - 1) * n_sparse * k);
      EXPECT_TRUE(std::equal(routing[s].begin(), routing[s].end(), used.begin()))
          << "sequence " << s;
    }
  }
  // train_forward over CpuTrainOps (MoE layers through the ops' moe): the same logprobs, and the
  // same routing record.
  model::ForwardRouting engine_routing;
  CpuTrainStep step;
  absl::StatusOr<model::TokenValues> engine_lp =
      step.forward(model, seqs, {.temperature = temperature, .routing_out = &engine_routing});
  ASSERT_TRUE(engine_lp.ok()) << engine_lp.status();
  const std::vector<const model::TokenValues*> learners = {&*ref, &*engine_lp};
  if (moe) {
    ASSERT_EQ(engine_routing.used.size(), seqs.size());
    for (size_t s = 0; s < seqs.size(); ++s) {
      EXPECT_EQ(engine_routing.used[s], ctx.routing.used[s]) << "sequence " << s;
      EXPECT_TRUE(std::equal(routing[s].begin(), routing[s].end(), engine_routing.used[s].begin()))
          << "sequence " << s;
    }
  } else {
    EXPECT_TRUE(engine_routing.used.empty());
  }
  int64_t compared = 0;
  double norm = 0;
  for (const model::TokenValues* learner : learners) {
    for (size_t s = 0; s < seqs.size(); ++s) {
      ASSERT_EQ(static_cast<int64_t>(decoded[s].size()), lens[s] - prefill[s]);
      for (size_t j = 0; j < decoded[s].size(); ++j) {
        const float want = (*learner)[s][prefill[s] - 1 + j];
        const std::string where = absl::StrCat(
            learner == &*ref ? "train_forward (step routing)" : "train_forward", " sequence ", s,
            " token ", prefill[s] + j, ": ", decoded[s][j], " vs ", want);
        if (c.linear == model::Precision::kF32) {
          ASSERT_LE(std::fabs(decoded[s][j] - want), kF32RowsTol) << where;
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(decoded[s][j]), std::bit_cast<uint32_t>(want)) << where;
        }
        norm += std::fabs(want);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, static_cast<int64_t>(learners.size()) * (13 + 5 + 13));
  EXPECT_GT(norm, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, SamplerLearnerTest,
    ::testing::Values(
        IdentityCase{model::Precision::kF32, 0}, IdentityCase{model::Precision::kF32, 1},
        IdentityCase{model::Precision::kF32, 2}, IdentityCase{model::Precision::kF32, 3},
        IdentityCase{model::Precision::kBF16, 0}, IdentityCase{model::Precision::kBF16, 1},
        IdentityCase{model::Precision::kBF16, 2}, IdentityCase{model::Precision::kBF16, 3},
        IdentityCase{model::Precision::kFP8, 0}, IdentityCase{model::Precision::kFP8, 1},
        IdentityCase{model::Precision::kFP8, 2}, IdentityCase{model::Precision::kFP8, 3},
        IdentityCase{model::Precision::kFP8, 0, model::KvCacheDtype::kFP8},
        IdentityCase{model::Precision::kBF16, 2, model::KvCacheDtype::kBF16},
        IdentityCase{model::Precision::kBF16, 1, model::KvCacheDtype::kFP8},
        IdentityCase{model::Precision::kFP8, 3, model::KvCacheDtype::kFP8}),
    [](const auto& info) { return identity_name(info.param); });

// An inference-only model (what a generation worker installs versions into) keeps only the
// double-accumulation operand of its BF16 linears and untied lm_head: linear_values() recovers
// the same fp32 values the full model's bf16 copies hold, which the CUDA backend uploads.
TEST(LinearValues, InferenceOnlyModelGivesTheFullModelsValues) {
  model::PrecisionPolicy policy;
  policy.linear = model::Precision::kFP8;
  policy.kv_cache = model::KvCacheDtype::kFP8;
  policy.bf16_first_layers = 1;
  auto full = model::Model::Init(model::testing::make_config(96, 128, 256, 2, 4, 2, false), policy,
                                 9, 0.05f);
  ASSERT_TRUE(full.ok());
  auto set = (*full)->export_weights(model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(set.ok()) << set.status();
  auto ref = model::Model::FromWeightSet(*set, policy);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto inf = model::Model::ForInference((*full)->config(), policy);
  ASSERT_TRUE(inf.ok()) << inf.status();
  auto view = view_of(*set);
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE((*inf)->install(*view).ok());
  int checked = 0;
  for (int64_t j = 0; j < 7; ++j) {
    const model::LinearWeight& w = (*inf)->layer_linear(0, j);
    ASSERT_EQ(w.precision, model::Precision::kBF16);
    ASSERT_TRUE(w.bf16.empty());  // only the double operand: what linear_values must handle
    const std::vector<float> got = linear_values(w),
                             want = linear_values((*ref)->layer_linear(0, j));
    ASSERT_EQ(got.size(), static_cast<size_t>(w.out * w.in));
    EXPECT_EQ(got, want) << "linear " << j;
    EXPECT_TRUE(linear_values((*inf)->layer_linear(1, j)).empty());  // FP8: codes + scales
    ++checked;
  }
  EXPECT_EQ(linear_values((*inf)->lm_head_weight()), linear_values((*ref)->lm_head_weight()));
  EXPECT_EQ(linear_values((*inf)->embedding_weight()), linear_values((*ref)->embedding_weight()));
  EXPECT_FALSE(linear_values((*inf)->lm_head_weight()).empty());
  EXPECT_EQ(checked, 7);
}

// A tied embedding in an inference-only model is held once, as the lm_head's double operand:
// the row lookup (CpuDecoderOps::embed, the CUDA backend's upload through linear_values) reads
// the same bf16 values the full model's float copy holds, for in-range and out-of-range tokens.
TEST(LinearValues, InferenceOnlyTiedEmbeddingIsHeldOnceAndLooksUpTheSameRows) {
  model::PrecisionPolicy policy;
  policy.linear = model::Precision::kFP8;
  policy.kv_cache = model::KvCacheDtype::kBF16;
  auto full = model::Model::Init(model::testing::make_config(96, 128, 256, 2, 4, 2, true), policy,
                                 11, 0.05f);
  ASSERT_TRUE(full.ok());
  auto set = (*full)->export_weights(model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(set.ok()) << set.status();
  auto ref = model::Model::FromWeightSet(*set, policy);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto inf = model::Model::ForInference((*full)->config(), policy);
  ASSERT_TRUE(inf.ok()) << inf.status();
  auto view = view_of(*set);
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE((*inf)->install(*view).ok());
  const model::LinearWeight& e = (*inf)->embedding_weight();
  EXPECT_TRUE(e.bf16.empty());
  ASSERT_EQ(e.exact.size(), static_cast<size_t>(96 * 128));
  EXPECT_EQ(linear_values(e), linear_values((*ref)->embedding_weight()));

  const int64_t h = 128;
  StepTables t;
  t.rows = 5;
  t.tokens = {0, 95, 17, -1, 96};  // the last two are outside the vocabulary: NaN rows
  t.pos = {0, 1, 2, 3, 4};
  t.row_seq = {0, 0, 0, 0, 0};
  t.n_seg = 1;
  std::vector<float> got(t.rows * h), want(t.rows * h);
  CpuDecoderOps inf_ops(**inf, 4, 4), ref_ops(**ref, 4, 4);
  ASSERT_TRUE(inf_ops.load_tables(t).ok());
  ASSERT_TRUE(inf_ops.embed(t.rows, got.data()).ok());
  ASSERT_TRUE(ref_ops.load_tables(t).ok());
  ASSERT_TRUE(ref_ops.embed(t.rows, want.data()).ok());
  int nonzero = 0;
  for (int64_t i = 0; i < 3 * h; ++i) {
    ASSERT_EQ(got[i], want[i]) << i;
    nonzero += got[i] != 0.0f;
  }
  EXPECT_GT(nonzero, 3 * h / 2);
  for (int64_t i = 3 * h; i < 5 * h; ++i) EXPECT_TRUE(std::isnan(got[i])) << i;
  // Model::embed reads the same table: ModelInstallTest compares whole generations of a tied
  // model installed in place with a freshly loaded one.
}

// Ops without a MoE op (the CUDA device ops today) refuse a sparse layer clearly; the CPU ops
// refuse a MoE call for a dense layer.
class DenseOnlyOps final : public DecoderOps {
 public:
  absl::Status load_tables(const StepTables&) override { return absl::OkStatus(); }
  absl::Status embed(int64_t, float*) override { return absl::OkStatus(); }
  absl::Status rmsnorm(const float*, const float*, int64_t, int64_t, bool, float*) override {
    return absl::OkStatus();
  }
  absl::Status rope(int64_t, int64_t, bool, float*) override { return absl::OkStatus(); }
  absl::Status linear(int64_t, int64_t, const float*, int64_t, const float*, float*) override {
    return absl::OkStatus();
  }
  absl::Status attention(int64_t, const float*, const float*, const float*, int64_t,
                         float*) override {
    return absl::OkStatus();
  }
  absl::Status swiglu(const float*, const float*, int64_t, bool, float*) override {
    return absl::OkStatus();
  }
  absl::Status add(float*, const float*, int64_t, bool) override { return absl::OkStatus(); }
  absl::Status round_bf16(float*, int64_t) override { return absl::OkStatus(); }
  absl::Status gather_out_rows(const float*, int64_t, int64_t, float*) override {
    return absl::OkStatus();
  }
  const float* small(int64_t) const override { return nullptr; }
};

TEST(DecoderStep, MoeWithoutAMoeOpIsRefusedClearly) {
  model::PrecisionPolicy policy;
  auto m = model::Model::Init(
      model::testing::make_qwen3_moe_config(64, 64, 128, 2, 2, 1, 32, false, 4, 2, 32, true),
      policy, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->config().sparse_layer(0));
  DenseOnlyOps ops;
  CpuStepBuffers buf((*m)->config(), 8);
  StepTables t;
  t.rows = 1;
  t.out_rows = {0};
  auto s = decoder_step((*m)->config(), policy, (*m)->layout(), ops, buf.view(), t, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("MoE not on this device (layer 0"), std::string::npos) << s;

  auto dense =
      model::Model::Init(model::testing::make_config(64, 64, 128, 1, 2, 1, true), policy, 1);
  ASSERT_TRUE(dense.ok());
  CpuDecoderOps cpu(**dense, 4, 4);
  std::vector<float> x(64, 1.0f), y(64);
  EXPECT_EQ(cpu.moe(0, x.data(), 1, y.data(), nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fp8rl::engine
