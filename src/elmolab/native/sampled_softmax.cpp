// The elementwise part of the sampled softmax's log-normaliser (elmolab.training.softmax,
// _SampledLogNormaliser) in one pass per row, forward and backward: the same arithmetic as its
// tensor ops, without their intermediate (rows, candidates) buffers and dtype copies.
//
// forward: logits (N, S) float32 or bfloat16, the candidates' logits with their correction;
//   target (N,) float32, each row's target logit; hit (N,) int64, the column of the row's target
//   among the candidates or -1. Returns exp_logits (N, S) float32 = exp(s - m) (0 at the hit),
//   row_max m (N,) = max(max_c s, target) and sum (N,) = sum_c exp_logits.
// backward: exp_logits (N, S), scale (N,) float32. Returns grad (N, S) in `dtype`, the rounding
//   of exp_logits * scale, and its column sums (S,) float32 before rounding.
// Built with lstm_paired.cpp by elmolab.native.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include "vec_io.h"

#include <cmath>
#include <limits>
#include <vector>

namespace {

using at::BFloat16;
using at::Tensor;
using namespace elmolab_vec;


constexpr int64_t kRowGrain = 16;

// max that propagates NaN, as torch.amax and torch.maximum do.
inline float nan_max(float a, float b) { return (std::isnan(a) || a > b) ? a : b; }

template <typename T>
std::vector<Tensor> forward_impl(const Tensor& logits, const Tensor& target, const Tensor& hit) {
  const int64_t N = logits.size(0), S = logits.size(1);
  const auto f32 = target.options();
  Tensor exp_logits = at::empty({N, S}, f32);
  Tensor row_max = at::empty({N}, f32);
  Tensor sums = at::empty({N}, f32);
  const T* in = logits.data_ptr<T>();
  const float* tg = target.data_ptr<float>();
  const int64_t* hits = hit.data_ptr<int64_t>();
  float* out = exp_logits.data_ptr<float>();
  float* mx = row_max.data_ptr<float>();
  float* sm = sums.data_ptr<float>();
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* s = in + r * S;
      float* e = out + r * S;
      Vec vmax(-std::numeric_limits<float>::infinity());
      int64_t k = 0;
      for (; k + kLanes <= S; k += kLanes) vmax = at::vec::maximum(vmax, load(s + k));
      float m = tg[r];
      alignas(64) float lanes[kLanes];
      vmax.store(lanes);
      for (int64_t q = 0; q < kLanes; ++q) m = nan_max(m, lanes[q]);
      for (; k < S; ++k) m = nan_max(m, to_float(s[k]));
      const Vec mv(m);
      Vec vsum(0.f);
      k = 0;
      for (; k + kLanes <= S; k += kLanes) {
        const Vec x = (load(s + k) - mv).exp();
        x.store(e + k);
      }
      for (; k < S; ++k) e[k] = std::exp(to_float(s[k]) - m);
      if (hits[r] >= 0) e[hits[r]] = 0.f;
      float total = 0.f;
      k = 0;
      for (; k + kLanes <= S; k += kLanes) vsum = vsum + load(e + k);
      vsum.store(lanes);
      for (int64_t q = 0; q < kLanes; ++q) total += lanes[q];
      for (; k < S; ++k) total += e[k];
      mx[r] = m;
      sm[r] = total;
    }
  });
  return {exp_logits, row_max, sums};
}

std::vector<Tensor> lognorm_forward(const Tensor& logits, const Tensor& target,
                                    const Tensor& hit) {
  TORCH_CHECK(logits.dim() == 2 && target.dim() == 1 && hit.dim() == 1, "shapes");
  TORCH_CHECK(target.scalar_type() == at::kFloat, "target: float32");
  TORCH_CHECK(hit.scalar_type() == at::kLong, "hit: int64");
  const Tensor l = logits.contiguous(), t = target.contiguous(), h = hit.contiguous();
  if (l.scalar_type() == at::kBFloat16) return forward_impl<BFloat16>(l, t, h);
  TORCH_CHECK(l.scalar_type() == at::kFloat, "logits: float32 or bfloat16");
  return forward_impl<float>(l, t, h);
}

template <typename T>
std::vector<Tensor> backward_impl(const Tensor& exp_logits, const Tensor& scale,
                                  at::ScalarType dtype) {
  const int64_t N = exp_logits.size(0), S = exp_logits.size(1);
  Tensor grad = at::empty({N, S}, exp_logits.options().dtype(dtype));
  Tensor parts = at::zeros({at::get_num_threads(), S}, exp_logits.options());
  const float* e = exp_logits.data_ptr<float>();
  const float* sc = scale.data_ptr<float>();
  T* g = grad.data_ptr<T>();
  float* p = parts.data_ptr<float>();
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    float* col = p + at::get_thread_num() * S;
    for (int64_t r = begin; r < end; ++r) {
      const float* er = e + r * S;
      T* gr = g + r * S;
      const Vec s(sc[r]);
      int64_t k = 0;
      for (; k + kLanes <= S; k += kLanes) {
        const Vec x = load(er + k) * s;
        store(gr + k, x);
        store(col + k, load(col + k) + x);
      }
      for (; k < S; ++k) {
        const float x = er[k] * sc[r];
        gr[k] = static_cast<T>(x);
        col[k] += x;
      }
    }
  });
  return {grad, parts.sum(0)};
}

std::vector<Tensor> lognorm_backward(const Tensor& exp_logits, const Tensor& scale,
                                     at::ScalarType dtype) {
  TORCH_CHECK(exp_logits.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat,
              "exp_logits and scale: float32");
  const Tensor e = exp_logits.contiguous(), s = scale.contiguous();
  if (dtype == at::kBFloat16) return backward_impl<BFloat16>(e, s, dtype);
  TORCH_CHECK(dtype == at::kFloat, "dtype: float32 or bfloat16");
  return backward_impl<float>(e, s, dtype);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(elmolab, m) {
  m.def("sampled_lognorm_forward(Tensor logits, Tensor target, Tensor hit) -> Tensor[]",
        &lognorm_forward);
  m.def("sampled_lognorm_backward(Tensor exp_logits, Tensor scale, ScalarType dtype) -> Tensor[]",
        &lognorm_backward);
}
