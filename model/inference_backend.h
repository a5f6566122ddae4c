// The device boundary of generation and scoring: one interface over the KV-cache forward (batched
// prefill + incremental decode over a block-budgeted KV cache, then logits or sampled tokens) so
// the generator, the scheduler and `fp8rl generate|score` run on the CPU or on a CUDA device
// through the same calls (docs/design/gpu.md "GPU engine").
//
// The CPU implementation (make_cpu_backend, engine/cpu/cpu_backend.cc) runs the decoder engine's
// step (engine/decoder_step.h) over its CPU ops and a paged KV pool (dense and mixture-of-experts
// models); its logprobs equal the training forward's (engine/train_step.h train_forward) bit for
// bit for bf16 and FP8 linears (tests/unit/engine/decoder_step_test.cc SamplerLearnerTest), and
// score() is that training forward itself (engine::cpu_logprobs). The CUDA implementation
// (engine/cuda/cuda_backend.h, make_cuda_backend) computes the same recipe on the device.
//
// KV memory is counted in blocks of `kv_block_tokens` positions on both devices: a sequence of
// capacity C holds ceil(C / kv_block_tokens) blocks from new_sequence() until its KvSequence is
// destroyed, so a scheduler admits requests by free blocks (memory().kv_blocks_free). Blocks are
// reserved for the whole capacity at once: a running sequence never runs out of cache.
//
// Threading: one backend is used by one thread at a time (the generation loop); KvSequence
// objects belong to the backend that made them and may outlive it (they keep its pool alive).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace fp8rl::model {

enum class Device { kCpu, kCuda };
std::string_view device_name(Device d);  // "cpu" | "cuda"
// "cpu" | "cuda"; anything else: InvalidArgument "unknown device 'x' (expected cpu or cuda)".
absl::StatusOr<Device> parse_device(std::string_view name);

struct BackendOptions {
  // Bytes the backend may use for weights, KV blocks and scratch. CUDA: required (> 0; the caller
  // derives it from --gpu-memory-fraction); the KV pool gets what weights and scratch leave.
  // CPU: 0 = no limit (KV blocks are counted but never refused); > 0 bounds the KV blocks only.
  int64_t memory_budget_bytes = 0;
  int64_t kv_block_tokens = 16;  // positions per KV block, >= 1
  // Most rows one forward() may carry (prefill tokens + decode rows); sizes the CUDA scratch.
  // The CPU backend does not bound it.
  int64_t max_step_tokens = 2048;
  // Device copies of the weights (CUDA; 1 or 2, else InvalidArgument). With 2, prepare_model()
  // copies the next version into the idle copy while the other serves, and set_model() of that
  // version only switches between them (install in place on the device). The CPU backend serves
  // the host Model itself and ignores it.
  int64_t weight_slots = 1;
};

struct BackendMemory {
  int64_t budget_bytes = 0;     // BackendOptions::memory_budget_bytes (0: unbounded CPU)
  int64_t weight_bytes = 0;     // weights as held by the device (all weight slots)
  int64_t weight_slots = 1;     // device copies of the weights (CUDA: BackendOptions::weight_slots)
  int64_t scratch_bytes = 0;    // activations and workspaces (CUDA), 0 on the CPU
  int64_t kv_block_tokens = 0;  // positions per block
  int64_t kv_block_bytes = 0;   // K + V bytes of one block over all layers
  int64_t kv_blocks_total = 0;  // the pool (CPU without a budget: -1, unbounded)
  int64_t kv_blocks_used = 0;   // held by live sequences
  int64_t kv_blocks_free() const {
    return kv_blocks_total < 0 ? -1 : kv_blocks_total - kv_blocks_used;
  }
};

// One sequence's KV cache: `capacity` positions reserved in blocks. Destroying it frees its
// blocks. Only the backend that made it can run it.
class KvSequence {
 public:
  virtual ~KvSequence() = default;
  virtual int64_t capacity() const = 0;
  virtual int64_t blocks() const = 0;
};

// n new tokens at positions [pos0, pos0 + n) of `kv` (which already holds [0, pos0)).
struct BackendSegment {
  KvSequence* kv = nullptr;
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  int64_t pos0 = 0;
  // Mixture of experts (nullable): forward() appends the experts each of the n tokens went to,
  // [n, sparse layers, top_k] (Model::routing_width() values per token; the routing record of
  // model/model.h TokenRouting that the trainer replays). Nothing is appended for a dense model.
  // The CUDA backend refuses MoE models, so it never has a record to append.
  std::vector<int32_t>* routing = nullptr;
};

// What forward_sample() draws for one segment: from the logits of its last token, with its own
// random stream (advanced in place exactly as Sampler::sample advances it on the CPU).
struct SampleSpec {
  const SamplingParams* params = nullptr;
  Rng* rng = nullptr;
};
struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;       // under the distribution sampled from (model/sampler.h)
  float full_logprob = 0.0f;  // under softmax(logits / T)
};

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;

  virtual Device device() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const PrecisionPolicy& policy() const = 0;

  // Replaces the weights with `model`'s (same config and policy, else InvalidArgument; while
  // sequences are alive, FailedPrecondition). CUDA: copied into the device weights (1 slot), or
  // into the idle slot unless prepare_model(model) already did, then switched to (2 slots).
  virtual absl::Status set_model(std::shared_ptr<const Model> model) = 0;
  // Starts making `model` the next weights without touching the ones being served, so a later
  // set_model(model) only switches; allowed while sequences are alive. `model` must not change
  // until that set_model (the worker's weight slots guarantee it). Same InvalidArgument checks as
  // set_model. CUDA with 2 weight slots: the host-side part of the copy (through pinned staging
  // buffers) runs in the call, the transfers into the idle device slot on a copy stream, in
  // parallel with forward passes on the serving slot. Otherwise (CPU, 1 slot): nothing to do.
  virtual absl::Status prepare_model(std::shared_ptr<const Model> model) {
    (void)model;
    return absl::OkStatus();
  }

  // A KV cache for one sequence of up to `capacity` positions (1 <= capacity <=
  // max_position_embeddings, else InvalidArgument). ResourceExhausted when the pool lacks the
  // blocks (the message says how many were asked for and how many are free).
  virtual absl::StatusOr<std::unique_ptr<KvSequence>> new_sequence(int64_t capacity) = 0;
  // Blocks a sequence of `capacity` positions takes: ceil(capacity / kv_block_tokens).
  int64_t blocks_for(int64_t capacity) const;

  // Runs the segments (prefill and/or decode rows of many sequences in one batch), appending to
  // their caches; writes the logits of each segment's last token to host logits[i * vocab].
  // InvalidArgument for a segment that does not fit its cache, a token out of range, a foreign
  // KvSequence, or (CUDA) more rows than max_step_tokens.
  virtual absl::Status forward(const std::vector<BackendSegment>& segments, float* logits) = 0;
  // forward() then one token per segment from spec[i] (same size as segments), into out.
  virtual absl::Status forward_sample(const std::vector<BackendSegment>& segments,
                                      const std::vector<SampleSpec>& spec,
                                      std::vector<SampledToken>* out) = 0;
  // Scoring: the training forward (no KV cache) -- per sequence, n-1 logprobs of each next token
  // at `temperature`.
  virtual absl::StatusOr<TokenValues> score(const TokenBatch& batch, float temperature) = 0;

  virtual BackendMemory memory() const = 0;
  // Whether one forward() is bounded to BackendOptions::max_step_tokens rows (CUDA: its scratch
  // is sized for them). The CPU backend grows its scratch, so a longer prompt still runs (alone).
  virtual bool bounds_step_rows() const { return true; }
};

// Host-side bookkeeping of a pool of KV blocks (ids 0..total-1; total < 0: unbounded, ids are
// then never handed out). Used by both backends; the CUDA one maps ids to device memory.
class KvBlockPool {
 public:
  explicit KvBlockPool(int64_t total);
  int64_t total() const { return total_; }
  int64_t used() const { return used_; }
  int64_t free() const { return total_ < 0 ? -1 : total_ - used_; }
  // n block ids (lowest free first), or ResourceExhausted "KV cache: n blocks asked, f free".
  absl::StatusOr<std::vector<int32_t>> acquire(int64_t n);
  // Returns blocks from acquire() (or, unbounded, the count n of an acquire with no ids).
  void release(const std::vector<int32_t>& ids, int64_t n);

 private:
  int64_t total_;
  int64_t used_ = 0;
  std::vector<int32_t> free_;  // a stack; the lowest id on top
};

// K + V bytes of one block of `block_tokens` positions over all layers in `dtype`.
int64_t kv_block_bytes(const ModelConfig& config, KvCacheDtype dtype, int64_t block_tokens);
// InvalidArgument naming the field for a negative budget, block size < 1, max_step_tokens < 1.
absl::Status check_backend_options(const BackendOptions& options);
// forward_sample's argument check, shared by every backend: one spec per segment (InvalidArgument
// "forward_sample: N sample specs for M segments"), each with params and rng ("spec i lacks ...").
absl::Status check_sample_specs(const std::vector<BackendSegment>& segments,
                                const std::vector<SampleSpec>& spec);

// The CPU backend over `model` (shared with the caller; it must be a KV-cache capable model).
// Defined in engine/cpu/cpu_backend.cc (fp8rl_engine_cpu).
absl::StatusOr<std::unique_ptr<InferenceBackend>> make_cpu_backend(
    std::shared_ptr<const Model> model, const BackendOptions& options);

// The CUDA backend (engine/cuda/): weights copied to the device as the payload holds them.
// FailedPrecondition when this build has no CUDA ("built without CUDA"), when no sm_90 device is
// visible, or for a model the CUDA path does not run ("MoE not on CUDA"). Defined in
// engine/cuda/cuda_backend.cc, or in inference_backend.cc when CUDA is not built.
absl::StatusOr<std::unique_ptr<InferenceBackend>> make_cuda_backend(
    std::shared_ptr<const Model> model, const BackendOptions& options);
// True when this build has CUDA and an sm_90 device is visible (the --device default).
bool cuda_backend_available();
// FP8RL_HAVE_CUDA builds only: the reason cuda_backend_available() is false ("" when true).
std::string cuda_backend_unavailable_reason();

}  // namespace fp8rl::model
