// The character CNN's convolutions and max over positions (elmolab.models.char_cnn), computed
// from per-offset tables instead of a matmul per window.
//
// A filter of width w over character embeddings e_p is sum_{k < w} e_{p+k} K[k]; with the
// tables T[k] = E K[k] (chars x filters, one per offset k, K zero-padded to the widest filter)
// the window at p is sum_k T[k][c_{p+k}]: one row lookup and add per offset instead of
// char_dim multiply-adds. The max over positions keeps its position (argmax), so backward adds
// each filter's gradient to the table rows of that window only; the tables' own gradients
// (d E and d K) follow from T = E K by autograd.
//
// Positions: a token's characters fill slots 0 .. n - 1 of its L slots and `pad_id` the rest
// (id 0 everywhere for a padding token). A window of width w exists at p <= L - w. Windows at
// p >= n cover padding only and all have the value of the one at p = n, so p runs over
// 0 .. min(n, L - w): the same maximum as all windows. Ties keep the first position; tied
// windows in a token are the same characters (or have probability zero), so they give the same
// table gradient. Id 0 (the zero embedding) gets no gradient, as F.embedding's padding_idx.
//
// forward(table (W, V, F) float32, ids (N, L) int64, widths (F,) int64, pad_id)
//   -> maxima (N, F) float32, argmax (N, F) int32
// backward(d_maxima (N, F) float32, argmax, ids, widths, W, V) -> d_table (W, V, F)
// Built with the other kernels by elmolab.native.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace {

using at::Tensor;
using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

// Slots 0 .. n - 1 hold the token's characters: n is the last slot that is neither pad nor 0, + 1.
inline int64_t token_length(const int64_t* ids, int64_t L, int64_t pad_id) {
  for (int64_t q = L; q > 0; --q) {
    if (ids[q - 1] != pad_id && ids[q - 1] != 0) return q;
  }
  return 0;
}

std::vector<Tensor> conv_max_forward(const Tensor& table_in, const Tensor& ids_in,
                                     const Tensor& widths_in, int64_t pad_id) {
  TORCH_CHECK(table_in.scalar_type() == at::kFloat && table_in.dim() == 3, "table: (W, V, F)");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong && ids_in.dim() == 2, "ids: (N, L) int64");
  const Tensor table = table_in.contiguous(), ids = ids_in.contiguous();
  const Tensor widths = widths_in.to(at::kLong).contiguous();
  const int64_t W = table.size(0), V = table.size(1), F = table.size(2);
  const int64_t N = ids.size(0), L = ids.size(1);
  TORCH_CHECK(widths.numel() == F, "one width per filter");
  TORCH_CHECK(ids.numel() == 0 || (ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < V),
              "character ids outside the embedding");
  Tensor maxima = at::empty({N, F}, table.options());
  Tensor argmax = at::empty({N, F}, table.options().dtype(at::kInt));
  const float* T = table.data_ptr<float>();
  const int64_t* I = ids.data_ptr<int64_t>();
  const int64_t* wd = widths.data_ptr<int64_t>();
  float* out = maxima.data_ptr<float>();
  int32_t* arg = argmax.data_ptr<int32_t>();
  const int64_t w_min = *std::min_element(wd, wd + F), w_max = *std::max_element(wd, wd + F);
  TORCH_CHECK(w_max <= W && w_min >= 1 && w_max <= L, "filter widths between 1 and the table's");
  at::parallel_for(0, N, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(F), best(F), pos(F);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t* c = I + r * L;
      const int64_t last = std::min(token_length(c, L, pad_id), L - w_min);  // last position
      std::fill(best.begin(), best.end(), -std::numeric_limits<float>::infinity());
      std::fill(pos.begin(), pos.end(), 0.f);
      for (int64_t p = 0; p <= last; ++p) {
        // acc = sum_k T[k][c_{p+k}] (slots past L read pad_id: only filters too wide for p
        // would use them, and those are skipped below)
        const float* row0 = T + c[p] * F;
        std::copy(row0, row0 + F, acc.begin());
        for (int64_t k = 1; k < W; ++k) {
          const int64_t id = p + k < L ? c[p + k] : pad_id;
          const float* row = T + (k * V + id) * F;
          int64_t f = 0;
          for (; f + kLanes <= F; f += kLanes) {
            (Vec::loadu(acc.data() + f) + Vec::loadu(row + f)).store(acc.data() + f);
          }
          for (; f < F; ++f) acc[f] += row[f];
        }
        // best = max(best, acc) keeping the first position; NaN wins and stays, as in amax.
        if (p + w_max <= L) {
          const Vec here(static_cast<float>(p));
          int64_t f = 0;
          for (; f + kLanes <= F; f += kLanes) {
            const Vec a = Vec::loadu(acc.data() + f), b = Vec::loadu(best.data() + f);
            const Vec take = (a > b) | (a != a);
            Vec::blendv(b, a, take).store(best.data() + f);
            Vec::blendv(Vec::loadu(pos.data() + f), here, take).store(pos.data() + f);
          }
          for (; f < F; ++f) {
            if (acc[f] > best[f] || acc[f] != acc[f]) best[f] = acc[f], pos[f] = p;
          }
        } else {
          for (int64_t f = 0; f < F; ++f) {
            if (p + wd[f] <= L && (acc[f] > best[f] || acc[f] != acc[f])) {
              best[f] = acc[f], pos[f] = p;
            }
          }
        }
      }
      std::copy(best.begin(), best.end(), out + r * F);
      for (int64_t f = 0; f < F; ++f) arg[r * F + f] = static_cast<int32_t>(pos[f]);
    }
  });
  return {maxima, argmax};
}

Tensor conv_max_backward(const Tensor& d_in, const Tensor& argmax_in, const Tensor& ids_in,
                         const Tensor& widths_in, int64_t W, int64_t V) {
  const Tensor d = d_in.to(at::kFloat).contiguous(), argmax = argmax_in.contiguous();
  const Tensor ids = ids_in.contiguous(), widths = widths_in.to(at::kLong).contiguous();
  const int64_t N = ids.size(0), L = ids.size(1), F = d.size(1);
  Tensor d_table = at::zeros({W, V, F}, d.options());
  const float* D = d.data_ptr<float>();
  const int32_t* A = argmax.data_ptr<int32_t>();
  const int64_t* I = ids.data_ptr<int64_t>();
  const int64_t* wd = widths.data_ptr<int64_t>();
  float* G = d_table.data_ptr<float>();
  // Each task owns a range of filters (columns of every table): no two write the same entry, and
  // every entry sums its tokens in token order.
  at::parallel_for(0, F, 64, [&](int64_t f0, int64_t f1) {
    for (int64_t r = 0; r < N; ++r) {
      const int64_t* c = I + r * L;
      for (int64_t f = f0; f < f1; ++f) {
        const float g = D[r * F + f];
        if (g == 0.f) continue;
        const int64_t p = A[r * F + f];
        for (int64_t k = 0; k < wd[f]; ++k) {
          const int64_t id = c[p + k];
          if (id != 0) G[(k * V + id) * F + f] += g;
        }
      }
    }
  });
  return d_table;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(elmolab, m) {
  m.def("char_conv_max_forward(Tensor table, Tensor ids, Tensor widths, int pad_id) -> Tensor[]",
        &conv_max_forward);
  m.def(
      "char_conv_max_backward(Tensor d_maxima, Tensor argmax, Tensor ids, Tensor widths, int W, "
      "int V) -> Tensor",
      &conv_max_backward);
}
