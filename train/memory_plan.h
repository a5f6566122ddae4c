// The device memory a training step needs, computed from the model config, the training precision
// policy and the step's shape before anything is allocated (docs/design/gpu-training.md "Training
// on the GPU", memory plan): printed when a policy is created, and a RESOURCE_EXHAUSTED error
// naming the parts and what would make it fit when it exceeds the --gpu-memory-fraction budget;
// `fp8rl plan` prints the same plan and verdict for a config, a group size and a shard mode
// (docs/design/sharding.md). The parts are per rank: in a sharded group, those of the rank with
// the largest total.
//
// What each part counts (bytes):
//   weights      working copies the forward and backward read: an FP8 linear its E4M3 codes (1 B)
//                and 128x128 block scales (4 B per block) twice (the fprop blocks and the
//                transposed blocks of the dgrad), a BF16 linear / the embedding / lm_head 2 B per
//                value, norms, biases and routers 4 B.
//                Shard mode params (ZeRO-3): only the rank's shard of them (the block-aligned cut
//                of train/shard.h), plus
//   gathered     (params only) the all-gathered working weights of two units, the one computing
//                and the next one prefetched; a unit is a decoder layer, the embedding, or the
//                final norm with the lm_head; two of the largest.
//   master       fp32 master weights, 4 B per parameter.
//   moments      AdamW m and v, 8 B per parameter.
//   grads        fp32 gradients, 4 B per parameter.
//                Shard modes grads_optimizer and params (ZeRO-2 / -3) in a group of 2 or more:
//                master, moments and grads for the rank's shard only, plus the most the gradient
//                bucket pool (train::GradientBuckets, buckets of grad_bucket_bytes cut at tensor
//                boundaries) holds while one backward unit runs: the buckets of the unit (the
//                head: lm_head and final norm; a decoder layer; the embedding) and, with a tied
//                embedding, the embedding's bucket through the whole backward; the whole array
//                when grad_bucket_bytes is 0.
//   activations  the training step's buffers for step_tokens rows, `activation_value_bytes` per
//                value (4: the engine's step keeps fp32), exactly as engine/train_step.h carves
//                them (engine::train_buffer_floats: rows padded to a multiple of 16 plus 16, each
//                layer's saved activations -- with recomputation only each layer's input and one
//                shared set --, the final norm, one lm_head logits chunk of 64 rows x vocab, and
//                the backward's scratch), plus per sparse layer what the ops keep beside them (an
//                estimate: top_k x 3 x moe_intermediate values and the E router probabilities per
//                token).
//   kv_cache     the step's sequences' K and V in the cache format: 2 x layers x kv_dim x tokens x
//                (1 B fp8, 2 B bf16, 4 B fp32).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/precision.h"
#include "train/shard.h"

namespace fp8rl::train {

struct MemoryPlanInput {
  model::ModelConfig config;
  PrecisionPolicy policy;         // the training policy (linear format, bf16 layers, KV format)
  int64_t step_tokens = 0;        // tokens of the largest forward (minibatch) of a step
  int64_t kv_cache_tokens = 0;    // tokens whose K/V the step's generation caches
  bool recompute_layers = false;  // activation recomputation per layer
  int64_t activation_value_bytes = 4;
  int trainers = 1;                    // ranks of the trainer group, in [1, kMaxPlanTrainers]
  ShardMode shard = ShardMode::kNone;  // what the ranks shard (no effect with one trainer)
  int64_t grad_bucket_bytes = int64_t{4} << 20;  // sharded gradients' bucket (0: none)
};

// The largest group the plan (and its suggestions) consider: trainer.data_parallel's limit.
inline constexpr int kMaxPlanTrainers = 64;

// The working weights by storage: FP8 linears (codes twice and scales), 2-byte tensors (the
// embedding and lm_head, BF16 linears), 4-byte tensors (norms, biases, routers; everything in
// an fp32 policy).
struct WeightBytes {
  int64_t fp8 = 0, bf16 = 0, fp32 = 0;
  int64_t total() const { return fp8 + bf16 + fp32; }
  WeightBytes& operator+=(const WeightBytes& o) {
    fp8 += o.fp8;
    bf16 += o.bf16;
    fp32 += o.fp32;
    return *this;
  }
};

struct MemoryPlan {
  int64_t weights = 0, gathered = 0, master = 0, moments = 0, grads = 0, activations = 0,
          kv_cache = 0;
  WeightBytes weight_parts;      // weights by storage (sums to weights)
  int rank = 0;                  // the rank these parts are for (the largest total)
  int64_t shard_parameters = 0;  // parameters whose master and moments this rank keeps
  int64_t parameters = 0;        // parameters of the model
  int64_t total() const {
    return weights + gathered + master + moments + grads + activations + kv_cache;
  }
  // "memory plan: weights 2.3 GiB, master 4.6 GiB, ... = 20.1 GiB (16384 step tokens, ...)",
  // in a group followed by ", per rank: rank 0 of 8, shard grads_optimizer, 1003520000 of
  // 8030261248 parameters".
  std::string describe() const;
  MemoryPlanInput input;
};

// INVALID_ARGUMENT naming the field for negative tokens, a config without layers, trainers
// outside [1, kMaxPlanTrainers] or a negative bucket.
absl::StatusOr<MemoryPlan> plan_training_memory(const MemoryPlanInput& input);

// The verdict against a device budget, one line, the same in `fp8rl plan` and in the trainer's
// refusal: "fits: 45.123 GiB of 72.000 GiB" or "does not fit: 150.312 GiB > 72.000 GiB; would fit
// with: recompute layers (70.1 GiB); shard grads_optimizer + recompute layers (46.2 GiB); ..."
// (up to three of the changes that fit, fewest changes first, then smallest; the changes tried:
// recompute layers, each shard mode, more trainers up to kMaxPlanTrainers with a shard mode,
// fewer step tokens), always ending with "; or a larger budget (--gpu-memory-fraction, a larger
// device)". budget_bytes <= 0: "no budget".
std::string memory_verdict(const MemoryPlan& plan, int64_t budget_bytes);

// OK when plan.total() <= budget_bytes; RESOURCE_EXHAUSTED otherwise: describe() and
// memory_verdict(), naming every part, the budget and what would make it fit. budget_bytes <= 0:
// no budget (OK).
absl::Status check_memory_plan(const MemoryPlan& plan, int64_t budget_bytes);

}  // namespace fp8rl::train
