// Host side of the decoder kernels: argument checks with errors that name the argument, then the
// launch (decoder_kernels.cu).
#include "kernels/cuda/decoder_cuda.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decoder_launch.h"
#include "kernels/device_math/attention_split.h"

namespace fp8rl::kernels::cuda {
namespace {

using internal::non_null;
using internal::positive;

absl::Status heads_ok(const char* fn, int64_t n_heads, int64_t n_kv, int64_t head_dim) {
  if (n_heads % n_kv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": n_heads (", n_heads, ") must be a multiple of n_kv (", n_kv, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": head_dim must be even, got ", head_dim));
  }
  return absl::OkStatus();
}

absl::Status paged_ok(const char* fn, const dm::PagedKvView& kv) {
  if (absl::Status st = positive(fn, {{"kv.num_blocks", kv.num_blocks},
                                      {"kv.block_size", kv.block_size},
                                      {"kv.n_kv", kv.n_kv},
                                      {"kv.head_dim", kv.head_dim},
                                      {"kv.max_blocks", kv.max_blocks}});
      !st.ok()) {
    return st;
  }
  if (absl::Status st = non_null(
          fn,
          {{"kv.k_pool", kv.k_pool}, {"kv.v_pool", kv.v_pool}, {"kv.block_table", kv.block_table}});
      !st.ok()) {
    return st;
  }
  if (kv.dtype == dm::KvDtype::kFP8) {
    for (auto [name, s] :
         {std::pair{"kv.k_scale", kv.k_scale}, std::pair{"kv.v_scale", kv.v_scale}}) {
      if (!(s > 0.0f) || !std::isfinite(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat(fn, ": ", name, " must be finite and > 0 for an FP8 cache, got ", s));
      }
    }
  }
  return absl::OkStatus();
}

constexpr int64_t kMaxGrid = (int64_t{1} << 31) - 1;  // blocks in a grid's x dimension

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

DecoderKernels resolve(DecoderKernels k) {
  return k == DecoderKernels::kDefault ? default_decoder_kernels() : k;
}

}  // namespace

DecoderKernels default_decoder_kernels() {
  static const DecoderKernels choice = [] {
    const char* env = std::getenv("FP8RL_DECODER_KERNELS");
    return env != nullptr && std::string_view(env) == "simple" ? DecoderKernels::kSimple
                                                               : DecoderKernels::kFast;
  }();
  return choice;
}

bool attention_paged_uses_split(const dm::PagedKvView& kv, int64_t rows, int64_t n_heads,
                                DecoderKernels kernels) {
  return resolve(kernels) == DecoderKernels::kFast && kv.head_dim % 8 == 0 &&
         kv.head_dim <= dm::kSplitMaxHeadDim && aligned16(kv.k_pool) && aligned16(kv.v_pool) &&
         rows * n_heads <= kMaxGrid;
}

bool attention_prefill_uses_split(const float* k, const float* v, int64_t rows, int64_t n_heads,
                                  int64_t head_dim, DecoderKernels kernels) {
  return resolve(kernels) == DecoderKernels::kFast && head_dim % 8 == 0 &&
         head_dim <= dm::kSplitMaxHeadDim && aligned16(k) && aligned16(v) &&
         rows * n_heads <= kMaxGrid;
}

absl::Status embed_gather(const float* table, int64_t vocab, int64_t h, const int32_t* tokens,
                          int64_t rows, float* x, int32_t* bad_count, Stream stream) {
  constexpr const char* kFn = "cuda embed_gather";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"vocab", vocab}, {"h", h}, {"rows", rows}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"table", table}, {"tokens", tokens}, {"x", x}})));
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_embed_gather(table, vocab, h, tokens, rows, x, bad_count, stream));
  return absl::OkStatus();
}

absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, float eps,
                     bool to_bf16, float* y, float* inv_rms, Stream stream) {
  constexpr const char* kFn = "cuda rmsnorm";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"h", h}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"x", x}, {"g", g}, {"y", y}})));
  if (!(eps >= 0.0f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": eps must be finite and >= 0, got ", eps));
  }
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_rmsnorm(x, g, rows, h, eps, to_bf16, y, inv_rms, stream));
  return absl::OkStatus();
}

absl::Status rope(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                  int64_t heads, int64_t head_dim, bool to_bf16, float* x, Stream stream) {
  constexpr const char* kFn = "cuda rope";
  FP8RL_RETURN_IF_ERROR(
      (positive(kFn, {{"rows", rows}, {"heads", heads}, {"head_dim", head_dim}})));
  FP8RL_RETURN_IF_ERROR(heads_ok(kFn, heads, heads, head_dim));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"cos", cos}, {"sin", sin}, {"pos", pos}, {"x", x}})));
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_rope(cos, sin, pos, rows, heads, head_dim, to_bf16, x, stream));
  return absl::OkStatus();
}

absl::Status swiglu(const float* g, const float* u, int64_t n, bool to_bf16, float* act,
                    Stream stream) {
  constexpr const char* kFn = "cuda swiglu";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"n", n}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"g", g}, {"u", u}, {"act", act}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_swiglu(g, u, n, to_bf16, act, stream));
  return absl::OkStatus();
}

absl::Status attention_prefill(const float* q, const float* k, const float* v,
                               const int32_t* seq_start, int64_t n_seq, int64_t rows,
                               int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                               float* out, Stream stream, DecoderKernels kernels) {
  constexpr const char* kFn = "cuda attention_prefill";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"n_seq", n_seq},
                                        {"rows", rows},
                                        {"n_heads", n_heads},
                                        {"n_kv", n_kv},
                                        {"head_dim", head_dim}})));
  FP8RL_RETURN_IF_ERROR(heads_ok(kFn, n_heads, n_kv, head_dim));
  FP8RL_RETURN_IF_ERROR(
      (non_null(kFn, {{"q", q}, {"k", k}, {"v", v}, {"seq_start", seq_start}, {"out", out}})));
  if (attention_prefill_uses_split(k, v, rows, n_heads, head_dim, kernels)) {
    FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_attention_prefill_split(
        q, k, v, seq_start, n_seq, rows, n_heads, n_kv, head_dim, scale, out, stream));
  } else {
    FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_attention_prefill(
        q, k, v, seq_start, n_seq, rows, n_heads, n_kv, head_dim, scale, out, stream));
  }
  return absl::OkStatus();
}

absl::Status kv_write_paged(const float* k, const float* v, int64_t rows, const int32_t* row_seq,
                            const int32_t* row_pos, const dm::PagedKvView& kv, Stream stream) {
  constexpr const char* kFn = "cuda kv_write_paged";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}})));
  FP8RL_RETURN_IF_ERROR(paged_ok(kFn, kv));
  FP8RL_RETURN_IF_ERROR(
      (non_null(kFn, {{"k", k}, {"v", v}, {"row_seq", row_seq}, {"row_pos", row_pos}})));
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_kv_write_paged(k, v, rows, row_seq, row_pos, kv, stream));
  return absl::OkStatus();
}

absl::Status attention_paged(const float* q, int64_t rows, const int32_t* row_seq,
                             const int32_t* row_pos, const dm::PagedKvView& kv, int64_t n_heads,
                             float scale, float* out, Stream stream, DecoderKernels kernels) {
  constexpr const char* kFn = "cuda attention_paged";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"n_heads", n_heads}})));
  FP8RL_RETURN_IF_ERROR(paged_ok(kFn, kv));
  FP8RL_RETURN_IF_ERROR(heads_ok(kFn, n_heads, kv.n_kv, kv.head_dim));
  FP8RL_RETURN_IF_ERROR(
      (non_null(kFn, {{"q", q}, {"row_seq", row_seq}, {"row_pos", row_pos}, {"out", out}})));
  if (attention_paged_uses_split(kv, rows, n_heads, kernels)) {
    FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_attention_paged_split(q, rows, row_seq, row_pos, kv,
                                                                      n_heads, scale, out, stream));
  } else {
    FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_attention_paged(q, rows, row_seq, row_pos, kv,
                                                                n_heads, scale, out, stream));
  }
  return absl::OkStatus();
}

absl::Status log_softmax(const float* z, int64_t rows, int64_t vocab, float inv_t,
                         const int32_t* targets, float* lse, float* target_logprob, Stream stream,
                         DecoderKernels kernels) {
  constexpr const char* kFn = "cuda log_softmax";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"vocab", vocab}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"z", z}})));
  if (!(inv_t > 0.0f) || !std::isfinite(inv_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": inv_t must be finite and > 0, got ", inv_t));
  }
  if ((targets == nullptr) != (target_logprob == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": targets and target_logprob must be given together"));
  }
  if (resolve(kernels) == DecoderKernels::kFast && rows <= kMaxGrid) {
    FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_log_softmax_block(z, rows, vocab, inv_t, targets,
                                                                  lse, target_logprob, stream));
  } else {
    FP8RL_CUDA_RETURN_IF_ERROR(
        internal::launch_log_softmax(z, rows, vocab, inv_t, targets, lse, target_logprob, stream));
  }
  return absl::OkStatus();
}

absl::Status sample(const float* z, int64_t rows, int64_t vocab, const dm::SampleParams* params,
                    dm::RngState* rng, int32_t* scratch, dm::SampleResult* out, Stream stream,
                    DecoderKernels kernels) {
  constexpr const char* kFn = "cuda sample";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"vocab", vocab}})));
  if (vocab > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": vocab must fit int32, got ", vocab));
  }
  FP8RL_RETURN_IF_ERROR((non_null(
      kFn, {{"z", z}, {"params", params}, {"rng", rng}, {"scratch", scratch}, {"out", out}})));
  if (resolve(kernels) == DecoderKernels::kFast && rows <= kMaxGrid) {
    FP8RL_CUDA_RETURN_IF_ERROR(
        internal::launch_sample_block(z, rows, vocab, params, rng, scratch, out, stream));
  } else {
    FP8RL_CUDA_RETURN_IF_ERROR(
        internal::launch_sample(z, rows, vocab, params, rng, scratch, out, stream));
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::kernels::cuda
