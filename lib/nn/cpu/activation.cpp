// CPU element-wise activations (GELU tanh form, SwiGLU) and the row softmax.
#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"

namespace quintet::nn::cpu_ops {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
}  // namespace

void gelu_forward(const Tensor& x, const Tensor& y) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = xp[i];
      const T u = T(kSqrt2OverPi) * (v + T(kGeluCubic) * v * v * v);
      yp[i] = T(0.5) * v * (T(1) + std::tanh(u));
    }
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = xp[i];
      const T u = T(kSqrt2OverPi) * (v + T(kGeluCubic) * v * v * v);
      const T t = std::tanh(u);
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * v * v);
      dxp[i] = dyp[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
    }
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y) {
  dispatch_real(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    T* yp = y.data<T>();
    for (std::int64_t i = 0; i < gate.numel(); ++i) {
      const T s = T(1) / (T(1) + std::exp(-g[i]));
      yp[i] = g[i] * s * u[i];
    }
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  dispatch_real(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    const T* d = dy.data<T>();
    T* dg = dgate.data<T>();
    T* du = dup.data<T>();
    for (std::int64_t i = 0; i < gate.numel(); ++i) {
      const T s = T(1) / (T(1) + std::exp(-g[i]));
      du[i] = d[i] * g[i] * s;
      dg[i] = d[i] * u[i] * s * (T(1) + g[i] * (T(1) - s));
    }
  });
}

void softmax_forward(const Tensor& x, const Tensor& y) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t rows = x.size(0), n = x.size(1);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * n;
      T* yr = y.data<T>() + r * n;
      T mx = -std::numeric_limits<T>::infinity();
      for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, xr[i]);
      double sum = 0.0;
      for (std::int64_t i = 0; i < n; ++i) {
        yr[i] = std::exp(xr[i] - mx);
        sum += yr[i];
      }
      const T inv = T(1.0 / sum);
      for (std::int64_t i = 0; i < n; ++i) yr[i] *= inv;
    }
  });
}

void softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx) {
  dispatch_real(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t rows = y.size(0), n = y.size(1);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* yr = y.data<T>() + r * n;
      const T* dyr = dy.data<T>() + r * n;
      T* dxr = dx.data<T>() + r * n;
      double dot = 0.0;
      for (std::int64_t i = 0; i < n; ++i) dot += double(dyr[i]) * yr[i];
      for (std::int64_t i = 0; i < n; ++i) dxr[i] = T(yr[i] * (dyr[i] - dot));
    }
  });
}

}  // namespace quintet::nn::cpu_ops
