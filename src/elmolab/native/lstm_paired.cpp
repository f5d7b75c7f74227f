// The time loop of the `paired` LSTM path in C++ (elmolab.models.lstm_paired): the same
// computation as _PairedLayer's Python loop, step for step, with the elementwise work of a step
// in one pass over each row instead of a dozen tensor ops, and no Python between the steps.
//
// Shapes (direction-major, contiguous): xw (G, T, B, 4C) the input products x_t W_x and bias
// (G, 4C) float32, both with the j gate's block doubled (tanh(z) = 2 sigmoid(2z) - 1); W_h
// (G, P, 4C) and W_P (G, C, P); xw, W_h and W_P in the matmul dtype (float32 or bfloat16);
// h0 (G, B, P) and c0 (G, B, C) float32, keep (T, B, 1) float32 or None. The products run in
// ATen (at::bmm_out), in the matmul dtype; everything else in float32. Backward returns the
// gradient of xw in the matmul dtype and that of the bias (float32) summed over steps and rows.
// Built at run time by elmolab.native for the CPU's vector width (AVX-512, AVX2 or none).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include "vec_io.h"

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::BFloat16;
using at::Tensor;
using namespace elmolab_vec;


// ATen's sigmoid: 1 / (1 + exp(0 - x)), vectorised the same way.
inline Vec sigmoid(const Vec& x) {
  return ((Vec(0.f) - x).exp() + Vec(1.f)).reciprocal();
}
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(0.f - x)); }

inline Vec clip(const Vec& x, const Vec& limit) {
  return at::vec::minimum(at::vec::maximum(x, Vec(0.f) - limit), limit);
}
// NaN stays NaN, as in torch.clamp (a diverging run must show in its loss).
inline float clip(float x, float limit) { return x < -limit ? -limit : (x > limit ? limit : x); }

// Rows (g, b) of a (G, T or T + 1, B, width) buffer at step t.
inline int64_t row_offset(int64_t g, int64_t t, int64_t b, int64_t steps, int64_t B,
                          int64_t width) {
  return ((g * steps + t) * B + b) * width;
}

constexpr int64_t kGrain = 8;  // rows per parallel task

// The loop's sizes, read from a (G, T, B, 4C) tensor of gates and W_P (G, C, P).
struct Dims {
  int64_t G, T, B, C, P;

  Dims(const Tensor& gates, const Tensor& W_P)
      : G(gates.size(0)), T(gates.size(1)), B(gates.size(2)), C(gates.size(3) / 4),
        P(W_P.size(2)) {}
};

// The loop's optional inputs: keep (T, B, 1) float32 as a pointer (null: no zero starts), and the
// clips as floats.
struct LoopOptions {
  Tensor keep_tensor;
  const float* keep = nullptr;
  std::optional<float> cell_clip, proj_clip;

  LoopOptions(const std::optional<Tensor>& keep_opt, std::optional<double> cell,
              std::optional<double> proj) {
    if (keep_opt.has_value()) {
      keep_tensor = keep_opt->to(at::kFloat).contiguous();
      keep = keep_tensor.data_ptr<float>();
    }
    if (cell) cell_clip = static_cast<float>(*cell);
    if (proj) proj_clip = static_cast<float>(*proj);
  }
};

// The gates and the cell of step t for every row: acts, cells[t + 1], cell_raw, tanh_c, ms.
// gates = (xw + bias) + h_{t-1} W_h (gates_mm, (G, B, 4C)), the sums in float32; cells[t] is
// scaled by keep[t] first (in place, as read).
template <typename M>
void step_forward(const M* xw, const float* bias, const M* gates_mm, float* acts, float* cells,
                  float* cell_raw, float* tanh_c, M* ms, const Dims& d, const LoopOptions& o,
                  int64_t t) {
  const auto [G, T, B, C, P] = d;
  const float* keep = o.keep;
  const auto cell_clip = o.cell_clip;
  const int64_t four_c = 4 * C;
  at::parallel_for(0, G * B, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r / B, b = r % B;
      const M* x = xw + row_offset(g, t, b, T, B, four_c);
      const float* bg = bias + g * four_c;
      const M* hw = gates_mm + r * four_c;
      float* a = acts + row_offset(g, t, b, T, B, four_c);
      int64_t k = 0;
      for (; k + kLanes <= four_c; k += kLanes) {
        store(a + k, sigmoid((load(x + k) + load(bg + k)) + load(hw + k)));
      }
      for (; k < four_c; ++k) a[k] = sigmoid((to_float(x[k]) + bg[k]) + to_float(hw[k]));
      float* i = a;
      float* j = a + C;
      const float* f = a + 2 * C;
      const float* o = a + 3 * C;
      float* c_prev = cells + row_offset(g, t, b, T + 1, B, C);
      float* c_next = cells + row_offset(g, t + 1, b, T + 1, B, C);
      float* raw = cell_raw + row_offset(g, t, b, T, B, C);
      float* tc = tanh_c + row_offset(g, t, b, T, B, C);
      M* m = ms + row_offset(g, t, b, T, B, C);
      const float kept = keep == nullptr ? 1.f : keep[t * B + b];
      const Vec kept_v(kept), two(2.f), one(1.f);
      const Vec limit(cell_clip.value_or(0.f));
      k = 0;
      for (; k + kLanes <= C; k += kLanes) {
        const Vec jv = two * load(j + k) - one;
        store(j + k, jv);
        const Vec cp = load(c_prev + k) * kept_v;
        store(c_prev + k, cp);
        const Vec cr = load(f + k) * cp + load(i + k) * jv;
        store(raw + k, cr);
        const Vec cn = cell_clip ? clip(cr, limit) : cr;
        store(c_next + k, cn);
        const Vec th = two * sigmoid(two * cn) - one;
        store(tc + k, th);
        store(m + k, load(o + k) * th);
      }
      for (; k < C; ++k) {
        j[k] = 2.f * j[k] - 1.f;
        c_prev[k] *= kept;
        raw[k] = f[k] * c_prev[k] + i[k] * j[k];
        c_next[k] = cell_clip ? clip(raw[k], *cell_clip) : raw[k];
        tc[k] = 2.f * sigmoid(2.f * c_next[k]) - 1.f;
        m[k] = from_float<M>(o[k] * tc[k]);
      }
    }
  });
}

// The output of step t (clipped h_raw) and the next step's input h_t * keep[t + 1].
template <typename M>
void step_output(const M* h_raw, float* outputs, M* hs, const Dims& d, const LoopOptions& o,
                 int64_t t) {
  const auto [G, T, B, C, P] = d;
  const float* keep = o.keep;
  const auto proj_clip = o.proj_clip;
  at::parallel_for(0, G * B, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r / B, b = r % B;
      const M* raw = h_raw + row_offset(g, t, b, T, B, P);
      float* out = outputs + row_offset(g, t, b, T, B, P);
      const bool next = t + 1 < T;
      M* h_next = next ? hs + row_offset(g, t + 1, b, T, B, P) : nullptr;
      const float kept = (keep == nullptr || !next) ? 1.f : keep[(t + 1) * B + b];
      for (int64_t k = 0; k < P; ++k) {
        const float h = proj_clip ? clip(to_float(raw[k]), *proj_clip) : to_float(raw[k]);
        out[k] = h;
        if (next) h_next[k] = from_float<M>(h * kept);
      }
    }
  });
}

template <typename M>
std::vector<Tensor> forward_impl(const Tensor& xw, const Tensor& bias, const Tensor& W_h,
                                 const Tensor& W_P, const Tensor& h0, const Tensor& c0,
                                 const LoopOptions& options) {
  const Dims d(xw, W_P);
  const auto [G, T, B, C, P] = d;
  const int64_t four_c = 4 * C;
  const auto f32 = bias.options();
  const auto mm = W_h.options();
  Tensor acts = at::empty({G, T, B, four_c}, f32);
  Tensor cells = at::empty({G, T + 1, B, C}, f32);
  Tensor cell_raw = at::empty({G, T, B, C}, f32);
  Tensor tanh_c = at::empty({G, T, B, C}, f32);
  Tensor hs = at::empty({G, T, B, P}, mm);
  Tensor ms = at::empty({G, T, B, C}, mm);
  Tensor h_raw = at::empty({G, T, B, P}, mm);
  Tensor outputs = at::empty({G, T, B, P}, f32);
  Tensor gates_mm = at::empty({G, B, four_c}, mm);
  cells.select(1, 0).copy_(c0);
  hs.select(1, 0).copy_(options.keep ? h0 * options.keep_tensor[0] : h0);  // keep[0]: (B, 1)
  for (int64_t t = 0; t < T; ++t) {
    at::bmm_out(gates_mm, hs.select(1, t), W_h);  // (G, B, 4C)
    step_forward<M>(xw.data_ptr<M>(), bias.data_ptr<float>(), gates_mm.data_ptr<M>(),
                    acts.data_ptr<float>(), cells.data_ptr<float>(), cell_raw.data_ptr<float>(),
                    tanh_c.data_ptr<float>(), ms.data_ptr<M>(), d, options, t);
    Tensor h_t = h_raw.select(1, t);
    at::bmm_out(h_t, ms.select(1, t), W_P);  // (G, B, P)
    step_output<M>(h_raw.data_ptr<M>(), outputs.data_ptr<float>(), hs.data_ptr<M>(), d, options,
                   t);
  }
  Tensor h_T = outputs.select(1, T - 1).clone();
  Tensor c_T = cells.select(1, T).clone();
  return {outputs, h_T, c_T, acts, cells, cell_raw, tanh_c, hs, ms, h_raw};
}

std::vector<Tensor> paired_forward(const Tensor& xw, const Tensor& bias, const Tensor& W_h,
                                   const Tensor& W_P, const Tensor& h0, const Tensor& c0,
                                   const std::optional<Tensor>& keep,
                                   std::optional<double> cell_clip,
                                   std::optional<double> proj_clip) {
  TORCH_CHECK(xw.scalar_type() == W_h.scalar_type() && W_h.scalar_type() == W_P.scalar_type(),
              "xw, W_h and W_P: one matmul dtype");
  TORCH_CHECK(bias.scalar_type() == at::kFloat, "bias: float32");
  TORCH_CHECK(xw.size(1) > 0, "at least one time step");
  const Tensor x = xw.contiguous(), b = bias.contiguous();
  const Tensor h = h0.contiguous(), c = c0.contiguous();
  const LoopOptions options(keep, cell_clip, proj_clip);
  if (W_h.scalar_type() == at::kBFloat16)
    return forward_impl<BFloat16>(x, b, W_h, W_P, h, c, options);
  TORCH_CHECK(W_h.scalar_type() == at::kFloat, "matmul dtype: float32 or bfloat16");
  return forward_impl<float>(x, b, W_h, W_P, h, c, options);
}

// dh for step t: the carried gradient (d h_t W_h^T of step t + 1, times keep[t + 1]) plus d_out,
// zero where the projection clip bit; stored as d_h_raw[t] (matmul dtype) and kept in dh.
template <typename M>
void step_dh(const float* d_out, const M* dh_mm, const M* h_raw, float* dh, M* d_h_raw,
             const Dims& d, const LoopOptions& o, int64_t t) {
  const auto [G, T, B, C, P] = d;
  const float* keep = o.keep;
  const auto proj_clip = o.proj_clip;
  const bool carried = t + 1 < T;  // dh_mm holds step t + 1's product
  at::parallel_for(0, G * B, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r / B, b = r % B;
      const float kept = (carried && keep != nullptr) ? keep[(t + 1) * B + b] : 1.f;
      const float* grad = d_out + row_offset(g, t, b, T, B, P);
      const M* raw = h_raw + row_offset(g, t, b, T, B, P);
      M* stored = d_h_raw + row_offset(g, t, b, T, B, P);
      float* acc = dh + r * P;
      for (int64_t k = 0; k < P; ++k) {
        float v = (carried ? to_float(dh_mm[r * P + k]) * kept : acc[k]) + grad[k];
        if (proj_clip && std::fabs(to_float(raw[k])) > *proj_clip) v = 0.f;
        acc[k] = v;
        stored[k] = from_float<M>(v);
      }
    }
  });
}

// The gates' gradients of step t (d_gates, matmul dtype), dc for step t - 1 (times keep[t]), and
// the gates' gradients summed into d_bias_parts[thread][g] (float32, before their rounding).
template <typename M>
void step_backward(const M* dm_mm, const float* acts, const float* cells, const float* cell_raw,
                   const float* tanh_c, float* dc, M* d_gates, float* d_bias_parts,
                   const Dims& d, const LoopOptions& o, int64_t t) {
  const auto [G, T, B, C, P] = d;
  const float* keep = o.keep;
  const auto cell_clip = o.cell_clip;
  const int64_t four_c = 4 * C;
  at::parallel_for(0, G * B, kGrain, [&](int64_t begin, int64_t end) {
    float* parts = d_bias_parts + at::get_thread_num() * G * four_c;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r / B, b = r % B;
      const M* dm = dm_mm + r * C;
      const float* a = acts + row_offset(g, t, b, T, B, four_c);
      const float *i = a, *j = a + C, *f = a + 2 * C, *o = a + 3 * C;
      const float* c_prev = cells + row_offset(g, t, b, T + 1, B, C);
      const float* raw = cell_raw + row_offset(g, t, b, T, B, C);
      const float* tc = tanh_c + row_offset(g, t, b, T, B, C);
      float* dcr = dc + r * C;
      M* dg = d_gates + row_offset(g, t, b, T, B, four_c);
      float* sum = parts + g * four_c;
      const float kept = keep == nullptr ? 1.f : keep[t * B + b];
      const Vec one(1.f), half(0.5f), zero(0.f), kept_v(kept);
      const Vec limit(cell_clip.value_or(0.f));
      int64_t k = 0;
      for (; k + kLanes <= C; k += kLanes) {
        const Vec dmv = load(dm + k), ov = load(o + k), tcv = load(tc + k);
        Vec dcv = load(dcr + k) + dmv * ov * (one - tcv * tcv);
        if (cell_clip) dcv = Vec::blendv(dcv, zero, load(raw + k).abs() > limit);
        const Vec iv = load(i + k), jv = load(j + k), fv = load(f + k);
        const Vec grads[4] = {
            dcv * jv * (iv * (one - iv)),
            dcv * iv * ((one - jv * jv) * half),
            dcv * load(c_prev + k) * (fv * (one - fv)),
            dmv * tcv * (ov * (one - ov)),
        };
        for (int q = 0; q < 4; ++q) {
          store(dg + q * C + k, grads[q]);
          store(sum + q * C + k, load(sum + q * C + k) + grads[q]);
        }
        store(dcr + k, dcv * fv * kept_v);
      }
      for (; k < C; ++k) {
        const float dmk = to_float(dm[k]);
        float dcv = dcr[k] + dmk * o[k] * (1.f - tc[k] * tc[k]);
        if (cell_clip && std::fabs(raw[k]) > *cell_clip) dcv = 0.f;
        const float grads[4] = {
            dcv * j[k] * (i[k] * (1.f - i[k])),
            dcv * i[k] * ((1.f - j[k] * j[k]) * 0.5f),
            dcv * c_prev[k] * (f[k] * (1.f - f[k])),
            dmk * tc[k] * (o[k] * (1.f - o[k])),
        };
        for (int q = 0; q < 4; ++q) {
          dg[q * C + k] = from_float<M>(grads[q]);
          sum[q * C + k] += grads[q];
        }
        dcr[k] = dcv * f[k] * kept;
      }
    }
  });
}

template <typename M>
std::vector<Tensor> backward_impl(const Tensor& d_out, const Tensor& d_hT, const Tensor& d_cT,
                                  const Tensor& acts, const Tensor& cells,
                                  const Tensor& cell_raw, const Tensor& tanh_c,
                                  const Tensor& h_raw, const Tensor& W_h, const Tensor& W_P,
                                  const LoopOptions& options) {
  const Dims d(acts, W_P);
  const auto [G, T, B, C, P] = d;
  const int64_t four_c = 4 * C;
  const auto f32 = acts.options();
  const auto mm = W_h.options();
  Tensor d_gates = at::empty({G, T, B, four_c}, mm);
  Tensor d_bias_parts = at::zeros({at::get_num_threads(), G, four_c}, f32);
  Tensor d_h_raw = at::empty({G, T, B, P}, mm);
  Tensor dh = d_hT.to(at::kFloat).contiguous().clone();  // (G, B, P)
  Tensor dc = d_cT.to(at::kFloat).contiguous().clone();  // (G, B, C)
  Tensor dm_mm = at::empty({G, B, C}, mm);
  Tensor dh_mm = at::empty({G, B, P}, mm);
  const Tensor W_hT = W_h.transpose(1, 2), W_PT = W_P.transpose(1, 2);
  for (int64_t t = T - 1; t >= 0; --t) {
    step_dh<M>(d_out.data_ptr<float>(), dh_mm.data_ptr<M>(), h_raw.data_ptr<M>(),
               dh.data_ptr<float>(), d_h_raw.data_ptr<M>(), d, options, t);
    at::bmm_out(dm_mm, d_h_raw.select(1, t), W_PT);  // (G, B, C)
    step_backward<M>(dm_mm.data_ptr<M>(), acts.data_ptr<float>(), cells.data_ptr<float>(),
                     cell_raw.data_ptr<float>(), tanh_c.data_ptr<float>(), dc.data_ptr<float>(),
                     d_gates.data_ptr<M>(), d_bias_parts.data_ptr<float>(), d, options, t);
    at::bmm_out(dh_mm, d_gates.select(1, t), W_hT);  // (G, B, P)
  }
  // The gradient at h0: the last product, times keep[0].
  Tensor d_h0 = dh_mm.to(at::kFloat);
  if (options.keep) d_h0.mul_(options.keep_tensor[0]);
  return {d_gates, d_bias_parts.sum(0), d_h_raw, d_h0, dc};
}

std::vector<Tensor> paired_backward(const Tensor& d_out, const Tensor& d_hT, const Tensor& d_cT,
                                    const Tensor& acts, const Tensor& cells,
                                    const Tensor& cell_raw, const Tensor& tanh_c,
                                    const Tensor& h_raw, const Tensor& W_h, const Tensor& W_P,
                                    const std::optional<Tensor>& keep,
                                    std::optional<double> cell_clip,
                                    std::optional<double> proj_clip) {
  TORCH_CHECK(d_out.scalar_type() == at::kFloat, "d_out: float32");
  const Tensor d = d_out.contiguous();
  const LoopOptions options(keep, cell_clip, proj_clip);
  if (W_h.scalar_type() == at::kBFloat16)
    return backward_impl<BFloat16>(d, d_hT, d_cT, acts, cells, cell_raw, tanh_c, h_raw, W_h, W_P,
                                   options);
  return backward_impl<float>(d, d_hT, d_cT, acts, cells, cell_raw, tanh_c, h_raw, W_h, W_P,
                              options);
}

}  // namespace

TORCH_LIBRARY(elmolab, m) {
  m.def(
      "paired_lstm_forward(Tensor xw, Tensor bias, Tensor W_h, Tensor W_P, Tensor h0, Tensor c0, "
      "Tensor? keep, float? cell_clip, float? proj_clip) -> Tensor[]",
      &paired_forward);
  m.def(
      "paired_lstm_backward(Tensor d_out, Tensor d_hT, Tensor d_cT, Tensor acts, Tensor cells, "
      "Tensor cell_raw, Tensor tanh_c, Tensor h_raw, Tensor W_h, Tensor W_P, Tensor? keep, "
      "float? cell_clip, float? proj_clip) -> Tensor[]",
      &paired_backward);
}
