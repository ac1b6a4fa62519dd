// Helpers of the nn tests: random f64 tensors, loss = <f(x), r>, central finite differences.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "quintet/core/tensor.hpp"
#include "support/catch.hpp"

namespace nn_test {

using quintet::DType;
using quintet::Shape;
using quintet::Tensor;

inline Tensor randn64(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::randn(shape, seed, DType::f64);
  double* p = t.data<double>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= scale;
  return t;
}

// sum(a * b) over all elements (any float dtypes, same numel).
inline double dot(const Tensor& a, const Tensor& b) {
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  REQUIRE(av.size() == bv.size());
  double s = 0.0;
  for (std::size_t i = 0; i < av.size(); ++i) s += av[i] * bv[i];
  return s;
}

// d loss / d x by central differences, perturbing x (an f64 CPU tensor) in place.
inline Tensor numeric_grad(const std::function<double()>& loss, const Tensor& x, double h = 1e-5) {
  Tensor g = Tensor::zeros(x.shape(), DType::f64);
  double* xp = x.data<double>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double keep = xp[i];
    xp[i] = keep + h;
    const double up = loss();
    xp[i] = keep - h;
    const double down = loss();
    xp[i] = keep;
    g.data<double>()[i] = (up - down) / (2 * h);
  }
  return g;
}

// Every element: |a - b| <= tol * (1 + |b|).
inline void require_close(const Tensor& actual, const Tensor& expected, double tol,
                          const char* what) {
  INFO(what);
  REQUIRE(actual.numel() == expected.numel());
  const auto a = actual.to_vector<double>(), e = expected.to_vector<double>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i << ": " << a[i] << " vs " << e[i]);
    REQUIRE(std::abs(a[i] - e[i]) <= tol * (1.0 + std::abs(e[i])));
  }
}

// Log-sum-exp rows: -inf where expected is -inf (a row that sees no key), else equal within tol.
inline void require_lse_close(const Tensor& actual, const Tensor& expected, double tol) {
  const auto a = actual.to_vector<double>(), e = expected.to_vector<double>();
  REQUIRE(a.size() == e.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("lse row " << i);
    if (std::isinf(e[i])) {
      REQUIRE((std::isinf(a[i]) && a[i] < 0));
    } else {
      REQUIRE(a[i] == Approx(e[i]).epsilon(tol));
    }
  }
}

// ||a - b|| / ||b||.
inline double rel_error(const Tensor& actual, const Tensor& expected) {
  const auto a = actual.to_vector<double>(), e = expected.to_vector<double>();
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - e[i]) * (a[i] - e[i]);
    den += e[i] * e[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace nn_test
