// CPU layernorm and rmsnorm over the last dimension, one row at a time, statistics in double.
#include <cmath>

#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"

namespace quintet::nn::cpu_ops {

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t rows = x.size(0), d = x.size(1);
    const T* g = gamma.data<T>();
    const T* be = beta.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * d;
      T* yr = y.data<T>() + r * d;
      double sum = 0.0;
      for (std::int64_t i = 0; i < d; ++i) sum += xr[i];
      const double mu = sum / double(d);
      double var = 0.0;
      for (std::int64_t i = 0; i < d; ++i) var += (xr[i] - mu) * (xr[i] - mu);
      const double rs = 1.0 / std::sqrt(var / double(d) + double(eps));
      for (std::int64_t i = 0; i < d; ++i) yr[i] = T((xr[i] - mu) * rs * g[i] + be[i]);
      mean.data<T>()[r] = T(mu);
      rstd.data<T>()[r] = T(rs);
    }
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t rows = x.size(0), d = x.size(1);
    const T* g = gamma.data<T>();
    T* dg = dgamma.defined() ? dgamma.data<T>() : nullptr;
    T* db = dbeta.defined() ? dbeta.data<T>() : nullptr;
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * d;
      const T* dyr = dy.data<T>() + r * d;
      T* dxr = dx.data<T>() + r * d;
      const double mu = mean.data<T>()[r], rs = rstd.data<T>()[r];
      // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma.
      double s1 = 0.0, s2 = 0.0;
      for (std::int64_t i = 0; i < d; ++i) {
        const double xhat = (xr[i] - mu) * rs, dxhat = double(dyr[i]) * g[i];
        s1 += dxhat;
        s2 += dxhat * xhat;
        if (dg) dg[i] += T(dyr[i] * xhat);
        if (db) db[i] += dyr[i];
      }
      s1 /= double(d);
      s2 /= double(d);
      for (std::int64_t i = 0; i < d; ++i) {
        const double xhat = (xr[i] - mu) * rs, dxhat = double(dyr[i]) * g[i];
        dxr[i] = T(rs * (dxhat - s1 - xhat * s2));
      }
    }
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                     const Tensor& rstd) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t rows = x.size(0), d = x.size(1);
    const T* g = gamma.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * d;
      T* yr = y.data<T>() + r * d;
      double ss = 0.0;
      for (std::int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
      const double rs = 1.0 / std::sqrt(ss / double(d) + double(eps));
      for (std::int64_t i = 0; i < d; ++i) yr[i] = T(xr[i] * rs * g[i]);
      rstd.data<T>()[r] = T(rs);
    }
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dgamma) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t rows = x.size(0), d = x.size(1);
    const T* g = gamma.data<T>();
    T* dg = dgamma.defined() ? dgamma.data<T>() : nullptr;
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * d;
      const T* dyr = dy.data<T>() + r * d;
      T* dxr = dx.data<T>() + r * d;
      const double rs = rstd.data<T>()[r];
      // dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), xhat = x * rstd, dxhat = dy * gamma.
      double s = 0.0;
      for (std::int64_t i = 0; i < d; ++i) {
        const double xhat = xr[i] * rs;
        s += double(dyr[i]) * g[i] * xhat;
        if (dg) dg[i] += T(dyr[i] * xhat);
      }
      s /= double(d);
      for (std::int64_t i = 0; i < d; ++i) {
        dxr[i] = T(rs * (double(dyr[i]) * g[i] - xr[i] * rs * s));
      }
    }
  });
}

}  // namespace quintet::nn::cpu_ops
