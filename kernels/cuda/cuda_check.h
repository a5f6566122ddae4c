// Turns CUDA runtime and cuBLAS(Lt) status codes into absl::Status with file:line and the
// library's own error text, so no call's failure goes unnoticed (internal to kernels/cuda).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fp8rl::kernels::cuda::internal {

inline absl::Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr,
                                          " failed: ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

inline absl::Status cublas_status(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr,
                                          " failed: ", cublasLtGetStatusName(st), " (",
                                          cublasLtGetStatusString(st), ")"));
}

}  // namespace fp8rl::kernels::cuda::internal

#define FP8RL_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                    \
    absl::Status _fp8rl_st =                                                              \
        ::fp8rl::kernels::cuda::internal::cuda_status((expr), #expr, __FILE__, __LINE__); \
    if (!_fp8rl_st.ok()) return _fp8rl_st;                                                \
  } while (0)

#define FP8RL_CUBLAS_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                      \
    absl::Status _fp8rl_st =                                                                \
        ::fp8rl::kernels::cuda::internal::cublas_status((expr), #expr, __FILE__, __LINE__); \
    if (!_fp8rl_st.ok()) return _fp8rl_st;                                                  \
  } while (0)
