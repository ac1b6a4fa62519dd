// CPU linear: Eigen GEMMs on row-major maps (y = x·wᵀ + b and its two backward products).
#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"

namespace quintet::nn::cpu_ops {

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    auto ym = mat<T>(y, m, out);
    ym.noalias() = cmat<T>(x, m, in) * cmat<T>(w, out, in).transpose();
    if (b.defined()) ym.rowwise() += cmat<T>(b, 1, out).row(0);
  });
}

void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx) {
  dispatch_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t m = dy.size(0), out = w.size(0), in = w.size(1);
    mat<T>(dx, m, in).noalias() = cmat<T>(dy, m, out) * cmat<T>(w, out, in);
  });
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db) {
  dispatch_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t m = dy.size(0), out = dy.size(1), in = x.size(1);
    const auto dym = cmat<T>(dy, m, out);
    mat<T>(dw, out, in).noalias() += dym.transpose() * cmat<T>(x, m, in);
    if (db.defined()) mat<T>(db, 1, out) += dym.colwise().sum();
  });
}

}  // namespace quintet::nn::cpu_ops
