// The training forward and backward of the decoder over packed sequences, written once against an
// abstract set of ops (TrainOps), so the CUDA trainer (CudaTrainOps, engine/cuda/cuda_train_ops.h)
// and the CPU ops (CpuTrainOps, engine/cpu/train_ops.h) run the same sequence of
// operations with the same BF16 rounding points, the same FP8 KV fake-quantization and the same
// backward. It is the decoder's only training forward and backward: CPU training, scoring, the
// reference policy's logprobs and KV calibration run it over the CPU ops (train/train_backend.cc,
// engine/cpu/cpu_backend.cc), the CUDA trainer over the device ops. The CPU ops are checked
// against float64 PyTorch references (tests/reference) and against the KV-cache decode step
// (tests/unit/engine/decoder_step_test.cc); the device ops op by op against the host ops in
// tests/gpu (docs/design/gpu-training.md "Training step on the device").
//
// Use (one micro-batch):
//   auto t = build_train_tables(batch, config);            // host
//   TrainBuffers b = carve_train_buffers(config, t->rows, opts, base);  // base: ops memory of
//                                                          // train_buffer_floats(...) floats
//   auto logp = train_forward(config, policy, layout, ops, b, *t, opts);  // host TokenValues
//   ... the loss gives dL/dlogp per token (same shape as logp) ...
//   train_backward(config, policy, layout, ops, b, *t, dlogp, grads, opts);  // grads: ops memory
// CpuTrainStep (engine/cpu/train_ops.h) and CudaTrainStep (cuda_train_ops.h) wrap these calls for
// one micro-batch. A mixture-of-experts layer runs through TrainOps::moe / moe_backward, with
// routing replay, the routing report and the load-balancing loss (TrainStepOptions);
// CpuTrainOps implements them with model/moe.h, CudaTrainOps does not (FailedPrecondition: MoE
// training on CUDA is not built).
//
// Plain C++ (no CUDA headers): built and tested in every build.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/gradient_sink.h"
#include "model/kv_calibration.h"
#include "model/model.h"
#include "model/params.h"
#include "model/precision.h"

namespace fp8rl::engine {

// ---- Step tables (host) ------------------------------------------------------------------------

// The packed batch as the kernels see it: sequence s holds rows [seq_start[s], seq_start[s + 1]).
//   tokens[rows], pos[rows] (position within its sequence), row_seq[rows], seq_start[n_seq + 1]
//   targets[rows]: the next token of each row, -1 at each sequence's last row (no logprob there)
struct TrainTables {
  int64_t rows = 0, n_seq = 0;
  std::vector<int32_t> tokens, pos, row_seq, seq_start, targets;
};

// InvalidArgument (naming the sequence) for an empty batch or sequence, a token id outside
// [0, vocab) or a sequence longer than max_position_embeddings.
absl::StatusOr<TrainTables> build_train_tables(const model::TokenBatch& batch,
                                               const model::ModelConfig& config);

// ---- Ops ---------------------------------------------------------------------------------------

// The routing of one sparse layer's forward, in host memory (TrainOps::moe): rows x k values in
// sel and router_sel, rows in overrode, rows x E in probs.
struct MoeRouteHost {
  std::vector<int32_t> sel;         // the experts each row ran through (the forced ones if given)
  std::vector<int32_t> router_sel;  // the router's own top-k, in descending probability
  std::vector<uint8_t> overrode;    // forced rows: 1 where the router's own set differs
  std::vector<float> probs;         // the router's softmax (load-balancing statistics)
};

// Every float pointer below is in the ops' memory space (host for CpuTrainOps, device for CUDA)
// unless its name ends in _host. Shapes: x is [rows, hidden]; q [rows, heads * head_dim]; k, v
// [rows, kv_heads * head_dim]; z (logits) [rows, vocab]. Row arguments named `row0` index the
// loaded tables (targets, positions) for ops that work on a slice of the packed rows.
class TrainOps {
 public:
  virtual ~TrainOps() = default;
  // Makes the step's tables available to the ops below (the device copies them).
  virtual absl::Status load_tables(const TrainTables& t) = 0;

  // ---- forward ----
  // x[r] = embedding[tokens[r]] for every row of the tables.
  virtual absl::Status embed(float* x) = 0;
  // y = rmsnorm(x) * g over rows of width h (eps from the config), inv[r] = 1/rms (nullable),
  // y rounded to bf16 when rb. y may equal x.
  virtual absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, bool rb,
                               float* y, float* inv) = 0;
  // RoPE of every head of x in place at the tables' positions (all rows), rounded to bf16 when
  // rb; inverse: the transposed rotation (the backward), never rounded.
  virtual absl::Status rope(int64_t heads, bool rb, bool inverse, float* x) = 0;
  // y[rows, out] = x . W^T (+ bias) in the weight's precision, rounded to bf16 unless fp32
  // (model/linear.h linear_forward). layer = -1: lm_head; j = 0..6: q k v o gate up down.
  virtual absl::Status linear(int64_t layer, int64_t j, const float* x, int64_t rows,
                              const float* bias, float* y) = 0;
  // amax over each sequence's rows of k and v ([rows, kv_dim]) into k_amax_host / v_amax_host
  // [n_seq] (KV calibration; waits for the result).
  virtual absl::Status seq_amax(const float* k, const float* v, float* k_amax_host,
                                float* v_amax_host) = 0;
  // k, v [rows, kv_dim] in place through the policy's KV cache format with layer `layer`'s scales
  // (model/kv_cache.h kv_round_trip); the caller calls it only when the policy fake-quantizes.
  virtual absl::Status kv_fake_quant(int64_t layer, float* k, float* v) = 0;
  // Causal GQA attention over the packed sequences (each row attends to its sequence's rows up
  // to itself): o [rows, heads * head_dim].
  virtual absl::Status attention(const float* q, const float* k, const float* v, float* o) = 0;
  virtual absl::Status swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) = 0;
  // y += x over n values, then bf16 rounding when rb.
  virtual absl::Status add(float* y, const float* x, int64_t n, bool rb) = 0;
  virtual absl::Status round_bf16(float* x, int64_t n) = 0;
  // For rows [row0, row0 + rows) of the tables: lse[i] = log sum exp(z[i] / T) and
  // logprob[i] = z[i][targets[row0 + i]] / T - lse[i] (z is [rows, vocab], inv_t = 1 / T).
  virtual absl::Status log_softmax(const float* z, int64_t row0, int64_t rows, float inv_t,
                                   float* lse, float* logprob) = 0;

  // Sparse layer `layer`'s MLP (model/moe.h moe_forward: router, top-k, the experts' grouped
  // SwiGLUs, the qwen2_moe shared expert, bf16 rounding when activations are bf16): out [rows, h]
  // from x [rows, h]. forced_host ([rows, k] expert ids, or nullptr) replays a routing record:
  // rows whose first id is >= 0 use those experts, rows holding -1 route freely; ids are checked
  // by the caller. The ops keep what moe_backward needs, per layer; route_host (nullable)
  // receives the routing.
  virtual absl::Status moe(int64_t layer, const float* x, int64_t rows, const int32_t* forced_host,
                           MoeRouteHost* route_host, float* out) = 0;

  // ---- backward ----
  // In place on z [rows, vocab] (the logits of rows [row0, row0 + rows)): the gradient of
  // sum_i dlogp[i] * logprob[i] with respect to z, dz[j] = -g exp(z[j]/T - lse) / T, plus g / T at
  // the target (g = dlogp[i]; lse and dlogp are the arrays at row0).
  virtual absl::Status head_dlogits(float* z, int64_t row0, int64_t rows, float inv_t,
                                    const float* lse, const float* dlogp) = 0;
  // dx[m, in] = dy . W (overwritten, nullable); dw[out, in] += dy^T . x; db[out] += sum dy
  // (nullable), in the policy's training GEMM formats (model/linear.h linear_backward).
  virtual absl::Status linear_backward(int64_t layer, int64_t j, const float* x, const float* dy,
                                       int64_t rows, float* dx, float* dw, float* db) = 0;
  // Backward of rmsnorm (without rounding): dx overwritten, dg [h] accumulated over rows in order.
  virtual absl::Status rmsnorm_backward(const float* x, const float* g, const float* inv,
                                        const float* dy, int64_t rows, int64_t h, float* dx,
                                        float* dg) = 0;
  // Backward of attention: dq, dk, dv overwritten from dO (q, k, v as the forward read them).
  virtual absl::Status attention_backward(const float* q, const float* k, const float* v,
                                          const float* dout, float* dq, float* dk, float* dv) = 0;
  // dg, du overwritten from dact (act = silu(g) * u).
  virtual absl::Status swiglu_backward(const float* g, const float* u, const float* dact, int64_t n,
                                       float* dg, float* du) = 0;
  // Backward of moe (layer `layer`'s last forward, on the same x): dx [rows, h] overwritten from
  // dout; the router's, the experts' and the shared expert's gradients added into grads (by
  // ParamLayout offset). dprob_extra_host ([E] or nullptr) is added to dL/dprobs
  // of every row (the load-balancing loss's gradient).
  virtual absl::Status moe_backward(int64_t layer, const float* x, const float* dout, int64_t rows,
                                    const float* dprob_extra_host, float* dx,
                                    model::GradientSink& grads) = 0;
  // dembed[tokens[r]] += dx[r] for every row in order (dembed is [vocab, hidden]).
  virtual absl::Status embed_backward(const float* dx, float* dembed) = 0;

  // ---- memory ----
  virtual absl::Status copy(float* dst, const float* src, int64_t n) = 0;
  virtual absl::Status zero(float* x, int64_t n) = 0;
  virtual absl::Status to_host(float* dst_host, const float* src, int64_t n) = 0;
  virtual absl::Status from_host(float* dst, const float* src_host, int64_t n) = 0;
  // Waits until every op issued so far has finished (no-op on the host).
  virtual absl::Status synchronize() = 0;
  // A norm weight or bias by parameter offset (model/params.h), as the forward uses it.
  virtual const float* small(int64_t offset) const = 0;
};

// ---- Buffers -----------------------------------------------------------------------------------

// ZeRO-3 (trainer.shard params, docs/design/sharding.md): how a step gets the weights of a model
// that does not hold them all. Units, in flat parameter order: 0 the embedding, 1 + l decoder
// layer l (its norms, biases, linears, router and experts), layers + 1 the final norm and the
// lm_head (with tied embeddings: the embedding table, which the lm_head is). With
// TrainStepOptions::units set, train_forward and train_backward acquire each unit right before
// the first op that reads its weights and release it after the last (after ops.synchronize()),
// one unit at a time, in forward_unit_order / backward_unit_order; an error from acquire fails
// the step. Without it the model holds every unit.
class UnitWeights {
 public:
  virtual ~UnitWeights() = default;
  virtual absl::Status acquire(int64_t unit) = 0;
  virtual void release(int64_t unit) = 0;
};
// A forward's units: 0, 1, ..., layers + 1. A backward's: layers + 1, layers, ..., 1 (a
// recomputed layer runs inside its own hold; the embedding's backward reads no weight).
std::vector<int64_t> forward_unit_order(int64_t layers);
std::vector<int64_t> backward_unit_order(int64_t layers);
// The flat parameter range [begin, end) of unit `unit` of a `layers`-layer model (whole tensors;
// a layer's range starts at its input norm, its first parameter). The head unit of a model
// with tied embeddings reads the embedding too (unit 0's range): its hook must hold both.
std::pair<int64_t, int64_t> unit_range(const model::ParamLayout& layout, int64_t layers,
                                       int64_t unit);

struct TrainStepOptions {
  float temperature = 1.0f;  // logprobs of logits / temperature (> 0)
  // lm_head rows per chunk (bounds the logits buffer, [head_chunk, vocab]); chunks never cross a
  // sequence. 64 is what the learner runs (the fp32 lm_head gradient's summation order depends on
  // it, so the golden digests do).
  int64_t head_chunk = 64;
  // When set, records per layer the K (after RoPE) and V amax of each sequence of the batch: one
  // sample per sequence, so a batched forward gives the calibrator what one call per sequence
  // would.
  model::KvCalibrator* calibrator = nullptr;
  // Activation recomputation per layer: the forward keeps only each layer's input (plus one
  // shared set of a layer's activations) and the backward re-runs each layer before its backward
  // (one more layer forward per layer; same values, so same gradients bit for bit).
  bool recompute_layers = false;
  // Mixture of experts. Routing replay: tokens covered by replay[s] use the recorded experts
  // (mixing weights from the current router at those experts), the rest route freely; ids are
  // checked (InvalidArgument naming the sequence and token). The weight of the load-balancing
  // loss (HF load_balancing_loss_func over all sparse layers) the backward adds to the caller's
  // loss (0: none). Where the forward reports its routing (nullptr: nowhere).
  const model::TokenRouting* replay = nullptr;
  double router_aux_loss_coef = 0.0;
  model::ForwardRouting* routing_out = nullptr;
  // ZeRO-3: where the step gets each unit's weights (nullptr: the model holds them all).
  UnitWeights* units = nullptr;
};

// What the forward saves for the backward, per layer ([rows, width] each, rows padded).
// g, u, act (the dense MLP) are nullptr for a sparse layer, whose MLP activations the ops keep.
struct TrainLayerBuffers {
  float *x = nullptr, *inv1 = nullptr, *h1 = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
        *o = nullptr, *x2 = nullptr, *inv2 = nullptr, *h2 = nullptr, *g = nullptr, *u = nullptr,
        *act = nullptr;
  // qk_norm only (nullptr otherwise): q, k before the per-head norm and its 1/rms per head row.
  float *q_raw = nullptr, *k_raw = nullptr, *inv_q = nullptr, *inv_k = nullptr;
};

// Every buffer of a step in the ops' memory space, carved from one allocation. Row counts are
// padded (train_padded_rows) so FP8 GEMM operands can be read in whole 8-row groups.
struct TrainBuffers {
  int64_t rows = 0, padded_rows = 0, head_chunk = 0;
  bool recompute_layers = false;
  // Per layer; with recompute_layers only `x` is the layer's own, the rest is shared by all.
  std::vector<TrainLayerBuffers> layers;
  float* x = nullptr;          // running hidden state [rows, h]; after the forward: x_final
  float* inv_final = nullptr;  // [rows]
  float* h_final = nullptr;    // [rows, h]
  float *lse = nullptr, *logprob = nullptr, *dlogp = nullptr;  // [rows]
  float* logits = nullptr;                                     // [head_chunk padded, vocab]
  // Backward scratch.
  float *dx = nullptr, *dh = nullptr, *tmp = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr,
        *dout = nullptr, *dact = nullptr, *dg = nullptr, *du = nullptr;
  // Mixture of experts, host memory: d(coef * load-balancing loss) / d probs[row, e] ([E]) that
  // train_forward leaves for train_backward; empty when router_aux_loss_coef is 0. (The sparse
  // layers' own activations are kept by the ops.)
  std::vector<float> aux_dprob;
};

// Rows a buffer holds for a batch of `rows`: a multiple of 16 with at least 16 spare rows
// (a chunk of lm_head rows starting anywhere may be read padded to 8).
int64_t train_padded_rows(int64_t rows);
// Floats train_buffer_floats needs for `rows` packed rows (each buffer aligned to 64 floats).
int64_t train_buffer_floats(const model::ModelConfig& config, int64_t rows,
                            const TrainStepOptions& opts);
// Lays the buffers out over base[train_buffer_floats(...)] (the caller zeroes it once).
TrainBuffers carve_train_buffers(const model::ModelConfig& config, int64_t rows,
                                 const TrainStepOptions& opts, float* base);

// ---- The step ----------------------------------------------------------------------------------

// Training forward: per-token logprobs at opts.temperature (host values: per sequence n-1,
// [i-1] the logprob of token i), saving activations in `b` for train_backward (a sparse layer's
// in the ops). InvalidArgument for a bad temperature or routing record; the ops' error for a
// sparse layer they do not implement.
absl::StatusOr<model::TokenValues> train_forward(const model::ModelConfig& config,
                                                 const model::PrecisionPolicy& policy,
                                                 const model::ParamLayout& layout, TrainOps& ops,
                                                 TrainBuffers& b, const TrainTables& t,
                                                 const TrainStepOptions& opts);
// train_forward calls so far in this process, on any ops (tests count the passes an operation
// costs: an export or a publish runs none).
int64_t train_forward_calls_total();

// Accumulates dL/dparams into grads (ops memory, layout.total() floats, ParamLayout order) given
// dL/dlogprob per token (host, the forward's shape; zeros allowed), after train_forward on the
// same tables and buffers. InvalidArgument for a dlogp of the wrong shape or a non-finite value.
// `on_final` (model/gradient_sink.h GradientsFinal) is called after synchronize() as the
// backward leaves each layer: grads[from, total) are final.
absl::Status train_backward(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                            const model::ParamLayout& layout, TrainOps& ops, const TrainBuffers& b,
                            const TrainTables& t, const model::TokenValues& dlogp, float* grads,
                            const TrainStepOptions& opts,
                            const model::GradientsFinal& on_final = {});
// The same into a gradient sink (model/gradient_sink.h: storage handed out tensor by tensor, the
// sharded trainer's buckets): grads.grad(offset) must be ops memory; grads.final_from(from) is
// called (after synchronize()) as the backward leaves each layer.
absl::Status train_backward(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                            const model::ParamLayout& layout, TrainOps& ops, const TrainBuffers& b,
                            const TrainTables& t, const model::TokenValues& dlogp,
                            model::GradientSink& grads, const TrainStepOptions& opts);

}  // namespace fp8rl::engine
