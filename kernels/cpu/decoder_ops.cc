// CPU reference of the CUDA decoder kernels: each function is the kernel's index mapping as a
// plain loop around the shared math of kernels/device_math.
#include "kernels/cpu/decoder_ops.h"

#include <limits>

#include "kernels/device_math/attention.h"
#include "kernels/device_math/attention_split.h"
#include "kernels/device_math/rmsnorm.h"
#include "kernels/device_math/rope.h"
#include "kernels/device_math/softmax.h"
#include "kernels/device_math/swiglu.h"

namespace fp8rl::kernels::cpu {

namespace {
template <typename T>
int64_t gather(const T* table, int64_t vocab, int64_t h, const int32_t* tokens, int64_t rows,
               float* x) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = tokens[r];
    const bool ok = t >= 0 && t < vocab;
    bad += ok ? 0 : 1;
    for (int64_t i = 0; i < h; ++i) {
      x[r * h + i] =
          ok ? static_cast<float>(table[t * h + i]) : std::numeric_limits<float>::quiet_NaN();
    }
  }
  return bad;
}
}  // namespace

int64_t embed_gather(const float* table, int64_t vocab, int64_t h, const int32_t* tokens,
                     int64_t rows, float* x) {
  return gather(table, vocab, h, tokens, rows, x);
}
int64_t embed_gather(const double* table, int64_t vocab, int64_t h, const int32_t* tokens,
                     int64_t rows, float* x) {
  return gather(table, vocab, h, tokens, rows, x);
}

void rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, float eps, bool to_bf16,
             float* y, float* inv_rms) {
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = dm::rmsnorm_row(x + r * h, g, h, eps, to_bf16, y + r * h);
    if (inv_rms != nullptr) inv_rms[r] = inv;
  }
}

void rope(const float* cos, const float* sin, const int32_t* pos, int64_t rows, int64_t heads,
          int64_t head_dim, bool to_bf16, float* x) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = static_cast<int64_t>(pos[r]) * half;
    for (int64_t hh = 0; hh < heads; ++hh) {
      float* v = x + (r * heads + hh) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        dm::rope_rotate_pair(v[i], v[i + half], cos[t + i], sin[t + i]);
        if (to_bf16) {
          v[i] = dm::round_bf16(v[i]);
          v[i + half] = dm::round_bf16(v[i + half]);
        }
      }
    }
  }
}

void swiglu(const float* g, const float* u, int64_t n, bool to_bf16, float* act) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = dm::swiglu(g[i], u[i]);
    act[i] = to_bf16 ? dm::round_bf16(a) : a;
  }
}

namespace {

// Causal GQA prefill over packed sequences: `attend(q_row, keys, values, n, out_row)` attends one
// query row of one head over the first n positions of its sequence.
template <typename Attend>
void prefill_rows(const float* q, const float* k, const float* v, const int32_t* seq_start,
                  int64_t n_seq, int64_t n_heads, int64_t n_kv, int64_t head_dim, float* out,
                  Attend attend) {
  const int64_t qd = n_heads * head_dim, kvd = n_kv * head_dim, group = n_heads / n_kv;
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t r0 = seq_start[s], r1 = seq_start[s + 1];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t hh = 0; hh < n_heads; ++hh) {
        const int64_t g = hh / group;
        const dm::FloatRows keys{k + r0 * kvd + g * head_dim, kvd};
        const dm::FloatRows values{v + r0 * kvd + g * head_dim, kvd};
        attend(q + r * qd + hh * head_dim, keys, values, r - r0 + 1, out + r * qd + hh * head_dim);
      }
    }
  }
}

}  // namespace

void attention_prefill(const float* q, const float* k, const float* v, const int32_t* seq_start,
                       int64_t n_seq, int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale,
                       float* out) {
  prefill_rows(
      q, k, v, seq_start, n_seq, n_heads, n_kv, head_dim, out,
      [&](const float* qr, const dm::FloatRows& keys, const dm::FloatRows& values, int64_t n,
          float* o) { dm::attend_row(qr, keys, values, n, head_dim, scale, o); });
}

void attention_prefill_split(const float* q, const float* k, const float* v,
                             const int32_t* seq_start, int64_t n_seq, int64_t n_heads, int64_t n_kv,
                             int64_t head_dim, float scale, float* out) {
  prefill_rows(q, k, v, seq_start, n_seq, n_heads, n_kv, head_dim, out,
               [&](const float* qr, const dm::FloatRows& keys, const dm::FloatRows& values,
                   int64_t n, float* o) {
                 dm::attend_row_split(qr, keys, values, n, head_dim, scale, dm::kDecodeStripes, o);
               });
}

void kv_write_paged(const float* k, const float* v, int64_t rows, const int32_t* row_seq,
                    const int32_t* row_pos, const dm::PagedKvView& kv) {
  const int64_t kvd = kv.n_kv * kv.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < kv.n_kv; ++g) {
      const int64_t off = dm::paged_kv_offset(kv, row_seq[r], row_pos[r], g);
      for (int64_t d = 0; d < kv.head_dim; ++d) {
        dm::kv_store(kv.k_pool, off + d, kv.dtype, kv.k_scale, k[r * kvd + g * kv.head_dim + d]);
        dm::kv_store(kv.v_pool, off + d, kv.dtype, kv.v_scale, v[r * kvd + g * kv.head_dim + d]);
      }
    }
  }
}

void attention_paged(const float* q, int64_t rows, const int32_t* row_seq, const int32_t* row_pos,
                     const dm::PagedKvView& kv, int64_t n_heads, float scale, float* out) {
  const int64_t hd = kv.head_dim, qd = n_heads * hd, group = n_heads / kv.n_kv;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = row_seq[r];
    for (int64_t hh = 0; hh < n_heads; ++hh) {
      const int64_t g = hh / group;
      const dm::PagedRows keys{&kv, kv.k_pool, kv.k_scale, s, g};
      const dm::PagedRows values{&kv, kv.v_pool, kv.v_scale, s, g};
      dm::attend_row(q + r * qd + hh * hd, keys, values, int64_t{row_pos[r]} + 1, hd, scale,
                     out + r * qd + hh * hd);
    }
  }
}

void attention_paged_split(const float* q, int64_t rows, const int32_t* row_seq,
                           const int32_t* row_pos, const dm::PagedKvView& kv, int64_t n_heads,
                           float scale, float* out) {
  const int64_t hd = kv.head_dim, qd = n_heads * hd, group = n_heads / kv.n_kv;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = row_seq[r];
    for (int64_t hh = 0; hh < n_heads; ++hh) {
      const int64_t g = hh / group;
      const dm::PagedRows keys{&kv, kv.k_pool, kv.k_scale, s, g};
      const dm::PagedRows values{&kv, kv.v_pool, kv.v_scale, s, g};
      dm::attend_row_split(q + r * qd + hh * hd, keys, values, int64_t{row_pos[r]} + 1, hd, scale,
                           dm::kDecodeStripes, out + r * qd + hh * hd);
    }
  }
}

void log_softmax(const float* z, int64_t rows, int64_t vocab, float inv_t, const int32_t* targets,
                 float* lse, float* target_logprob) {
  for (int64_t r = 0; r < rows; ++r) {
    const float l = dm::logsumexp_scaled(z + r * vocab, vocab, inv_t);
    if (lse != nullptr) lse[r] = l;
    if (targets != nullptr && target_logprob != nullptr) {
      target_logprob[r] = z[r * vocab + targets[r]] * inv_t - l;
    }
  }
}

void sample(const float* z, int64_t rows, int64_t vocab, const dm::SampleParams* params,
            dm::RngState* rng, int32_t* scratch, dm::SampleResult* out) {
  for (int64_t r = 0; r < rows; ++r) {
    out[r] = dm::sample_row(z + r * vocab, vocab, params[r], rng[r], scratch + r * vocab);
  }
}

}  // namespace fp8rl::kernels::cpu
