// CPU RoPE: one (batch, token) at a time, through the strides of x and y (so a view of a fused
// projection is rotated in place). Each pair (i, i + D/2) is read whole before it is written, so y
// may be x.
#include <cmath>

#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"

namespace quintet::nn::cpu_ops {

namespace {
// positions[b, s] (or [s]) as int64, for either index dtype.
std::int64_t position_at(const Tensor& positions, std::int64_t b, std::int64_t s) {
  const std::int64_t i = positions.dim() == 2 ? b * positions.stride(0) + s * positions.stride(1)
                                              : s * positions.stride(0);
  return positions.dtype() == DType::i32 ? std::int64_t{positions.data<std::int32_t>()[i]}
                                         : positions.data<std::int64_t>()[i];
}
}  // namespace

void rope(const Tensor& x, const Tensor& y, const Tensor& positions,
          const std::vector<double>& inv_freq, std::int64_t position_offset, bool inverse) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);  // also the type of the angles: f32 for f32, f64 for f64
    const std::int64_t nb = x.size(0), ns = x.size(1), nh = x.size(2);
    const std::int64_t half = x.size(3) / 2;
    std::vector<T> freq(inv_freq.begin(), inv_freq.end()), cos_a(half), sin_a(half);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    const T sign = inverse ? T(-1) : T(1);
    for (std::int64_t b = 0; b < nb; ++b) {
      for (std::int64_t s = 0; s < ns; ++s) {
        const std::int64_t p =
            position_offset + (positions.defined() ? position_at(positions, b, s) : s);
        for (std::int64_t i = 0; i < half; ++i) {
          const T a = static_cast<T>(p) * freq[i];
          cos_a[i] = std::cos(a);
          sin_a[i] = sign * std::sin(a);
        }
        for (std::int64_t h = 0; h < nh; ++h) {
          const T* xr = xp + b * x.stride(0) + s * x.stride(1) + h * x.stride(2);
          T* yr = yp + b * y.stride(0) + s * y.stride(1) + h * y.stride(2);
          const std::int64_t xd = x.stride(3), yd = y.stride(3);
          for (std::int64_t i = 0; i < half; ++i) {
            const T lo = xr[i * xd], hi = xr[(i + half) * xd];
            yr[i * yd] = lo * cos_a[i] - hi * sin_a[i];
            yr[(i + half) * yd] = hi * cos_a[i] + lo * sin_a[i];
          }
        }
      }
    }
  });
}

}  // namespace quintet::nn::cpu_ops
