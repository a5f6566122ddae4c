// Block-scaled FP8 GEMM (1x128 x 128x128, 1x128 x 1x128) and the BF16 baseline through cuBLASLt
// on sm_90, with our row-major TN problem mapped onto cuBLASLt's column-major one as documented
// in fp8_cuda.h. Descriptors and the chosen algorithm are cached per shape.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_cuda.h"

namespace fp8rl::kernels::cuda {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 31;

enum class Kind { kFp8, kBf16 };

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume about it.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

cublasLtMatmulMatrixScale_t scale_mode_of(ScalingMode mode) {
  return mode == ScalingMode::kBlock128x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                            : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
}

struct PlanKey {
  Kind kind;
  int64_t m, n, k;  // ours: Y[M,N] = A[M,K] . B[N,K]^T
  ScalingMode a_mode, b_mode;
  OutDtype out;
  bool accumulate;
  uint32_t align_a, align_b, align_y;

  auto tie() const {
    return std::tie(kind, m, n, k, a_mode, b_mode, out, accumulate, align_a, align_b, align_y);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

// Descriptors for one problem, owned; destroyed with the plan.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr;  // cuBLAS A = our B
  cublasLtMatrixLayout_t lt_b = nullptr;  // cuBLAS B = our A
  cublasLtMatrixLayout_t lt_d = nullptr;  // C and D = Y^T
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lt_d != nullptr) cublasLtMatrixLayoutDestroy(lt_d);
    if (lt_b != nullptr) cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a != nullptr) cublasLtMatrixLayoutDestroy(lt_a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

absl::Status check_aligned16(const char* fn, const char* name, const void* p) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(fn, ": ", name, " is null"));
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": ", name,
                                                   " must be 16-byte aligned (got address 0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(p)), ")"));
  }
  return absl::OkStatus();
}

absl::Status check_dim(const char* fn, const char* name, int64_t v) {
  if (v <= 0 || v >= kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": ", name, " must be in [1, 2^31), got ", v));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status check_gemm_fp8_args(const Fp8DeviceView& a, const Fp8DeviceView& b, const void* y) {
  constexpr const char* kFn = "cuda gemm_fp8";
  if (a.mode == ScalingMode::kPerTensor || b.mode == ScalingMode::kPerTensor) {
    return absl::UnimplementedError(absl::StrCat(
        kFn, ": per-tensor operands are not supported (a is ", scaling_mode_name(a.mode), ", b is ",
        scaling_mode_name(b.mode), "); use 1x128 tiles or 128x128 blocks"));
  }
  if (a.mode == ScalingMode::kBlock128x128 && b.mode == ScalingMode::kBlock128x128) {
    return absl::UnimplementedError(absl::StrCat(
        kFn,
        ": a and b are both 128x128-block scaled; cuBLASLt on sm_90 supports 1x128 x 128x128, "
        "128x128 x 1x128 and 1x128 x 1x128 only"));
  }
  for (auto [name, v] : {std::pair{"a.rows (M)", a.rows}, std::pair{"a.cols (K)", a.cols},
                         std::pair{"b.rows (N)", b.rows}, std::pair{"b.cols (K)", b.cols}}) {
    if (absl::Status st = check_dim(kFn, name, v); !st.ok()) return st;
  }
  if (a.cols != b.cols) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": K mismatch: a is [", a.rows, ", ",
                                                   a.cols, "], b is [", b.rows, ", ", b.cols,
                                                   "] (both must be [*, K])"));
  }
  if (a.cols % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": K = ", a.cols, " must be a multiple of 16 (FP8 TN on sm_90)"));
  }
  if (b.rows % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": N = b.rows = ", b.rows, " must be a multiple of 8"));
  }
  if (a.mode == ScalingMode::kTile1x128 && a.rows % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFn, ": M = a.rows = ", a.rows, " must be a multiple of 8 when a is 1x128-scaled"));
  }
  for (auto [name, p] : {std::pair<const char*, const void*>{"a.data", a.data},
                         {"a.scale_inv", a.scale_inv},
                         {"b.data", b.data},
                         {"b.scale_inv", b.scale_inv},
                         {"y", y}}) {
    if (absl::Status st = check_aligned16(kFn, name, p); !st.ok()) return st;
  }
  return absl::OkStatus();
}

struct CublasLtGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  mutable std::mutex mu;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  // Points the descriptor at our operands' scale tensors (FP8 only). cuBLAS A is our B, so our
  // B's scales go to the A slot. The pointers differ per call, so run() sets them every time;
  // plan_for() sets them too, BEFORE the heuristic query: for the VEC128_32F / BLK128x128_32F
  // modes cublasLtMatmulAlgoGetHeuristic refuses a descriptor whose scale pointers are unset
  // ("requires a custom pointer").
  static absl::Status set_scale_pointers(cublasLtMatmulDesc_t desc, const void* a_scale,
                                         const void* b_scale) {
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    return absl::OkStatus();
  }

  // Builds (once) the plan for `key`; `a_scale`/`b_scale` are our operands' scale pointers
  // (device; null for BF16), needed by the heuristic query of the block-scaled modes.
  //
  // Attribute types, checked against the CUDA 13.0 cublasLt.h documentation comments:
  //   TRANSA/TRANSB int32_t (cublasOperation_t); FAST_ACCUM int8_t (0 = promote to fp32
  //   periodically); A/B_SCALE_MODE int32_t (cublasLtMatmulMatrixScale_t: VEC128_32F = 4, one
  //   fp32 scale per 128 elements of the innermost dimension, BLK128x128_32F = 5, one per
  //   128x128 block); A/B_SCALE_POINTER const void* (device); PREF_MAX_WORKSPACE_BYTES uint64_t;
  //   PREF_MIN_ALIGNMENT_*_BYTES uint32_t (default 256, so smaller alignments must be declared).
  // The exact placement of the scale tensors (our "GEMM layout" in fp8_cuda.h: VEC128 scales
  // outer-dimension-major with the leading dimension padded to 16 bytes) is NOT spelled out in
  // that header; the GPU tests compare every scaling pair against the float64 reference, which
  // is what pins it down (they passed on an H200, 2026-12-04).
  absl::StatusOr<Plan*> plan_for(const PlanKey& key, const void* a_scale, const void* b_scale) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    auto plan = std::make_unique<Plan>();
    const uint64_t m = static_cast<uint64_t>(key.n);  // cuBLAS m = our N
    const uint64_t n = static_cast<uint64_t>(key.m);  // cuBLAS n = our M
    const uint64_t k = static_cast<uint64_t>(key.k);
    const cudaDataType_t in_type = key.kind == Kind::kFp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    const cudaDataType_t out_type = key.out == OutDtype::kBF16 ? CUDA_R_16BF : CUDA_R_32F;

    FP8RL_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_t = CUBLAS_OP_T;
    const cublasOperation_t op_n = CUBLAS_OP_N;
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    if (key.kind == Kind::kFp8) {
      const int8_t fast_accum = 0;  // promote to fp32 per K block: the recipe's accumulation
      FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
      const int32_t mode_a = scale_mode_of(key.b_mode);  // cuBLAS A is our B
      const int32_t mode_b = scale_mode_of(key.a_mode);
      FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
      FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
      if (absl::Status st = set_scale_pointers(plan->desc, a_scale, b_scale); !st.ok()) return st;
    }
    // Column-major views: our B [N,K] row-major = [K,N] col-major (ld K), our A likewise.
    FP8RL_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&plan->lt_a, in_type, k, m, static_cast<int64_t>(k)));
    FP8RL_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&plan->lt_b, in_type, k, n, static_cast<int64_t>(k)));
    FP8RL_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&plan->lt_d, out_type, m, n, static_cast<int64_t>(m)));

    cublasLtMatmulPreference_t pref = nullptr;
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    struct PrefGuard {
      cublasLtMatmulPreference_t p;
      ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
    } guard{pref};
    const size_t ws = workspace.bytes();
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // cuBLAS A is our B and vice versa.
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_b, sizeof(key.align_b)));
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_a, sizeof(key.align_a)));
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_y, sizeof(key.align_y)));
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_y, sizeof(key.align_y)));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->lt_a, plan->lt_b, plan->lt_d,
                                       plan->lt_d, pref, 1, &result, &found);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0)) {
      return absl::UnimplementedError(
          absl::StrCat("cuBLASLt has no algorithm for ", key.kind == Kind::kFp8 ? "FP8 " : "BF16 ",
                       key.kind == Kind::kFp8 ? absl::StrCat(scaling_mode_name(key.a_mode), " x ",
                                                             scaling_mode_name(key.b_mode), " ")
                                              : std::string(),
                       "GEMM M=", key.m, " N=", key.n, " K=", key.k,
                       key.out == OutDtype::kBF16 ? " out=bf16" : " out=f32", " on this device"));
    }
    FP8RL_CUBLAS_RETURN_IF_ERROR(hs);
    plan->algo = result.algo;
    Plan* raw = plan.get();
    plans.emplace(key, std::move(plan));
    return raw;
  }

  absl::Status run(const PlanKey& key, const void* a, const void* a_scale, const void* b,
                   const void* b_scale, void* y, Stream stream) {
    std::lock_guard<std::mutex> lock(mu);
    absl::StatusOr<Plan*> plan = plan_for(key, a_scale, b_scale);
    if (!plan.ok()) return plan.status();
    if (key.kind == Kind::kFp8) {
      if (absl::Status st = set_scale_pointers((*plan)->desc, a_scale, b_scale); !st.ok()) {
        return st;
      }
    }
    const float alpha = 1.0f;
    const float beta = key.accumulate ? 1.0f : 0.0f;
    FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
        handle, (*plan)->desc, &alpha, b, (*plan)->lt_a, a, (*plan)->lt_b, &beta, y, (*plan)->lt_d,
        y, (*plan)->lt_d, &(*plan)->algo, workspace.data(), workspace.bytes(), stream));
    return absl::OkStatus();
  }
};

CublasLtGemm::CublasLtGemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasLtGemm::~CublasLtGemm() = default;

absl::StatusOr<std::unique_ptr<CublasLtGemm>> CublasLtGemm::create(size_t workspace_bytes) {
  absl::StatusOr<DeviceInfo> dev = require_sm90();
  if (!dev.ok()) return dev.status();
  auto impl = std::make_unique<Impl>();
  FP8RL_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::allocate(workspace_bytes);
  if (!ws.ok()) return ws.status();
  impl->workspace = *std::move(ws);
  return std::unique_ptr<CublasLtGemm>(new CublasLtGemm(std::move(impl)));
}

absl::Status CublasLtGemm::gemm_fp8(const Fp8DeviceView& a, const Fp8DeviceView& b, void* y,
                                    OutDtype out, bool accumulate, Stream stream) {
  if (absl::Status st = check_gemm_fp8_args(a, b, y); !st.ok()) return st;
  const PlanKey key{Kind::kFp8,
                    a.rows,
                    b.rows,
                    a.cols,
                    a.mode,
                    b.mode,
                    out,
                    accumulate,
                    alignment_of(a.data),
                    alignment_of(b.data),
                    alignment_of(y)};
  return impl_->run(key, a.data, a.scale_inv, b.data, b.scale_inv, y, stream);
}

absl::Status CublasLtGemm::gemm_bf16(const uint16_t* a, const uint16_t* b, void* y, int64_t m,
                                     int64_t n, int64_t k, OutDtype out, bool accumulate,
                                     Stream stream) {
  constexpr const char* kFn = "cuda gemm_bf16";
  for (auto [name, v] : {std::pair{"M", m}, std::pair{"N", n}, std::pair{"K", k}}) {
    if (absl::Status st = check_dim(kFn, name, v); !st.ok()) return st;
  }
  if (k % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": K = ", k, " must be a multiple of 8"));
  }
  if (n % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": N = ", n, " must be a multiple of 8"));
  }
  for (auto [name, p] :
       {std::pair<const char*, const void*>{"a", a}, {"b", b}, {"y", static_cast<void*>(y)}}) {
    if (absl::Status st = check_aligned16(kFn, name, p); !st.ok()) return st;
  }
  const PlanKey key{Kind::kBf16,
                    m,
                    n,
                    k,
                    ScalingMode::kPerTensor,
                    ScalingMode::kPerTensor,
                    out,
                    accumulate,
                    alignment_of(a),
                    alignment_of(b),
                    alignment_of(y)};
  return impl_->run(key, a, nullptr, b, nullptr, y, stream);
}

size_t CublasLtGemm::cached_plans() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->plans.size();
}

}  // namespace fp8rl::kernels::cuda
