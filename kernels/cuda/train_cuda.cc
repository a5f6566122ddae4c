// Host side of the training kernels: argument checks with errors that name the argument, then the
// launch (train_kernels.cu).
#include "kernels/cuda/train_cuda.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/train_launch.h"

namespace fp8rl::kernels::cuda {
using internal::non_null;
using internal::positive;

absl::Status rmsnorm_backward(const float* x, const float* g, const float* inv, const float* dy,
                              int64_t rows, int64_t h, float* dx, float* dg, Stream stream) {
  constexpr const char* kFn = "cuda rmsnorm_backward";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"h", h}})));
  FP8RL_RETURN_IF_ERROR(
      (non_null(kFn, {{"x", x}, {"g", g}, {"inv", inv}, {"dy", dy}, {"dx", dx}, {"dg", dg}})));
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_rmsnorm_backward(x, g, inv, dy, rows, h, dx, dg, stream));
  return absl::OkStatus();
}

absl::Status rope_inverse(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                          int64_t heads, int64_t head_dim, float* x, Stream stream) {
  constexpr const char* kFn = "cuda rope_inverse";
  FP8RL_RETURN_IF_ERROR(
      (positive(kFn, {{"rows", rows}, {"heads", heads}, {"head_dim", head_dim}})));
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": head_dim must be even, got ", head_dim));
  }
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"cos", cos}, {"sin", sin}, {"pos", pos}, {"x", x}})));
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_rope_inverse(cos, sin, pos, rows, heads, head_dim, x, stream));
  return absl::OkStatus();
}

absl::Status swiglu_backward(const float* g, const float* u, const float* dact, int64_t n,
                             float* dg, float* du, Stream stream) {
  constexpr const char* kFn = "cuda swiglu_backward";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"n", n}})));
  FP8RL_RETURN_IF_ERROR(
      (non_null(kFn, {{"g", g}, {"u", u}, {"dact", dact}, {"dg", dg}, {"du", du}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_swiglu_backward(g, u, dact, n, dg, du, stream));
  return absl::OkStatus();
}

absl::Status attention_backward(const float* q, const float* k, const float* v, const float* dout,
                                const int32_t* seq_start, const int32_t* row_seq, int64_t rows,
                                int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                                float* stats, float* dq, float* dk, float* dv, Stream stream) {
  constexpr const char* kFn = "cuda attention_backward";
  FP8RL_RETURN_IF_ERROR((positive(
      kFn, {{"rows", rows}, {"n_heads", n_heads}, {"n_kv", n_kv}, {"head_dim", head_dim}})));
  if (n_heads % n_kv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": n_heads (", n_heads, ") must be a multiple of n_kv (", n_kv, ")"));
  }
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"q", q},
                                        {"k", k},
                                        {"v", v},
                                        {"dout", dout},
                                        {"seq_start", seq_start},
                                        {"row_seq", row_seq},
                                        {"stats", stats},
                                        {"dq", dq},
                                        {"dk", dk},
                                        {"dv", dv}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_attention_backward(q, k, v, dout, seq_start, row_seq,
                                                                 rows, n_heads, n_kv, head_dim,
                                                                 scale, stats, dq, dk, dv, stream));
  return absl::OkStatus();
}

absl::Status head_dlogits(float* z, int64_t rows, int64_t vocab, float inv_t,
                          const int32_t* targets, const float* lse, const float* dlogp,
                          Stream stream) {
  constexpr const char* kFn = "cuda head_dlogits";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"vocab", vocab}})));
  if (!(inv_t > 0.0f) || !std::isfinite(inv_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": inv_t must be finite and > 0, got ", inv_t));
  }
  FP8RL_RETURN_IF_ERROR(
      (non_null(kFn, {{"z", z}, {"targets", targets}, {"lse", lse}, {"dlogp", dlogp}})));
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_head_dlogits(z, rows, vocab, inv_t, targets, lse, dlogp, stream));
  return absl::OkStatus();
}

absl::Status embed_backward(const float* dx, const int32_t* tokens, int64_t rows, int64_t h,
                            float* dembed, Stream stream) {
  constexpr const char* kFn = "cuda embed_backward";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"h", h}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"dx", dx}, {"tokens", tokens}, {"dembed", dembed}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_embed_backward(dx, tokens, rows, h, dembed, stream));
  return absl::OkStatus();
}

absl::Status kv_fake_quant(float* x, int64_t n, dm::KvDtype dtype, float scale, Stream stream) {
  constexpr const char* kFn = "cuda kv_fake_quant";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"n", n}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"x", x}})));
  if (dtype == dm::KvDtype::kFP8 && (!(scale > 0.0f) || !std::isfinite(scale))) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": scale must be finite and > 0 for an FP8 cache, got ", scale));
  }
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_kv_fake_quant(x, n, dtype, scale, stream));
  return absl::OkStatus();
}

absl::Status seq_amax(const float* x, int64_t width, const int32_t* seq_start, int64_t n_seq,
                      float* amax, Stream stream) {
  constexpr const char* kFn = "cuda seq_amax";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"width", width}, {"n_seq", n_seq}})));
  if (n_seq > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": n_seq must fit int32, got ", n_seq));
  }
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"x", x}, {"seq_start", seq_start}, {"amax", amax}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_seq_amax(x, width, seq_start, n_seq, amax, stream));
  return absl::OkStatus();
}

absl::Status transpose_pad(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out,
                           uint16_t* out_bf16, Stream stream) {
  constexpr const char* kFn = "cuda transpose_pad";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"cols", cols}, {"ld", ld}})));
  if (ld < rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": ld (", ld, ") must be >= rows (", rows, ")"));
  }
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"x", x}})));
  if (out == nullptr && out_bf16 == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": out and out_bf16 are both null"));
  }
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_transpose_pad(x, rows, cols, ld, out, out_bf16, stream));
  return absl::OkStatus();
}

absl::Status to_bf16_bits(const float* x, int64_t n, uint16_t* out, Stream stream) {
  constexpr const char* kFn = "cuda to_bf16_bits";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"n", n}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"x", x}, {"out", out}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_to_bf16_bits(x, n, out, stream));
  return absl::OkStatus();
}

absl::Status gemm_nt_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                            int64_t k, bool accumulate, Stream stream) {
  constexpr const char* kFn = "cuda gemm_nt_f64acc";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"m", m}, {"n", n}, {"k", k}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"a", a}, {"b", b}, {"y", y}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_gemm_nt_f64acc(a, b, y, m, n, k, accumulate, stream));
  return absl::OkStatus();
}

absl::Status gemm_nn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                            int64_t k, Stream stream) {
  constexpr const char* kFn = "cuda gemm_nn_f64acc";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"m", m}, {"n", n}, {"k", k}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"a", a}, {"b", b}, {"y", y}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_gemm_nn_f64acc(a, b, y, m, n, k, stream));
  return absl::OkStatus();
}

absl::Status gemm_tn_f64acc(const float* a, const float* b, float* y, int64_t m, int64_t n,
                            int64_t k, Stream stream) {
  constexpr const char* kFn = "cuda gemm_tn_f64acc";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"m", m}, {"n", n}, {"k", k}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"a", a}, {"b", b}, {"y", y}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_gemm_tn_f64acc(a, b, y, m, n, k, stream));
  return absl::OkStatus();
}

absl::Status column_sum(const float* x, int64_t rows, int64_t cols, float* out, Stream stream) {
  constexpr const char* kFn = "cuda column_sum";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"rows", rows}, {"cols", cols}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"x", x}, {"out", out}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_column_sum(x, rows, cols, out, stream));
  return absl::OkStatus();
}

absl::Status add(float* y, const float* x, int64_t n, bool to_bf16, Stream stream) {
  constexpr const char* kFn = "cuda add";
  FP8RL_RETURN_IF_ERROR((positive(kFn, {{"n", n}})));
  FP8RL_RETURN_IF_ERROR((non_null(kFn, {{"y", y}, {"x", x}})));
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_add(y, x, n, to_bf16, stream));
  return absl::OkStatus();
}

}  // namespace fp8rl::kernels::cuda
