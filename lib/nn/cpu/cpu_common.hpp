// Private: helpers of the CPU ops: dtype dispatch over f32/f64 and Eigen maps of row-major data.
#pragma once

#include <Eigen/Core>

#include "quintet/core/tensor.hpp"

namespace quintet::nn::cpu_ops {

// Calls f(T{}) with T = float or double, the compute type of a CPU op (checked by the dispatch).
template <class F>
decltype(auto) dispatch_real(DType dtype, F&& f) {
  if (dtype == DType::f64) return f(double{});
  return f(float{});
}

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatMap = Eigen::Map<RowMatrix<T>>;
template <class T>
using ConstMatMap = Eigen::Map<const RowMatrix<T>>;
template <class T>
using VecMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>;

// A contiguous 2-D tensor as a row-major Eigen matrix.
template <class T>
MatMap<T> mat(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  return MatMap<T>(t.data<T>(), rows, cols);
}
template <class T>
ConstMatMap<T> cmat(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  return ConstMatMap<T>(t.data<T>(), rows, cols);
}

}  // namespace quintet::nn::cpu_ops
