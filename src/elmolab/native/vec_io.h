// Loads and stores between memory (float32 or bfloat16) and ATen's float32 vectors, shared by
// elmolab's kernels: values are computed in float32 whatever the storage dtype.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace elmolab_vec {

using at::BFloat16;
using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

inline Vec load(const float* p) { return Vec::loadu(p); }
inline Vec load(const BFloat16* p) {
  Vec out;
  at::vec::load_to_float(p, out);
  return out;
}
inline void store(float* p, const Vec& v) { v.store(p); }
inline void store(BFloat16* p, const Vec& v) {
  at::vec::convert_float_bfloat16(v, v).store(p, kLanes);  // round to nearest even
}
inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) { return static_cast<float>(x); }
template <typename T>
inline T from_float(float x) {
  return static_cast<T>(x);
}

}  // namespace elmolab_vec
