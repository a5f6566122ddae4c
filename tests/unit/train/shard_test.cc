// The block-aligned cut of the parameter space (train/shard.h) and the per-rank memory plan of
// sharded groups with its verdict (train/memory_plan.h), checked against counts worked out by
// hand in the comments (the tiny test config and Llama 3.1 8B from configs/models/).
#include "train/shard.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/fs.h"
#include "model/config.h"
#include "model/params.h"
#include "tests/unit/train/tiny_model.h"
#include "train/memory_plan.h"

namespace fp8rl::train {
namespace {

using test_model::tiny_config;

// Every offset a cut may fall at, enumerated here independently of train/shard.cc: tensor starts
// and the 128-row boundaries inside 2-D tensors.
bool allowed(const model::ParamLayout& layout, int64_t cut) {
  if (cut == 0 || cut == layout.total()) return true;
  for (const model::ParamInfo& p : layout.params()) {
    if (cut == p.offset) return true;
    if (cut > p.offset && cut < p.offset + p.numel) {
      return p.shape.size() == 2 && (cut - p.offset) % (128 * p.shape[1]) == 0;
    }
  }
  return false;
}

TEST(ShardParameters, TinyConfigByHand) {
  // The tiny config (tests/unit/train/tiny_model.h): embedding 48x32 = 1536 at 0; layer 0 at 1536:
  // input_norm 32, q 1024, k 512, v 512, o 1024, post_norm 32, gate/up/down 2048 each (9280);
  // layer 1 at 10816; final norm at 20096; lm_head 1536 at 20128; total 21664. No tensor has more
  // than 128 rows, so cuts fall at tensor starts only.
  const model::ParamLayout layout(tiny_config());
  ASSERT_EQ(layout.total(), 21664);
  // 2 ranks: target 10832 lies between layer 1's start 10816 and its q at 10848, 16 from both:
  // a tie goes to the lower.
  EXPECT_EQ(shard_parameters(layout, 2)->bounds, (std::vector<int64_t>{0, 10816, 21664}));
  // 3 ranks: targets 7221.3 (between gate's end 6720 and up's end 8768: 6720 is nearer) and
  // 14442.7 (between layer 1's gate at 13952 and up at 16000: 13952).
  const ShardLayout three = *shard_parameters(layout, 3);
  EXPECT_EQ(three.bounds, (std::vector<int64_t>{0, 6720, 13952, 21664}));
  EXPECT_EQ(three.counts(), (std::vector<int64_t>{6720, 7232, 7712}));
  EXPECT_EQ(three.largest(), 7712);
  EXPECT_EQ(shard_parameters(layout, 1)->bounds, (std::vector<int64_t>{0, 21664}));
  EXPECT_EQ(shard_parameters(layout, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardParameters, CutsAreBlockAlignedNearestAndCoverEverything) {
  // Tensors larger than one block (vocab 300 and 384-wide MLPs: cuts inside them), odd sizes, a
  // tied and an untied head, 2..8 ranks.
  for (bool tied : {false, true}) {
    model::ModelConfig c = tiny_config();
    c.vocab_size = 300;
    c.hidden_size = 160;
    c.num_attention_heads = 5;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.intermediate_size = 384;
    c.num_hidden_layers = 3;
    c.tie_word_embeddings = tied;
    const model::ParamLayout layout(c);
    std::vector<int64_t> all_allowed;
    for (int64_t x = 0; x <= layout.total(); ++x) {
      if (allowed(layout, x)) all_allowed.push_back(x);
    }
    for (int ranks = 2; ranks <= 8; ++ranks) {
      const ShardLayout s = *shard_parameters(layout, ranks);
      ASSERT_EQ(s.ranks(), ranks);
      EXPECT_EQ(s.bounds.front(), 0);
      EXPECT_EQ(s.bounds.back(), layout.total());
      for (int r = 1; r < ranks; ++r) {
        const int64_t cut = s.bounds[static_cast<size_t>(r)];
        EXPECT_LE(s.bounds[static_cast<size_t>(r) - 1], cut);
        EXPECT_TRUE(allowed(layout, cut)) << "cut " << cut << " of " << ranks;
        // No allowed point is nearer to r * total / ranks (compared times ranks, exactly).
        const int64_t target = static_cast<int64_t>(r) * layout.total();
        for (int64_t x : all_allowed) {
          if (x < s.bounds[static_cast<size_t>(r) - 1]) continue;
          EXPECT_LE(std::abs(cut * ranks - target), std::abs(x * ranks - target))
              << "cut " << cut << " vs " << x << " for rank " << r << " of " << ranks;
        }
      }
    }
  }
}

TEST(ShardMode, ParsesTheThreeNames) {
  EXPECT_EQ(*parse_shard_mode("none", "--shard"), ShardMode::kNone);
  EXPECT_EQ(*parse_shard_mode("grads_optimizer", "--shard"), ShardMode::kGradsOptimizer);
  EXPECT_EQ(*parse_shard_mode("params", "--shard"), ShardMode::kParams);
  const absl::StatusOr<ShardMode> bad = parse_shard_mode("zero2", "trainer.shard");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "trainer.shard: must be none, grads_optimizer or params, got 'zero2'");
}

// The tiny config's plan (train_backend_test MemoryPlan.HandComputedTinyConfig: N = 21664, FP8
// weights 43760 = embedding 3072 + 2 layers x (18488 FP8 + 256 norms) + final norm 128 + lm_head
// 3072) in a group of 2 with 1 KiB gradient buckets.
TEST(MemoryPlan, ShardedTinyConfigByHand) {
  MemoryPlanInput in;
  in.config = tiny_config();
  in.policy = PrecisionConfig{}.training_policy();
  in.step_tokens = 100;
  in.kv_cache_tokens = 100;
  in.trainers = 2;
  in.grad_bucket_bytes = 1024;
  // none: every rank holds everything, as one trainer.
  const MemoryPlan none = *plan_training_memory(in);
  EXPECT_EQ(none.weights, 43760);
  EXPECT_EQ(none.master, 4 * 21664);
  EXPECT_EQ(none.moments, 8 * 21664);
  EXPECT_EQ(none.grads, 4 * 21664);
  EXPECT_EQ(none.gathered, 0);
  EXPECT_EQ(none.total(), 1087984);
  // grads_optimizer: shards 10816 and 10848 (ShardParameters.TinyConfigByHand); rank 1's is the
  // larger: master 4 x 10848, moments 8 x 10848, grads 4 x 10848 + the bucket pool. With 256-float
  // buckets every tensor is a bucket of its own (each norm of 32 lies between tensors of 512 or
  // more), so the pool holds one backward unit's tensors at a time: the head (lm_head 1536 + final
  // norm 32), a decoder layer (9280) or the embedding (1536); the largest, a layer, 4 x 9280.
  in.shard = ShardMode::kGradsOptimizer;
  const MemoryPlan zero2 = *plan_training_memory(in);
  EXPECT_EQ(zero2.rank, 1);
  EXPECT_EQ(zero2.shard_parameters, 10848);
  EXPECT_EQ(zero2.weights, 43760);
  EXPECT_EQ(zero2.master, 43392);
  EXPECT_EQ(zero2.moments, 86784);
  EXPECT_EQ(zero2.grads, 43392 + 4 * 9280);
  EXPECT_EQ(zero2.activations, none.activations);
  EXPECT_EQ(zero2.kv_cache, none.kv_cache);
  // params: rank 1 keeps layer 1 (18488 + 256), the final norm (128) and lm_head (3072) = 21944
  // (rank 0: 3072 + 18744 = 21816); gathered: two units of the largest, a layer, 2 x 18744.
  in.shard = ShardMode::kParams;
  const MemoryPlan zero3 = *plan_training_memory(in);
  EXPECT_EQ(zero3.rank, 1);
  EXPECT_EQ(zero3.weights, 21944);
  EXPECT_EQ(zero3.weight_parts.fp8, 18488);
  EXPECT_EQ(zero3.weight_parts.bf16, 3072);
  EXPECT_EQ(zero3.weight_parts.fp32, 256 + 128);
  EXPECT_EQ(zero3.gathered, 37488);
  EXPECT_EQ(zero3.master, 43392);
  // One trainer shards nothing.
  in.trainers = 1;
  EXPECT_EQ(plan_training_memory(in)->total(), 1087984);
  // Bad group input names the field.
  in.trainers = 0;
  EXPECT_EQ(plan_training_memory(in).status().message(),
            "memory plan: trainers must be in [1, 64], got 0");
  in.trainers = 2;
  in.grad_bucket_bytes = -1;
  EXPECT_EQ(plan_training_memory(in).status().message(),
            "memory plan: grad_bucket_bytes must be >= 0, got -1");
}

TEST(MemoryPlan, VerdictNamesWhatWouldFit) {
  MemoryPlanInput in;
  in.config = tiny_config();
  in.policy = PrecisionConfig{}.training_policy();
  in.step_tokens = 100;
  in.kv_cache_tokens = 100;
  const MemoryPlan plan = *plan_training_memory(in);
  EXPECT_EQ(memory_verdict(plan, 0), "no budget");
  EXPECT_EQ(memory_verdict(plan, 1087984).rfind("fits: ", 0), 0u) << memory_verdict(plan, 1087984);
  // One byte short: halving the step tokens (832880: activations 439296 for 50 tokens, 80 padded
  // rows; KV 3200) and recomputing (890352: activations 493568) fit, one change each, smaller
  // total first.
  const std::string v = memory_verdict(plan, 1087983);
  EXPECT_EQ(v.rfind("does not fit: ", 0), 0u) << v;
  EXPECT_NE(v.find("would fit with: 50 step tokens ("), std::string::npos) << v;
  EXPECT_LT(v.find("50 step tokens"), v.find("recompute layers (")) << v;
  EXPECT_NE(v.find("--gpu-memory-fraction"), std::string::npos) << v;
  // The trainer's refusal carries the plan and the same verdict.
  const absl::Status s = check_memory_plan(plan, 1087983);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), plan.describe() + ": " + v);
  // A budget only a group fits: with 1 KiB buckets, grads_optimizer + recompute layers needs
  // 43760 + 16 s + 37120 (the bucket pool, ShardedTinyConfigByHand) + 493568 + 6400 per rank, s
  // the largest shard: 10848 with 2 ranks, 7712 with 3. A budget of exactly the 3-rank total names
  // 3 trainers.
  in.grad_bucket_bytes = 1024;
  MemoryPlanInput three = in;
  three.trainers = 3;
  three.shard = ShardMode::kGradsOptimizer;
  three.recompute_layers = true;
  const int64_t budget3 = plan_training_memory(three)->total();
  EXPECT_EQ(budget3, 43760 + 16 * 7712 + 37120 + 493568 + 6400);
  const std::string group = memory_verdict(*plan_training_memory(in), budget3);
  EXPECT_NE(group.find("shard grads_optimizer + 3 trainers + recompute layers ("),
            std::string::npos)
      << group;
  // Below every option tried: activations with recomputation (493568) alone exceed 270000.
  const std::string none_fits = memory_verdict(plan, 270000);
  EXPECT_NE(none_fits.find("no change tried fits"), std::string::npos) << none_fits;
}

std::string source_dir() {
  const char* dir = std::getenv("FP8RL_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// Llama 3.1 8B (configs/models/llama-3.1-8b.json) by hand:
//   parameters: embedding and lm_head 128256 x 4096 = 525336576 each; per layer q, o 4096 x 4096
//   = 16777216, k, v 1024 x 4096 = 4194304, gate, up, down 14336 x 4096 = 58720256, 2 norms of
//   4096: 218112000; 32 layers 6979584000; + final norm 4096 -> N = 8030261248.
//   FP8 weights per layer: blocks q, o 32 x 32 = 1024, k, v 8 x 32 = 256, gate, up, down 112 x 32
//   = 3584 -> 13312; 2 x (218103808 + 4 x 13312) = 436314112; 32 layers 13962051584.
//   bf16 embedding + lm_head 2 x 2 x 525336576 = 2101346304; fp32 norms 4 x 266240 = 1064960.
//   activations (the training step's buffers), 16384 tokens -> 16400 padded rows (a multiple of
//   16 plus 16), each buffer rounded up to 64 floats; recompute: per row one full layer
//   4h + 2 q + 2 kv + 3 f + 2 = 69634, 31 more layer inputs 31 h = 126976, final norm and
//   backward scratch 6 h + 4 + f (tmp) + 2 kv + 3 f = 83972 -> 280582 x 16400 = 4601544800, + the
//   (64 + 16) x 128256 logits chunk 10260480, + 6 row vectors rounded 16400 -> 16448 (288)
//   = 4611805568 values x 4 B = 18447222272. Without recompute: 32 x 69634 + 83972 = 2312260
//   per row -> 37921064000, + 10260480 logits, + 68 row vectors rounded (3264) = 37931327744.
//   KV cache fp8: 2 x 32 layers x 1024 x 16384 tokens = 1073741824.
TEST(MemoryPlan, Llama31EightBOnEightH100s) {
  absl::StatusOr<std::string> text =
      read_text_file(source_dir() + "/configs/models/llama-3.1-8b.json");
  ASSERT_TRUE(text.ok()) << text.status();
  MemoryPlanInput in;
  in.config = *model::parse_model_config(*text);
  in.policy = PrecisionConfig{}.training_policy();
  in.step_tokens = 16384;
  in.kv_cache_tokens = 16384;
  in.recompute_layers = true;
  in.trainers = 8;
  const int64_t n = 8030261248;
  const int64_t budget = static_cast<int64_t>(0.9 * 80 * 1024.0 * 1024.0 * 1024.0);

  const MemoryPlan none = *plan_training_memory(in);
  EXPECT_EQ(none.parameters, n);
  EXPECT_EQ(none.weight_parts.fp8, 13962051584);
  EXPECT_EQ(none.weight_parts.bf16, 2101346304);
  EXPECT_EQ(none.weight_parts.fp32, 1064960);
  EXPECT_EQ(none.master, 4 * n);
  EXPECT_EQ(none.moments, 8 * n);
  EXPECT_EQ(none.grads, 4 * n);
  EXPECT_EQ(none.activations, 18447222272);
  EXPECT_EQ(none.kv_cache, 1073741824);
  EXPECT_GT(none.total(), budget);  // 16 B per parameter alone is 128 GB
  const std::string no = memory_verdict(none, budget);
  // Either shard mode alone fits (recomputation is on); params needs less, so it comes first.
  EXPECT_NE(no.find("would fit with: shard params ("), std::string::npos) << no;
  EXPECT_NE(no.find("; shard grads_optimizer ("), std::string::npos) << no;

  in.shard = ShardMode::kGradsOptimizer;
  const MemoryPlan zero2 = *plan_training_memory(in);
  // A shard is within one piece (at most 128 rows x 14336 of down_proj) of N / 8.
  EXPECT_LE(std::abs(zero2.shard_parameters - n / 8), 128 * 14336);
  EXPECT_EQ(zero2.master, 4 * zero2.shard_parameters);
  EXPECT_EQ(zero2.moments, 8 * zero2.shard_parameters);
  // grads: the shard plus the bucket pool. Every linear (the smallest, k and v, 4194304 values)
  // exceeds a 4 MiB bucket (1048576 floats) and every norm lies between two of them, so each
  // tensor is a bucket of its own and the pool holds one backward unit at a time: the head
  // (lm_head 525336576 + final norm 4096, the largest), a layer (218112000) or the embedding.
  EXPECT_EQ(zero2.grads, 4 * zero2.shard_parameters + 4 * (525336576 + 4096));
  EXPECT_EQ(zero2.weights, none.weights);
  // ~16.06 GB weights + 16 x 1.004e9 + 18.45 GB activations + 1.07 GB KV ~ 52 GB < 77.3 GB.
  EXPECT_LE(zero2.total(), budget);
  EXPECT_EQ(memory_verdict(zero2, budget).rfind("fits: ", 0), 0u);

  // Without recomputation the activations alone (37931327744 x 4 B = 151.7 GB) do not fit.
  in.recompute_layers = false;
  const MemoryPlan full = *plan_training_memory(in);
  EXPECT_EQ(full.activations, 4 * 37931327744ll);
  EXPECT_GT(full.total(), budget);
}

TEST(MemoryPlan, MoonlightConfigIsRefusedByTheParserNamingTheField) {
  absl::StatusOr<std::string> text =
      read_text_file(source_dir() + "/configs/models/moonlight-16b-a3b.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const absl::StatusOr<model::ModelConfig> c = model::parse_model_config(*text);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model_type"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace fp8rl::train
