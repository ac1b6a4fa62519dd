// CPU implementations of the router's logits ops (quintet/nn/router_ops.hpp): plain loops with
// f32 products and f32 sums in index order (k for the logits, e for dx, t for dw). They are the
// reference of the GPU kernels' tests.
#include "nn/cpu/cpu_common.hpp"
#include "nn/router_ops_impl.hpp"

namespace quintet::nn::cpu_ops {

void router_logits_forward(const Tensor& x, const Tensor& w, const Tensor& logits) {
  const std::int64_t T = x.size(0), d = x.size(1), E = w.size(0);
  const float* wp = w.data<float>();
  float* out = logits.data<float>();
  dispatch_real(x.dtype(), [&](auto tag) {
    using X = decltype(tag);
    for (std::int64_t t = 0; t < T; ++t) {
      const X* xr = x.data<X>() + t * d;
      for (std::int64_t e = 0; e < E; ++e) {
        const float* wr = wp + e * d;
        float acc = 0.0f;
        for (std::int64_t k = 0; k < d; ++k) acc += static_cast<float>(xr[k]) * wr[k];
        out[t * E + e] = acc;
      }
    }
  });
}

void router_logits_backward_input(const Tensor& dlogits, const Tensor& w, const Tensor& dx) {
  const std::int64_t T = dlogits.size(0), E = dlogits.size(1), d = w.size(1);
  const float* wp = w.data<float>();
  const float* dl = dlogits.data<float>();
  dispatch_real(dx.dtype(), [&](auto tag) {
    using X = decltype(tag);
    for (std::int64_t t = 0; t < T; ++t) {
      X* out = dx.data<X>() + t * d;
      for (std::int64_t k = 0; k < d; ++k) {
        float acc = 0.0f;
        for (std::int64_t e = 0; e < E; ++e) acc += dl[t * E + e] * wp[e * d + k];
        out[k] = static_cast<X>(acc);
      }
    }
  });
}

void router_logits_backward_weight(const Tensor& dlogits, const Tensor& x, const Tensor& dw) {
  const std::int64_t T = x.size(0), d = x.size(1), E = dlogits.size(1);
  const float* dl = dlogits.data<float>();
  float* g = dw.data<float>();
  dispatch_real(x.dtype(), [&](auto tag) {
    using X = decltype(tag);
    const X* xp = x.data<X>();
    for (std::int64_t e = 0; e < E; ++e) {
      for (std::int64_t k = 0; k < d; ++k) {
        float acc = 0.0f;
        for (std::int64_t t = 0; t < T; ++t)
          acc += dl[t * E + e] * static_cast<float>(xp[t * d + k]);
        g[e * d + k] += acc;
      }
    }
  });
}

}  // namespace quintet::nn::cpu_ops
