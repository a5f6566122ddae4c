// CPU backend of the linear layers: OpenBLAS sgemm for fp32/bf16, kernels::gemm_fp8 for FP8.
#include "model/linear.h"

#include <cblas.h>

#include "common/parallel.h"
#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "model/ops.h"

namespace fp8rl::model {
namespace {

// BLAS runs single-threaded inside our own pool (kernels/gemm.h use_single_threaded_blas: the
// same bits whatever the thread count; OpenBLAS's threads spin-wait, which costs more than the
// GEMM itself for the small matrices of decode steps on a busy 2-core machine; the pool already
// splits big GEMMs by rows).
void blas_single_threaded() { kernels::use_single_threaded_blas(); }

constexpr int64_t kRowsPerTask = 16;

// Runs gemm(r0, r1) over row ranges of an [m, *] output in parallel when the work is large.
template <typename Fn>
void split_rows(int64_t m, int64_t flops_per_row, const Fn& gemm) {
  blas_single_threaded();
  if (m * flops_per_row < (int64_t{1} << 21) || m < 2 * kRowsPerTask) {
    gemm(0, m);
    return;
  }
  parallel_for(
      m, [&](int64_t b, int64_t e) { gemm(b, e); }, kRowsPerTask);
}

void transpose(const float* x, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = x[r * cols + c];
      }
    }
  }
}

}  // namespace

void prepare_linear(const float* master, int64_t out, int64_t in, Precision precision,
                    bool pow2_scales, LinearWeight* w, bool exact_accumulate) {
  w->out = out;
  w->in = in;
  w->precision = precision;
  w->pow2_scales = pow2_scales;
  w->master = master;
  w->bf16.clear();
  w->q = {};
  w->qt = {};
  w->exact.clear();
  if (precision == Precision::kBF16) {
    w->bf16.assign(master, master + out * in);
    ops::round_bf16_inplace(w->bf16.data(), out * in);
  }
  if (precision == Precision::kBF16 || (precision == Precision::kF32 && exact_accumulate)) {
    const float* d = w->dense();
    w->exact.assign(d, d + out * in);
  } else if (precision == Precision::kFP8) {
    w->q = kernels::quantize(master, out, in, kernels::ScalingMode::kBlock128x128,
                             {.pow2_scales = pow2_scales});
    w->qt = kernels::transpose_blocks(w->q);
  }
}

void prepare_linear_fp8(const float* master, kernels::Fp8Matrix q, bool pow2_scales,
                        LinearWeight* w) {
  w->out = q.rows;
  w->in = q.cols;
  w->precision = Precision::kFP8;
  w->pow2_scales = pow2_scales;
  w->master = master;
  w->bf16.clear();
  w->exact.clear();
  w->q = std::move(q);
  w->qt = kernels::transpose_blocks(w->q);
}

absl::Status linear_forward(const LinearWeight& w, const float* x, int64_t m, const float* bias,
                            float* y) {
  if (m == 0) return absl::OkStatus();
  if (w.precision == Precision::kFP8) {
    const kernels::Fp8Matrix xq = kernels::quantize(x, m, w.in, kernels::ScalingMode::kTile1x128,
                                                    {.pow2_scales = w.pow2_scales});
    // fp32 accumulation out; the single bf16 rounding happens after the bias (GEMM epilogue).
    if (auto s = kernels::gemm_fp8(xq, w.q, y, kernels::OutDtype::kF32); !s.ok()) return s;
  } else if (!w.exact.empty()) {
    split_rows(m, w.out * w.in, [&](int64_t r0, int64_t r1) {
      thread_local std::vector<double> xd, yd;
      xd.assign(x + r0 * w.in, x + r1 * w.in);
      yd.resize((r1 - r0) * w.out);
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(r1 - r0),
                  static_cast<int>(w.out), static_cast<int>(w.in), 1.0, xd.data(),
                  static_cast<int>(w.in), w.exact.data(), static_cast<int>(w.in), 0.0, yd.data(),
                  static_cast<int>(w.out));
      for (int64_t i = 0; i < (r1 - r0) * w.out; ++i) y[r0 * w.out + i] = static_cast<float>(yd[i]);
    });
  } else {
    split_rows(m, w.out * w.in, [&](int64_t r0, int64_t r1) {
      kernels::gemm_f32(x + r0 * w.in, w.dense(), y + r0 * w.out, r1 - r0, w.out, w.in);
    });
  }
  if (bias) {
    for (int64_t r = 0; r < m; ++r) {
      float* yr = y + r * w.out;
      for (int64_t j = 0; j < w.out; ++j) yr[j] += bias[j];
    }
  }
  if (w.precision != Precision::kF32) ops::round_bf16_inplace(y, m * w.out);
  return absl::OkStatus();
}

absl::Status linear_backward(const LinearWeight& w, const float* x, const float* dy, int64_t m,
                             float* dx, float* dw, float* db) {
  const int64_t n = w.out, k = w.in;
  if (m == 0) {
    return absl::OkStatus();
  }
  if (db) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) db[j] += dy[r * n + j];
    }
  }
  if (w.precision == Precision::kFP8) {
    const kernels::QuantOptions opt{.pow2_scales = w.pow2_scales};
    // dgrad: dX[m,k] = dY[m,n] . W[n,k]  =  A . B^T with A = dY (1x128 along n), B = W^T blocks.
    if (dx) {
      const kernels::Fp8Matrix dyq =
          kernels::quantize(dy, m, n, kernels::ScalingMode::kTile1x128, opt);
      if (auto s = kernels::gemm_fp8(dyq, w.qt, dx, kernels::OutDtype::kF32); !s.ok()) return s;
    }
    // wgrad: dW[n,k] += dY^T[n,m] . X^T[k,m]^T, both 1x128 along m.
    if (dw) {
      std::vector<float> t(std::max(n, k) * m);
      transpose(dy, m, n, t.data());
      const kernels::Fp8Matrix dyt =
          kernels::quantize(t.data(), n, m, kernels::ScalingMode::kTile1x128, opt);
      transpose(x, m, k, t.data());
      const kernels::Fp8Matrix xt =
          kernels::quantize(t.data(), k, m, kernels::ScalingMode::kTile1x128, opt);
      if (auto s = kernels::gemm_fp8(dyt, xt, dw, kernels::OutDtype::kF32, /*accumulate=*/true);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (dx) {
    split_rows(m, n * k, [&](int64_t r0, int64_t r1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(r1 - r0),
                  static_cast<int>(k), static_cast<int>(n), 1.0f, dy + r0 * n, static_cast<int>(n),
                  w.dense(), static_cast<int>(k), 0.0f, dx + r0 * k, static_cast<int>(k));
    });
  }
  if (dw) {
    // Split over rows of dW (output features): each task reduces over all m tokens.
    split_rows(n, m * k, [&](int64_t n0, int64_t n1) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(n1 - n0),
                  static_cast<int>(k), static_cast<int>(m), 1.0f, dy + n0, static_cast<int>(n), x,
                  static_cast<int>(k), 1.0f, dw + n0 * k, static_cast<int>(k));
    });
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::model
