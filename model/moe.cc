// CPU reference of the mixture-of-experts MLP: router, top-k, grouping by expert, the experts'
// grouped SwiGLU GEMMs (FP8 like every other linear through model/linear.h), and its backward.
#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "kernels/formats.h"
#include "model/ops.h"

namespace fp8rl::model {
namespace {

// y[m, out] = x[m, in] . W^T accumulated in double per element, in a fixed order (a row's result
// never depends on the other rows of the call).
void router_forward(const RouterWeight& w, const float* x, int64_t m, float* y) {
  parallel_for(
      m,
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* xr = x + r * w.in;
          for (int64_t j = 0; j < w.out; ++j) {
            const double* wj = w.w.data() + j * w.in;
            double acc = 0;
            for (int64_t i = 0; i < w.in; ++i) acc += wj[i] * static_cast<double>(xr[i]);
            y[r * w.out + j] = static_cast<float>(acc);
          }
        }
      },
      16);
}

// Backward of router_forward: dx[m, in] += dy . W; dw[out, in] += dy^T . x.
void router_backward(const RouterWeight& w, const float* x, const float* dy, int64_t m, float* dx,
                     float* dw) {
  parallel_for(
      m,
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          float* dxr = dx + r * w.in;
          for (int64_t j = 0; j < w.out; ++j) {
            const double g = dy[r * w.out + j];
            if (g == 0) continue;
            const double* wj = w.w.data() + j * w.in;
            for (int64_t i = 0; i < w.in; ++i) dxr[i] += static_cast<float>(g * wj[i]);
          }
        }
      },
      16);
  parallel_for(w.out, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      float* dwj = dw + j * w.in;
      for (int64_t r = 0; r < m; ++r) {
        const float g = dy[r * w.out + j];
        if (g == 0) continue;
        const float* xr = x + r * w.in;
        for (int64_t i = 0; i < w.in; ++i) dwj[i] += g * xr[i];
      }
    }
  });
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// A SwiGLU MLP (gate, up, down) over rows [m] of x: g, u, act [m, F] kept, y [m, H].
absl::Status swiglu_mlp(const std::array<LinearWeight, 3>& w, const float* x, int64_t m, bool bf16,
                        float* g, float* u, float* act, float* y) {
  const int64_t f = w[0].out;
  if (auto s = linear_forward(w[0], x, m, nullptr, g); !s.ok()) return s;
  if (auto s = linear_forward(w[1], x, m, nullptr, u); !s.ok()) return s;
  ops::swiglu_forward(g, u, m * f, act);
  if (bf16) ops::round_bf16_inplace(act, m * f);
  return linear_forward(w[2], act, m, nullptr, y);
}

// Backward of swiglu_mlp: dx[m, H] overwritten; gradients added into d_gate, d_up, d_down.
absl::Status swiglu_mlp_backward(const std::array<LinearWeight, 3>& w, const float* x,
                                 const float* g, const float* u, const float* act, const float* dy,
                                 int64_t m, float* d_gate, float* d_up, float* d_down, float* dx) {
  if (m == 0) return absl::OkStatus();
  const int64_t f = w[0].out, h = w[0].in;
  std::vector<float> dact(m * f), dg(m * f), du(m * f), tmp(m * h);
  if (auto s = linear_backward(w[2], act, dy, m, dact.data(), d_down, nullptr); !s.ok()) {
    return s;
  }
  ops::swiglu_backward(g, u, dact.data(), m * f, dg.data(), du.data());
  if (auto s = linear_backward(w[0], x, dg.data(), m, dx, d_gate, nullptr); !s.ok()) {
    return s;
  }
  if (auto s = linear_backward(w[1], x, du.data(), m, tmp.data(), d_up, nullptr); !s.ok()) {
    return s;
  }
  for (int64_t i = 0; i < m * h; ++i) dx[i] += tmp[i];
  return absl::OkStatus();
}

// Runs fn(e) for every expert in parallel and returns the first error.
template <typename Fn>
absl::Status for_each_expert(int64_t num_experts, const Fn& fn) {
  std::vector<absl::Status> status(num_experts);
  parallel_for(
      num_experts,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) status[i] = fn(i);
      },
      1);
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> expert_counts(const std::vector<int32_t>& sel, int64_t num_experts) {
  std::vector<int64_t> counts(num_experts, 0);
  for (int32_t e : sel) {
    if (e >= 0 && e < num_experts) ++counts[e];
  }
  return counts;
}

RoutingDifference routing_difference(const std::vector<std::vector<int32_t>>& a,
                                     const std::vector<std::vector<int32_t>>& b, int64_t width,
                                     int64_t k) {
  RoutingDifference out;
  if (width <= 0 || k <= 0) return out;
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
    const size_t n = std::min(a[s].size(), b[s].size()) / static_cast<size_t>(width);
    for (size_t t = 0; t < n; ++t) {
      bool differs = false;
      for (int64_t g = 0; g < width && !differs; g += k) {
        const int32_t* x = a[s].data() + t * width + g;
        const int32_t* y = b[s].data() + t * width + g;
        for (int64_t i = 0; i < k && !differs; ++i) differs = std::find(y, y + k, x[i]) == y + k;
      }
      ++out.tokens;
      out.differ += differs ? 1 : 0;
    }
  }
  return out;
}

absl::Status moe_forward(const MoeLayerWeights& w, const MoeOptions& opt, const float* x, int64_t m,
                         const int32_t* forced, MoeActivations* a, float* out) {
  const int64_t n_exp = w.router.out, h = w.router.in, k = opt.top_k;
  const int64_t f = w.experts.empty() ? 0 : w.experts[0][0].out;
  // Router: logits [m, E] (fp32 from a double accumulation), softmax in double, top-k.
  a->probs.resize(m * n_exp);
  router_forward(w.router, x, m, a->probs.data());
  a->sel.resize(m * k);
  a->router_sel.resize(m * k);
  a->weight.resize(m * k);
  a->prob_sum.resize(m);
  a->overrode.resize(m);
  parallel_for(
      m,
      [&](int64_t b, int64_t e) {
        std::vector<int32_t> order(n_exp);
        for (int64_t r = b; r < e; ++r) {
          float* p = a->probs.data() + r * n_exp;
          const float mx = *std::max_element(p, p + n_exp);
          double sum = 0;
          for (int64_t j = 0; j < n_exp; ++j) sum += std::exp(static_cast<double>(p[j]) - mx);
          for (int64_t j = 0; j < n_exp; ++j) {
            p[j] = static_cast<float>(std::exp(static_cast<double>(p[j]) - mx) / sum);
          }
          int32_t* sel = a->sel.data() + r * k;
          // Highest probability first; ties go to the lower expert index.
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(
              order.begin(), order.begin() + k, order.end(),
              [&](int32_t i, int32_t j) { return p[i] > p[j] || (p[i] == p[j] && i < j); });
          std::copy(order.begin(), order.begin() + k, a->router_sel.data() + r * k);
          a->overrode[r] = 0;
          if (forced != nullptr && forced[r * k] >= 0) {
            std::copy(forced + r * k, forced + (r + 1) * k, sel);
            for (int64_t i = 0; i < k; ++i) {
              a->overrode[r] |= std::find(sel, sel + k, order[i]) == sel + k ? 1 : 0;
            }
          } else {
            std::copy(order.begin(), order.begin() + k, sel);
          }
          double kept = 0;
          for (int64_t i = 0; i < k; ++i) kept += p[sel[i]];
          a->prob_sum[r] = static_cast<float>(kept);
          for (int64_t i = 0; i < k; ++i) {
            float wt = p[sel[i]];
            if (opt.norm_topk_prob) wt = static_cast<float>(p[sel[i]] / kept);
            a->weight[r * k + i] = opt.bf16 ? kernels::round_bf16(wt) : wt;
          }
        }
      },
      16);
  // Group the (row, k) slots by expert.
  ExpertGroups& gr = a->groups;
  gr.offset.assign(n_exp + 1, 0);
  for (int64_t i = 0; i < m * k; ++i) ++gr.offset[a->sel[i] + 1];
  for (int64_t e = 0; e < n_exp; ++e) gr.offset[e + 1] += gr.offset[e];
  gr.slot_row.resize(m * k);
  gr.slot_of.resize(m * k);
  {
    std::vector<int64_t> next(gr.offset.begin(), gr.offset.end() - 1);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < k; ++i) {
        const int64_t slot = next[a->sel[r * k + i]]++;
        gr.slot_row[slot] = static_cast<int32_t>(r);
        gr.slot_of[r * k + i] = static_cast<int32_t>(slot);
      }
    }
  }
  const int64_t slots = m * k;
  a->xs.resize(slots * h);
  for (int64_t s = 0; s < slots; ++s) {
    std::copy(x + gr.slot_row[s] * h, x + (gr.slot_row[s] + 1) * h, a->xs.data() + s * h);
  }
  a->g.resize(slots * f);
  a->u.resize(slots * f);
  a->act.resize(slots * f);
  a->ys.resize(slots * h);
  // The grouped GEMMs: expert e's SwiGLU over its rows [offset[e], offset[e + 1]).
  if (auto s = for_each_expert(n_exp,
                               [&](int64_t e) -> absl::Status {
                                 const int64_t o = gr.offset[e], n = gr.offset[e + 1] - o;
                                 if (n == 0) return absl::OkStatus();
                                 return swiglu_mlp(w.experts[e], a->xs.data() + o * h, n, opt.bf16,
                                                   a->g.data() + o * f, a->u.data() + o * f,
                                                   a->act.data() + o * f, a->ys.data() + o * h);
                               });
      !s.ok()) {
    return s;
  }
  // Combine: out[r] = sum_k weight[r, k] * ys[slot(r, k)], in k order.
  parallel_for(
      m,
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          float* o = out + r * h;
          std::fill(o, o + h, 0.0f);
          for (int64_t i = 0; i < k; ++i) {
            const float wt = a->weight[r * k + i];
            const float* y = a->ys.data() + static_cast<int64_t>(gr.slot_of[r * k + i]) * h;
            for (int64_t j = 0; j < h; ++j) o[j] += wt * y[j];
          }
        }
      },
      16);
  if (w.has_shared) {
    const int64_t fs = w.shared[0].out;
    a->z.resize(m);
    a->sg.resize(m * fs);
    a->su.resize(m * fs);
    a->sact.resize(m * fs);
    a->s_out.resize(m * h);
    router_forward(w.shared_gate, x, m, a->z.data());
    if (auto s = swiglu_mlp(w.shared, x, m, opt.bf16, a->sg.data(), a->su.data(), a->sact.data(),
                            a->s_out.data());
        !s.ok()) {
      return s;
    }
    for (int64_t r = 0; r < m; ++r) {
      const float gate = sigmoid(a->z[r]);
      for (int64_t j = 0; j < h; ++j) out[r * h + j] += gate * a->s_out[r * h + j];
    }
  }
  if (opt.bf16) ops::round_bf16_inplace(out, m * h);
  return absl::OkStatus();
}

absl::Status moe_backward(const MoeLayerWeights& w, const MoeOptions& opt,
                          const MoeGradOffsets& off, const MoeActivations& a, const float* x,
                          const float* dout, int64_t m, const float* dprob_extra, float* dx,
                          GradientSink& grads) {
  const int64_t n_exp = w.router.out, h = w.router.in, k = opt.top_k;
  const int64_t slots = m * k;
  const ExpertGroups& gr = a.groups;
  // y = sum_k weight_k * ys_k: d ys_k = weight_k * dy, d weight_k = dy . ys_k.
  std::vector<float> dys(slots * h), dwt(slots);
  parallel_for(
      m,
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* d = dout + r * h;
          for (int64_t i = 0; i < k; ++i) {
            const int64_t slot = gr.slot_of[r * k + i];
            const float wt = a.weight[r * k + i];
            float* t = dys.data() + slot * h;
            for (int64_t j = 0; j < h; ++j) t[j] = wt * d[j];
            dwt[r * k + i] = ops::dot(d, a.ys.data() + slot * h, h);
          }
        }
      },
      16);
  // The experts' grouped backward (each expert's gradients are its own: no races). The sink is
  // asked for every expert's storage here, on this thread.
  std::vector<std::array<float*, 3>> dw(static_cast<size_t>(n_exp));
  for (int64_t e = 0; e < n_exp; ++e) {
    dw[e] = {grads.grad((*off.expert_gate)[e]), grads.grad((*off.expert_up)[e]),
             grads.grad((*off.expert_down)[e])};
  }
  std::vector<float> dxs(slots * h);
  const int64_t f = w.experts.empty() ? 0 : w.experts[0][0].out;
  if (auto s = for_each_expert(n_exp,
                               [&](int64_t e) -> absl::Status {
                                 const int64_t o = gr.offset[e], n = gr.offset[e + 1] - o;
                                 return swiglu_mlp_backward(
                                     w.experts[e], a.xs.data() + o * h, a.g.data() + o * f,
                                     a.u.data() + o * f, a.act.data() + o * f, dys.data() + o * h,
                                     n, dw[e][0], dw[e][1], dw[e][2], dxs.data() + o * h);
                               });
      !s.ok()) {
    return s;
  }
  parallel_for(
      m,
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          float* d = dx + r * h;
          std::fill(d, d + h, 0.0f);
          for (int64_t i = 0; i < k; ++i) {
            const float* t = dxs.data() + static_cast<int64_t>(gr.slot_of[r * k + i]) * h;
            for (int64_t j = 0; j < h; ++j) d[j] += t[j];
          }
        }
      },
      16);
  // Router: weight_k = p[sel_k] (/ sum_j p[sel_j] with norm_topk_prob); then softmax backward.
  std::vector<float> dlogits(m * n_exp);
  parallel_for(
      m,
      [&](int64_t b, int64_t e) {
        std::vector<double> dp(n_exp);
        for (int64_t r = b; r < e; ++r) {
          const float* p = a.probs.data() + r * n_exp;
          for (int64_t j = 0; j < n_exp; ++j) dp[j] = dprob_extra ? dprob_extra[j] : 0.0;
          const int32_t* sel = a.sel.data() + r * k;
          if (opt.norm_topk_prob) {
            const double sum = a.prob_sum[r];
            double mix = 0;  // sum_k dwt_k * p_k / sum
            for (int64_t i = 0; i < k; ++i) mix += dwt[r * k + i] * (p[sel[i]] / sum);
            for (int64_t i = 0; i < k; ++i) dp[sel[i]] += (dwt[r * k + i] - mix) / sum;
          } else {
            for (int64_t i = 0; i < k; ++i) dp[sel[i]] += dwt[r * k + i];
          }
          double pdp = 0;
          for (int64_t j = 0; j < n_exp; ++j) pdp += p[j] * dp[j];
          for (int64_t j = 0; j < n_exp; ++j) {
            dlogits[r * n_exp + j] = static_cast<float>(p[j] * (dp[j] - pdp));
          }
        }
      },
      16);
  router_backward(w.router, x, dlogits.data(), m, dx, grads.grad(off.router));
  if (w.has_shared) {
    // out += sigmoid(z) * s_out, z = shared_gate . x, s_out = shared(x).
    std::vector<float> ds(m * h), dz(m), dsx(m * h);
    for (int64_t r = 0; r < m; ++r) {
      const float gate = sigmoid(a.z[r]);
      const float* d = dout + r * h;
      for (int64_t j = 0; j < h; ++j) ds[r * h + j] = gate * d[j];
      dz[r] = ops::dot(d, a.s_out.data() + r * h, h) * gate * (1.0f - gate);
    }
    if (auto s =
            swiglu_mlp_backward(w.shared, x, a.sg.data(), a.su.data(), a.sact.data(), ds.data(), m,
                                grads.grad(off.shared_gate), grads.grad(off.shared_up),
                                grads.grad(off.shared_down), dsx.data());
        !s.ok()) {
      return s;
    }
    for (int64_t i = 0; i < m * h; ++i) dx[i] += dsx[i];
    router_backward(w.shared_gate, x, dz.data(), m, dx, grads.grad(off.shared_expert_gate));
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::model
