// Dropout with a counter-based random mask: element i of a call with seed s is kept when the
// 32-bit hash of (s, i) is at least p * 2^32, and scaled by 1 / (1 - p). The mask is a function
// of (seed, index) only, so backward recomputes it instead of storing it, and any thread can
// compute any element: one pass over the data, in parallel (torch's bernoulli_ draws from one
// Mersenne Twister stream, element by element). The hash is SplitMix64's finaliser, whose 64
// output bits give two elements' 32-bit draws.
//
// apply(x (any shape) float32 or bfloat16, p, seed) -> x * mask / (1 - p), x's dtype and shape.
// Built with the other kernels by elmolab.native.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

namespace {

using at::Tensor;

inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

template <typename T>
void apply_mask(const T* x, T* out, int64_t n, double p, uint64_t seed) {
  // keep when the draw >= threshold: probability 1 - threshold / 2^32
  const uint64_t threshold = static_cast<uint64_t>(std::llround(p * 4294967296.0));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const uint64_t base = mix(seed);
  at::parallel_for(0, (n + 1) / 2, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const uint64_t bits = mix(base + static_cast<uint64_t>(pair) * 0x9E3779B97F4A7C15ULL);
      const int64_t i = 2 * pair;
      out[i] = static_cast<T>((bits & 0xFFFFFFFFULL) >= threshold
                                  ? static_cast<float>(x[i]) * scale : 0.f);
      if (i + 1 < n) {
        out[i + 1] = static_cast<T>((bits >> 32) >= threshold
                                        ? static_cast<float>(x[i + 1]) * scale : 0.f);
      }
    }
  });
}

Tensor dropout_apply(const Tensor& x_in, double p, int64_t seed) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout probability in [0, 1)");
  const Tensor x = x_in.contiguous();
  Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  const uint64_t s = static_cast<uint64_t>(seed);
  if (x.scalar_type() == at::kBFloat16) {
    apply_mask(x.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), n, p, s);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "dropout kernel: float32 or bfloat16");
    apply_mask(x.data_ptr<float>(), out.data_ptr<float>(), n, p, s);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(elmolab, m) {
  m.def("dropout_apply(Tensor x, float p, int seed) -> Tensor", &dropout_apply);
}
