// The CUDA path of the shared FP8 module: quantization kernels bit-exact with the CPU reference
// (kernels/quantize.h) and block-scaled FP8 GEMMs through cuBLASLt on sm_90, plus a BF16 cuBLASLt
// GEMM as the baseline. Plain C++ API: device pointers and an explicit stream, no CUDA headers.
//
// ---------------------------------------------------------------------------------------------
// Device scale-tensor layouts ("GEMM layout"; what every function here reads and writes)
// ---------------------------------------------------------------------------------------------
// An FP8 matrix on the device is E4M3 codes [rows, cols], row-major (cols contiguous, cols is
// the reduced dimension K), plus fp32 dequantization multipliers `scale_inv`:
//
//   kTile1x128     one scale per (row r, 128-wide column tile kb), stored M-major (transposed
//                  with respect to the CPU layout) with the row count padded to a multiple of 4:
//                    ld = round_up(rows, 4)
//                    scale_inv[kb * ld + r]            kb < ceil(cols/128), r < rows
//                  Entries r in [rows, ld) are padding and hold 1.0f.
//                  (cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F reads it this way: a
//                  column-major [rows, ceil(cols/128)] tensor whose leading dimension is padded
//                  to 16 bytes.)
//   kBlock128x128  one scale per 128x128 block, row-major over blocks with the block-column count
//                  padded to a multiple of 4:
//                    ld = round_up(ceil(cols/128), 4)
//                    scale_inv[rb * ld + kb]           rb < ceil(rows/128), kb < ceil(cols/128)
//                  Entries kb in [ceil(cols/128), ld) are padding and hold 1.0f.
//                  (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F.)
//   kPerTensor     scale_inv[0].
//
// The CPU layout (Fp8Matrix) is the same information without transposition or padding;
// scales_to_gemm_layout / scales_from_gemm_layout convert, upload / download move whole matrices.
//
// ---------------------------------------------------------------------------------------------
// GEMM: Y[M,N] = A[M,K] . B[N,K]^T  ("TN": K contiguous in both operands), fp32 accumulation
// promoted per 128-wide K block (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0)
// ---------------------------------------------------------------------------------------------
// cuBLASLt is column-major. A row-major Y[M,N] is the column-major matrix Y^T [N,M] (ld N), and
// Y^T = B . A^T, so we call cuBLASLt with
//   cuBLAS A := our B  (stored as column-major [K,N], ld K, op T)   scale mode from B's mode
//   cuBLAS B := our A  (stored as column-major [K,M], ld K, op N)   scale mode from A's mode
//   cuBLAS D := Y      (column-major [N,M], ld N)                    m = N, n = M, k = K
// FP8 on Hopper requires exactly this TN form. Supported scaling pairs (A, B) on sm_90:
//   (kTile1x128, kBlock128x128)  fprop  X . W^T    and dgrad dY . W  (B = transpose_blocks(W))
//   (kTile1x128, kTile1x128)     wgrad  dY^T . X   (A = dY^T, B = X^T, both tiled along tokens)
//   (kBlock128x128, kTile1x128)  the mirror of fprop
// Not supported (UnimplementedError): (kBlock128x128, kBlock128x128), which cuBLASLt does not
// offer, and any kPerTensor operand.
// Shape and alignment rules (InvalidArgumentError otherwise, never wrong numbers):
//   K % 16 == 0; N % 8 == 0; M % 8 == 0 when A is kTile1x128; all dimensions in [1, 2^31);
//   every data, scale and output pointer 16-byte aligned (cudaMalloc gives 256).
// Output: OutDtype::kF32 writes float Y[M,N]; OutDtype::kBF16 writes bf16 bits (uint16) Y[M,N]
// (unlike the CPU reference, which keeps bf16-rounded values in floats). With accumulate,
// Y = A.B^T + Y (read in the output dtype).
//
// Threading: one CublasLtGemm holds one workspace; use it from one stream at a time (or give each
// stream its own instance). Plans (descriptors + chosen algorithm) are cached per shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/gemm.h"
#include "kernels/quantize.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace fp8rl::kernels::cuda {

using Stream = CUstream_st*;  // nullptr = the legacy default stream

// ---- Device -----------------------------------------------------------------------------------

struct DeviceInfo {
  int device = 0;
  int major = 0;
  int minor = 0;
  int sm_count = 0;
  std::string name;
};

// The current device if it has compute capability 9.x; FailedPreconditionError when there is no
// driver, no device, or another architecture (the message says which). Never aborts.
absl::StatusOr<DeviceInfo> require_sm90();

// ---- Scale layouts (host arithmetic; no device needed) ----------------------------------------

inline constexpr int64_t kScaleLdAlign = 4;  // floats: 16 bytes
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Leading dimension and element count of the device scale tensor of a [rows, cols] matrix.
int64_t gemm_scale_ld(ScalingMode mode, int64_t rows, int64_t cols);
int64_t gemm_scale_count(ScalingMode mode, int64_t rows, int64_t cols);
// Index into the device scale tensor of the scale that covers element (r, c).
int64_t gemm_scale_index(ScalingMode mode, int64_t rows, int64_t cols, int64_t r, int64_t c);

// CPU layout (m.scale_inv) -> device layout (padding = 1.0f). Error if m's scales have the wrong
// size.
absl::StatusOr<std::vector<float>> scales_to_gemm_layout(const Fp8Matrix& m);
// Device layout -> CPU layout. Error if `gemm` has the wrong size.
absl::StatusOr<std::vector<float>> scales_from_gemm_layout(ScalingMode mode, int64_t rows,
                                                           int64_t cols,
                                                           const std::vector<float>& gemm);

// ---- Device memory ----------------------------------------------------------------------------

// Owning cudaMalloc'd bytes (move-only).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Stream-ordered copies that also wait for the stream, so the host may reuse `src`/`dst` at once.
absl::Status copy_to_device(void* dst, const void* src, size_t bytes, Stream stream);
absl::Status copy_to_host(void* dst, const void* src, size_t bytes, Stream stream);
absl::Status synchronize(Stream stream);

// ---- FP8 matrices on the device ---------------------------------------------------------------

// A non-owning view: codes [rows, cols] row-major, scales in the device layout above.
struct Fp8DeviceView {
  int64_t rows = 0;
  int64_t cols = 0;
  ScalingMode mode = ScalingMode::kTile1x128;
  const uint8_t* data = nullptr;
  const float* scale_inv = nullptr;
};

// Owning storage for one FP8 matrix in the device layout.
class Fp8DeviceMatrix {
 public:
  static absl::StatusOr<Fp8DeviceMatrix> allocate(int64_t rows, int64_t cols, ScalingMode mode);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  ScalingMode mode() const { return mode_; }
  uint8_t* data() const { return data_.as<uint8_t>(); }
  float* scale_inv() const { return scales_.as<float>(); }
  Fp8DeviceView view() const { return {rows_, cols_, mode_, data(), scale_inv()}; }

 private:
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  ScalingMode mode_ = ScalingMode::kTile1x128;
  DeviceBuffer data_;
  DeviceBuffer scales_;
};

// Host Fp8Matrix (CPU layout) -> device (device layout), and back. Both wait for the stream.
absl::StatusOr<Fp8DeviceMatrix> upload(const Fp8Matrix& host, Stream stream);
absl::StatusOr<Fp8Matrix> download(const Fp8DeviceView& device, Stream stream);

// ---- Quantization (bit-exact with kernels::quantize) ------------------------------------------

// x: device fp32 [rows, cols] row-major. Writes q (rows*cols codes) and scale_inv
// (gemm_scale_count floats, device layout). Partial edge tiles/blocks are scaled by the amax of
// the elements they hold; options.pow2_scales rounds every scale_inv up to a power of two.
// kPerTensor derives the scale from the amax of the whole tensor.
absl::Status quantize(const float* x, int64_t rows, int64_t cols, ScalingMode mode,
                      QuantOptions options, uint8_t* q, float* scale_inv, Stream stream);
// Same, into `out` (whose shape and mode must match).
absl::Status quantize(const float* x, QuantOptions options, Fp8DeviceMatrix& out, Stream stream);

// out[rows, cols] = e4m3_to_float(q) * scale_inv of its block (device pointers).
absl::Status dequantize(const Fp8DeviceView& q, float* out, Stream stream);

// Exact transpose of a 128x128-block matrix (dgrad's B = W^T): codes and block scales
// transposed, no requantization. `out` must be [w.cols, w.rows] with kBlock128x128.
absl::Status transpose_blocks(const Fp8DeviceView& w, Fp8DeviceMatrix& out, Stream stream);

// KV cache (vLLM convention): out[i] = e4m3(x[i] / scale), read back as e4m3_to_float(q) * scale.
// `scale` must be finite and > 0.
absl::Status quantize_with_scale(const float* x, int64_t n, float scale, uint8_t* out,
                                 Stream stream);
absl::Status dequantize_with_scale(const uint8_t* q, int64_t n, float scale, float* out,
                                   Stream stream);

// ---- GEMM through cuBLASLt ----------------------------------------------------------------------

inline constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

class CublasLtGemm {
 public:
  // Needs an sm_90 device (FailedPreconditionError otherwise).
  static absl::StatusOr<std::unique_ptr<CublasLtGemm>> create(
      size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Block-scaled FP8: y[M,N] = a[M,K] . b[N,K]^T, see the rules at the top of this file.
  // y: float* (kF32) or uint16_t* bf16 bits (kBF16), device, row-major, ld N.
  absl::Status gemm_fp8(const Fp8DeviceView& a, const Fp8DeviceView& b, void* y, OutDtype out,
                        bool accumulate, Stream stream);

  // BF16 baseline with the same TN semantics: a [M,K], b [N,K] bf16 bits (device), fp32
  // accumulation. Rules: K % 8 == 0, N % 8 == 0, 16-byte aligned pointers.
  absl::Status gemm_bf16(const uint16_t* a, const uint16_t* b, void* y, int64_t m, int64_t n,
                         int64_t k, OutDtype out, bool accumulate, Stream stream);

  // Number of cached plans (shape + scaling + dtype + alignment combinations seen so far).
  size_t cached_plans() const;

 private:
  struct Impl;
  explicit CublasLtGemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Checks the FP8 GEMM rules above without touching the device (also used by gemm_fp8).
absl::Status check_gemm_fp8_args(const Fp8DeviceView& a, const Fp8DeviceView& b, const void* y);

}  // namespace fp8rl::kernels::cuda
