// One KV-cache forward step of the decoder (batched prefill + decode rows over a paged KV cache)
// written once against an abstract set of ops, so the CUDA backend (device ops,
// cuda/cuda_backend.cc) and the CPU ops (CpuDecoderOps, kernels/cpu + model/linear.h) run the same
// sequence of operations with the same BF16 rounding points as the training forward
// (engine/train_step.h train_forward). The CPU ops are tested against the training forward on
// this machine (logprobs bit for bit, tests/unit/engine/decoder_step_test.cc); the device ops are
// tested op by op against kernels/cpu in tests/gpu.
//
// Plain C++ (no CUDA headers): built and tested in every build.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/device_math/paged_kv.h"
#include "model/config.h"
#include "model/params.h"
#include "model/precision.h"

namespace fp8rl::engine {

// ---- Step tables (host) ------------------------------------------------------------------------

// One segment of a step as the tables see it: n tokens at positions [pos0, pos0 + n) of a
// sequence whose KV cache holds the pool blocks `blocks` (capacity = blocks.size() * block_tokens
// positions, of which the first `capacity` may be used).
struct SegmentBlocks {
  const std::vector<int32_t>* blocks = nullptr;
  int64_t capacity = 0;
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  int64_t pos0 = 0;
};

// Which rows' final hidden states a step produces (then lm_head): each segment's last row
// (generation) or every row but each segment's last (scoring: the logprob of the next token).
enum class OutputRows { kLastOfSegment, kAllButLast };

// The per-row and per-segment arrays the kernels read, built on the host for one step:
//   tokens[rows], pos[rows], row_seq[rows] (segment index of the row)
//   block_table[n_seg * width]: segment s's blocks, padded with its last block (never read:
//     attention reads positions <= pos only, kv writes only positions < capacity)
//   out_rows[n_out]: rows whose final hidden state is wanted (OutputRows)
//   targets[n_out]: kAllButLast only, the token after each output row
struct StepTables {
  int64_t rows = 0, n_seg = 0, width = 0;
  std::vector<int32_t> tokens, pos, row_seq, block_table, out_rows, targets;
};

// Checks every segment (blocks present, 1 <= n, 0 <= pos0, pos0 + n <= capacity <= blocks *
// block_tokens, pos0 + n <= max_pos, tokens in [0, vocab)); InvalidArgument names the segment.
absl::StatusOr<StepTables> build_step_tables(const std::vector<SegmentBlocks>& segments,
                                             int64_t block_tokens, int64_t vocab, int64_t max_pos,
                                             OutputRows out);

// ---- Ops ---------------------------------------------------------------------------------------

// Every pointer below is in the ops' memory space (host for CpuDecoderOps, device for CUDA).
// Shapes: x is [rows, hidden]; q [rows, heads * head_dim]; k, v [rows, kv_heads * head_dim].
class DecoderOps {
 public:
  virtual ~DecoderOps() = default;
  // Makes the step's tables available to the ops below (the device copies them).
  virtual absl::Status load_tables(const StepTables& t) = 0;
  // x[r] = embedding[tokens[r]].
  virtual absl::Status embed(int64_t rows, float* x) = 0;
  // y = rmsnorm(x) * g over rows of width h, eps from the config, rounded to bf16 when rb.
  virtual absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, bool rb,
                               float* y) = 0;
  // RoPE of every head of x in place at pos[r], rounded to bf16 when rb.
  virtual absl::Status rope(int64_t rows, int64_t heads, bool rb, float* x) = 0;
  // y[rows, out] = x . W^T (+ bias) in the weight's precision, rounded to bf16 unless fp32
  // (model/linear.h linear_forward). layer = -1: lm_head; j = 0..6: q k v o gate up down.
  virtual absl::Status linear(int64_t layer, int64_t j, const float* x, int64_t rows,
                              const float* bias, float* y) = 0;
  // Writes k, v of every row into the paged cache of layer `layer` (row_seq, pos), then
  // o = attention of q over that cache (each row up to its own position).
  virtual absl::Status attention(int64_t layer, const float* q, const float* k, const float* v,
                                 int64_t rows, float* o) = 0;
  virtual absl::Status swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) = 0;
  // Sparse layer `layer`'s MLP: y[rows, hidden] = moe(x) (model/moe.h moe_forward: router top-k,
  // the experts' SwiGLUs, the shared expert), routing chosen freely (no replay); the experts each
  // row went to into sel[rows, top_k] (descending probability; nullable: not recorded). Ops
  // without one answer FailedPrecondition.
  virtual absl::Status moe(int64_t layer, const float* x, int64_t rows, float* y, int32_t* sel) {
    (void)x;
    (void)rows;
    (void)y;
    (void)sel;
    return absl::FailedPreconditionError(
        absl::StrCat("MoE not on this device (layer ", layer, " is a mixture-of-experts layer)"));
  }
  // y += x over n values, then bf16 rounding when rb.
  virtual absl::Status add(float* y, const float* x, int64_t n, bool rb) = 0;
  virtual absl::Status round_bf16(float* x, int64_t n) = 0;
  // out[i] = x[out_rows[i]] (rows of width h), i < n_out.
  virtual absl::Status gather_out_rows(const float* x, int64_t h, int64_t n_out, float* out) = 0;
  // A norm weight or bias by parameter offset (model/params.h), as the forward uses it.
  virtual const float* small(int64_t offset) const = 0;
};

// Scratch of one step, in the ops' memory space, each sized for the step's rows (rounded up to 8
// for the FP8 GEMM on the device) of the config's widths.
struct StepBuffers {
  float *x = nullptr, *h1 = nullptr, *q = nullptr, *qn = nullptr, *k = nullptr, *kn = nullptr,
        *v = nullptr, *o = nullptr, *x2 = nullptr, *h2 = nullptr, *g = nullptr, *u = nullptr,
        *act = nullptr;
  float* sel = nullptr;  // [n_out, hidden]: the final norm of the output rows
  // Mixture of experts (nullable: not recorded): the routing of the step, [sparse layers, rows,
  // top_k] (ModelConfig::sparse_index order), what DecoderOps::moe writes.
  int32_t* routing = nullptr;
};

// Runs the decoder layers and the final norm of one step: sel = final_norm(x[out_rows]).
// A sparse layer runs ops.moe (FailedPrecondition from ops without one), recording its routing
// into b.routing when set. `layer_hook`
// (nullable) is called with x after each layer.
absl::Status decoder_step(const model::ModelConfig& config, const model::PrecisionPolicy& policy,
                          const model::ParamLayout& layout, DecoderOps& ops, const StepBuffers& b,
                          const StepTables& t,
                          const std::function<absl::Status(int64_t, const float*)>& layer_hook);

// Rows of scratch a step of `rows` rows needs (a multiple of 8: the FP8 GEMM's M rule).
inline int64_t padded_rows(int64_t rows) { return (rows + 7) / 8 * 8; }

}  // namespace fp8rl::engine
