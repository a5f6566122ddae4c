// The Llama/Qwen2/Qwen3 decoder's configuration, parameters and I/O: HF checkpoints in and out,
// the fp32 master and the working copies each precision policy derives from it (FP8 codes and
// block scales, bf16, the transposed dgrad blocks), KV scales, sharding of the master, and read
// access to every operand for the decoder engine (engine/), which runs every forward and backward
// over it: the KV-cache step for generation, the training forward (logprobs, scoring, KV
// calibration) and the backward, on the CPU (engine/cpu/) or a GPU (engine/cuda/). Every linear
// layer runs in the policy's format through model/linear.h.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/gradient_sink.h"
#include "model/kv_cache.h"
#include "model/kv_calibration.h"
#include "model/linear.h"
#include "model/moe.h"
#include "model/params.h"
#include "model/precision.h"
#include "model/weight_set.h"
#include "model/weight_view.h"

namespace fp8rl::model {

// Checkpoint / payload formats. kFP8: linear weights F8_E4M3 + "<name>_scale_inv" F32
// [ceil(N/128), ceil(K/128)] (layers the policy keeps bf16 stay BF16), everything else BF16.
// Every format carries "model.layers.{i}.self_attn.k_scale" / "v_scale" (F32 scalars).
enum class WeightFormat { kF32, kBF16, kFP8 };
absl::StatusOr<WeightFormat> parse_weight_format(std::string_view name);  // f32|bf16|fp8

// A list of independent token sequences (causal attention within each; "packed" batch).
using TokenBatch = std::vector<std::vector<int32_t>>;
// Per sequence, n-1 values: [i-1] belongs to token i (log p(tokens[i] | tokens[:i])).
using TokenValues = std::vector<std::vector<float>>;
// Mixture-of-experts routing, per sequence: the experts each token was sent to, row-major
// [tokens, sparse layers, top_k] (Model::routing_width() values per token). A record may cover
// fewer tokens than the sequence (generation never feeds its last sampled token).
using TokenRouting = std::vector<std::vector<int32_t>>;

// Checks a routing record against a model config and the lengths of the batch's sequences: one
// entry per sequence, each at most its tokens x (sparse layers x top_k) ids, ids in [0, E), no
// id twice within a token's layer. InvalidArgument naming the sequence and token
// (Model::check_routing, and the engine's training step, engine/train_step.h).
absl::Status check_routing(const ModelConfig& config, const std::vector<int64_t>& lengths,
                           const TokenRouting& routing);

// What a mixture-of-experts forward reports about its routing.
struct ForwardRouting {
  TokenRouting used;  // per sequence, every token: the experts it ran through
  // Per sequence, every token: the router's own top-k (the same as `used` without replay).
  TokenRouting chosen;
  // Replay only: tokens that had a record, and those of them whose router would have chosen a
  // different set of experts in at least one sparse layer (the disagreement replay removed).
  int64_t replayed_tokens = 0, replay_overrode = 0;
  std::vector<int64_t> expert_tokens;  // [sparse layers, E]: rows routed to each expert
  double aux_loss = 0.0;  // load-balancing loss (before its coefficient), over every sparse layer
};

class Model {
 public:
  // Random init: linear/embedding weights N(0, init_std), norms 1, biases 0.
  static absl::StatusOr<std::unique_ptr<Model>> Init(const ModelConfig& config,
                                                     const PrecisionPolicy& policy, uint64_t seed,
                                                     float init_std = 0.02f);
  // An HF checkpoint folder (F32/BF16/F16 or FP8 block weights; FP8 weights are used as is,
  // codes and scales, by layers the policy runs in FP8).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const PrecisionPolicy& policy);
  static absl::StatusOr<std::unique_ptr<Model>> FromWeightSet(const WeightSet& set,
                                                              const PrecisionPolicy& policy);
  // FromWeightSet over views (the full model: fp32 master, working copies, backward operands).
  static absl::StatusOr<std::unique_ptr<Model>> FromWeightView(const WeightView& view,
                                                               const PrecisionPolicy& policy);

  // An inference-only model (docs/design/weight-sync.md "Installing a weight version in place"): it
  // holds what the engine's KV-cache step reads and nothing else -- FP8 layers: the E4M3 codes and
  // 128x128 scales as received (no re-quantization, no transposed blocks); BF16 layers and lm_head:
  // the double-accumulation operand; the embedding table as bf16 values (tied to lm_head: held
  // once, as the double operand, and looked up from there); norms, biases, KV scales. No fp32
  // master: params() is empty, refresh() does nothing, export_weights()/save() fail and backward()
  // must not be called. Starts without weights; install() writes a version into it. InvalidArgument
  // for a bad config or policy.linear fp32 (use FromWeightView for fp32).
  static absl::StatusOr<std::unique_ptr<Model>> ForInference(const ModelConfig& config,
                                                             const PrecisionPolicy& policy);
  // A description of a model whose weights live elsewhere (a device training backend,
  // train/device_train_backend.h): config, policy, layout, KV scales, token and routing checks,
  // and no weight storage at all (no master, no working copies, no RoPE tables). Every compute
  // and export entry point (forward, logits, backward, export_weights, save,
  // install) is FailedPrecondition. InvalidArgument for a bad config.
  static absl::StatusOr<std::unique_ptr<Model>> ForDescription(const ModelConfig& config,
                                                               const PrecisionPolicy& policy);
  bool description_only() const { return storage_ == Storage::kNone; }
  // Writes version `view` into this inference-only model's storage in place: buffers keep their
  // size from one version to the next, so after the first install nothing is allocated. FP8
  // layers take F8_E4M3 codes + "<name>_scale_inv" as they are (BF16/F32 weights are quantized
  // with the policy's recipe); other tensors are converted to the forward's formats. Generation
  // is bit-identical to FromWeightView(view, policy()). Errors name the tensor: NotFound for a
  // missing tensor, InvalidArgument for a wrong shape or dtype, a non-finite value or scale, or a
  // NaN code. After an error the weights are unspecified until the next successful install().
  // FailedPrecondition on a model that is not inference-only.
  absl::Status install(const WeightView& view);
  bool inference_only() const { return storage_ != Storage::kTraining; }
  // FailedPrecondition naming `what` on a description-only model (ForDescription: no weights
  // here; the engine's CPU ops need them).
  absl::Status check_has_weights(std::string_view what) const;
  // Bytes of weight storage this model holds (master, working copies, operands, norms).
  int64_t weight_bytes() const;

  // Tensors in checkpoint layout, with config.json and the version. On a sharded master:
  // FAILED_PRECONDITION when export_needs_master(format); then the overload below, with the
  // whole master gathered by the caller (num_params() floats in layout order).
  absl::StatusOr<WeightSet> export_weights(WeightFormat format, int64_t version = 0) const;
  absl::StatusOr<WeightSet> export_weights(WeightFormat format, int64_t version,
                                           std::span<const float> whole_master) const;
  // Writes an HF checkpoint folder atomically.
  absl::Status save(const std::string& dir, WeightFormat format = WeightFormat::kF32) const;

  const ModelConfig& config() const { return config_; }
  const PrecisionPolicy& policy() const { return policy_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total(); }
  // The fp32 master parameters (flat, layout() order). After changing them call refresh().
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }
  // Re-derives every working copy (bf16 rounding, FP8 requantization with fresh block scales).
  // A model loaded from an FP8 checkpoint runs the checkpoint's codes and scales as they are until
  // the first refresh(), which derives them from the master like every other layer (a test pins
  // that the first update reaches the FP8 layers). Does nothing on a sharded master
  // (shard_master): install_working() sets them there.
  void refresh();

  // ZeRO-2, the fp32 master per shard (docs/design/sharding.md "ZeRO-2 in the learner"). The
  // working copies a sharded group all-gathers travel in three streams, each in flat parameter
  // order: E4M3 codes (FP8 linears, row-major [rows, cols]), their 128x128 block scales (row-major
  // [ceil(rows/128), ceil(cols/128)]), and bf16 bit patterns of every other tensor (bf16 linears,
  // embedding, lm_head, routers, norms, biases: the bf16-rounded master each working copy holds).
  // The transposed dgrad blocks do not travel: transpose_blocks is an exact byte transpose.
  struct WorkingStreams {
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    std::vector<uint16_t> bf16;
  };
  struct WorkingCounts {
    int64_t codes = 0, scales = 0, bf16 = 0;
  };
  // Whether a shard may start or end at flat offset `at`: the end of the layout, a tensor's
  // start, or a 128-row boundary inside a 2-D tensor (train::shard_parameters' cut points).
  bool shard_cut_allowed(int64_t at) const;
  // Sizes of the streams of the flat range [begin, end) (cut points as above; INVALID_ARGUMENT
  // otherwise, naming the offset).
  absl::StatusOr<WorkingCounts> working_counts(int64_t begin, int64_t end) const;
  // The working copies of [begin, end) derived from the master this model holds (the whole
  // master, or its shard: then [begin, end) must lie inside it), exactly as refresh() derives
  // them: FP8 block rows quantized with fresh scales, everything else rounded to bf16.
  // FAILED_PRECONDITION under a policy with fp32 working copies (fp32 activations or linears).
  absl::StatusOr<WorkingStreams> encode_working(int64_t begin, int64_t end) const;
  // Sets every working copy from whole streams (every shard's encode_working concatenated in
  // rank order, which is flat order). Bit for bit what refresh() gives from the whole master.
  // INVALID_ARGUMENT when a stream's size does not match the layout (nothing changed then).
  absl::Status install_working(const WorkingStreams& all);
  // ZeRO-3 (docs/design/sharding.md): installs the working copies of the whole tensors in
  // [begin, end) from `streams` (their encode_working streams, concatenated in flat order),
  // norms and biases included, bit for bit what install_working gives them. INVALID_ARGUMENT
  // when the range cuts a tensor or a stream's size does not match (nothing changed then).
  absl::Status install_working_range(const WorkingStreams& streams, int64_t begin, int64_t end);
  // Frees the working copies (FP8 codes, scales, transposed blocks, bf16 and double operands) of
  // the linears, routers, embedding and lm_head whose tensors lie in [begin, end); norms and
  // biases stay. install_working_range brings them back. INVALID_ARGUMENT when the range cuts a
  // tensor.
  absl::Status drop_working_range(int64_t begin, int64_t end);
  // Keeps the fp32 master of [begin, end) only (new storage: the rest is returned to the
  // allocator); params() is then that shard and master_begin() its first parameter. The working
  // copies stay whole. INVALID_ARGUMENT for a range that is not between cut points;
  // FAILED_PRECONDITION when already sharded, for a model without a master, or under a policy
  // whose working copies read the master (fp32 activations or linears).
  absl::Status shard_master(int64_t begin, int64_t end);
  bool master_sharded() const { return master_sharded_; }
  int64_t master_begin() const { return master_begin_; }
  // Whether export_weights(format) needs the whole fp32 master: always for kF32; the other
  // formats can be written from the working copies when each tensor's working copy holds its
  // output bits (FP8 codes and scales of FP8 linears, the bf16 of every bf16 working copy), as
  // they are on a sharded master.
  bool export_needs_master(WeightFormat format) const;

  const KvScales& kv_scales() const { return kv_scales_; }
  absl::Status set_kv_scales(const KvScales& scales);

  // Checks every id is in [0, vocab_size) and the length fits max_position_embeddings.
  absl::Status check_tokens(const std::vector<int32_t>& tokens, int64_t extra = 0) const;

  // Values per token of a routing record: sparse layers x top_k (0 for a dense model).
  int64_t routing_width() const;
  // Checks a routing record against the model: per sequence at most its tokens, ids in [0, E),
  // no id twice within a token's layer. Errors name the sequence and token.
  absl::Status check_routing(const TokenBatch& batch, const TokenRouting& routing) const;

  // Read-only access to the KV-cache step's operands for the decoder engine's ops (engine/cpu/,
  // engine/cuda/): linear j of layer l (j = 0..6: q k v o gate up down), the embedding table and
  // lm_head as the forward uses them, norm weights and biases by layout offset (bf16-rounded when
  // activations are bf16), and the RoPE tables [max_position_embeddings, head_dim / 2].
  const LinearWeight& layer_linear(int64_t l, int64_t j) const { return linears_[l][j]; }
  const LinearWeight& embedding_weight() const { return embed_w_; }
  const LinearWeight& lm_head_weight() const { return head(); }
  const float* norm_or_bias(int64_t offset) const { return small_param(offset); }
  std::span<const float> rope_cos() const { return rope_cos_; }
  std::span<const float> rope_sin() const { return rope_sin_; }
  // A sparse layer's router and experts (config().sparse_layer(l)) and the options its
  // moe_forward runs with.
  const MoeLayerWeights& moe_layer(int64_t l) const { return moe_[l]; }
  MoeOptions moe_options() const;

 private:
  // What a model holds: the fp32 master and every working copy (training), the KV-cache
  // forward's operands only (inference, ForInference), or nothing (ForDescription).
  enum class Storage { kTraining, kInference, kNone };
  Model(const ModelConfig& config, const PrecisionPolicy& policy,
        Storage storage = Storage::kTraining);
  struct Source;
  absl::Status load_from(const Source& source);
  // Sharded master (model_shard.cc): whether parameter `pi`'s working copy is FP8 codes and
  // scales; FAILED_PRECONDITION naming `what` when some working copy reads the fp32 master
  // itself (fp32 linears or activations); the bf16 value of element i of parameter pi's working
  // copy (exactly the bf16 rounding of its master value, for a non-FP8 working copy).
  bool fp8_working(size_t pi) const;
  absl::Status check_bf16_working(std::string_view what) const;
  // Checks [begin, end) holds whole tensors only; INVALID_ARGUMENT naming `what`.
  absl::Status check_whole_tensors(int64_t begin, int64_t end, std::string_view what) const;
  // install_working's step for parameter pi: its working copy from the streams at *codes,
  // *scales, *bits (advanced past it); norms and biases go to `small` (small_ when null).
  void install_working_tensor(size_t pi, const uint8_t** codes, const float** scales,
                              const uint16_t** bits, std::vector<float>* small);
  float working_bf16_value(size_t pi, int64_t i) const;

  // Working copy of a norm weight or bias (bf16-rounded when activations are bf16) by offset.
  const float* small_param(int64_t offset) const;
  const LinearWeight& head() const;
  // install() of one linear weight of layer l.
  absl::Status install_linear(const WeightView& view, const TensorView& t, int64_t l,
                              LinearWeight& w, const std::string& what);

  ModelConfig config_;
  PrecisionPolicy policy_;
  ParamLayout layout_;
  Storage storage_ = Storage::kTraining;
  // The fp32 master: every parameter, or [master_begin_, master_begin_ + size) once sharded.
  std::vector<float> params_;  // empty unless storage_ is kTraining
  bool master_sharded_ = false;
  int64_t master_begin_ = 0;
  std::vector<std::array<LinearWeight, 7>> linears_;  // q k v o gate up down
  LinearWeight embed_w_, head_w_;
  std::vector<float> rope_cos_, rope_sin_;
  KvScales kv_scales_;
  std::vector<MoeLayerWeights> moe_;  // per layer; used by sparse layers only
  // Per parameter index: its working copy (kLinear: a LinearWeight, kRouter: a RouterWeight),
  // nullptr for other kinds.
  std::vector<LinearWeight*> linear_of_;
  std::vector<RouterWeight*> router_of_;
  std::vector<float> small_;  // norms and biases as the forward uses them
  std::vector<std::pair<int64_t, int64_t>> small_index_;  // (param offset, offset in small_)
};

// Sharding's rules for anything that holds a layout and a policy without a Model (the device
// trainer state, engine/train_state.h); Model's members of the same names apply them.
// Whether a shard may start or end at flat offset `at` of `layout`: the end, a tensor's start, or
// a 128-row boundary inside a 2-D tensor.
bool shard_cut_allowed(const ParamLayout& layout, int64_t at);
// FAILED_PRECONDITION "<what>: the policy has fp32 working copies ..." when `policy` runs fp32
// activations or an fp32 linear layer (its working copies read the fp32 master itself).
absl::Status check_bf16_working(const ModelConfig& config, const PrecisionPolicy& policy,
                                std::string_view what);

}  // namespace fp8rl::model
