// Helpers of the nn GPU tests: inputs drawn on the CPU, moved to the GPU in the compute dtype, and
// the CPU reference fed the very same (rounded) values; relative error norms between a GPU result
// and the CPU op's result, and the worst element's error against the reference's largest magnitude.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "support/catch.hpp"

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"

namespace nn_gpu_test {

using namespace quintet;

// The bar: relative error norm under 1e-2 in bf16, under 1e-5 in f32.
inline double tolerance(DType t) { return t == DType::bf16 ? 1e-2 : 1e-5; }

// The norm hides a few wrong elements, so the worst element is bounded too: max |got - want| over
// max |want|. bf16 keeps 8 significant bits, so one ULP at the largest magnitude is at most 2^-7 of
// it, and the final rounding alone costs half of that. Rounding of bf16 intermediates summed in f32
// over a reduction of n terms grows like sqrt(n) ULPs of a typical term, not of the largest, and is
// already held by the norm bar: errors spread over the tensor with norm under 1e-2 of the
// reference's have their worst element (about 4 standard deviations out) near 4e-2 of the
// reference's root-mean-square, and a random tensor's largest magnitude is about 3 times that,
// about 1.3e-2 of it. The bound is 4 ULPs (2^-5 = 3.1e-2), over twice that; one wrong element,
// whose error is of the order of a typical element (a third of the largest or more), exceeds it.
// f32: the same reasoning on the 1e-5 bar, with 10 times the margin for reduction order.
inline double worst_tolerance(DType t) { return t == DType::bf16 ? 0x1p-5 : 1e-4; }

// One random input: `gpu` in the compute dtype on the GPU (queued on stream), `cpu` the same values
// (rounded to the compute dtype) as f32 on the CPU, for the reference.
struct Input {
  Tensor gpu;
  Tensor cpu;
};
inline Input random_input(const Shape& shape, std::uint64_t seed, DType t, const Stream& stream,
                          double scale = 1.0, double shift = 0.0) {
  Tensor base = Tensor::randn(shape, seed);
  if (scale != 1.0 || shift != 0.0) {
    std::vector<float> v = base.to_vector<float>();
    for (float& x : v) x = static_cast<float>(x * scale + shift);
    base = Tensor::from_vector<float>(v, shape);
  }
  Input in;
  in.cpu = base.to(t).to(DType::f32);
  in.gpu = in.cpu.to(stream.device(), stream).to(t, stream);
  return in;
}

// A CPU f32 tensor copied to the GPU as dtype t on stream.
inline Tensor to_gpu(const Tensor& cpu, DType t, const Stream& stream) {
  return cpu.to(stream.device(), stream).to(t, stream);
}

// Values of a tensor on any device as doubles, after the stream's work is done.
inline std::vector<double> values(const Tensor& t, const Stream& stream) {
  stream.synchronize();
  return t.to_vector<double>();
}

// ||got - want|| / ||want|| over all elements (both finite), or the absolute norm when want is 0.
inline double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double rel_err(const Tensor& gpu, const Tensor& cpu, const Stream& stream) {
  return rel_err(values(gpu, stream), cpu.to_vector<double>());
}

// max |got - want| / max |want| (both finite), or the absolute maximum when want is 0.
inline double worst_err(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return den > 0.0 ? num / den : num;
}

// Both bars on value vectors: the relative error norm and the worst element.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want, DType t) {
  const double norm = rel_err(got, want), worst = worst_err(got, want);
  INFO("relative error norm " << norm << " (bar " << tolerance(t) << "), worst element " << worst
                              << " of the largest magnitude (bar " << worst_tolerance(t) << ")");
  CHECK(norm < tolerance(t));
  CHECK(worst < worst_tolerance(t));
}

// Like rel_err for log-sum-exp vectors, where a row that sees no key is -inf on both sides.
inline double lse_err(const Tensor& gpu, const Tensor& cpu, const Stream& stream) {
  const std::vector<double> g = values(gpu, stream), c = cpu.to_vector<double>();
  REQUIRE(g.size() == c.size());
  std::vector<double> gf, cf;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isinf(c[i]) && c[i] < 0) {
      CHECK((std::isinf(g[i]) && g[i] < 0));
    } else {
      gf.push_back(g[i]);
      cf.push_back(c[i]);
    }
  }
  return gf.empty() ? 0.0 : rel_err(gf, cf);
}

}  // namespace nn_gpu_test

// CHECK_CLOSE(gpu_tensor, cpu_tensor, stream, dtype): relative error norm and worst element under
// the dtype's bars.
#define CHECK_CLOSE(gpu, cpu, stream, dtype)                                                      \
  do {                                                                                            \
    INFO(#gpu " vs " #cpu);                                                                       \
    ::nn_gpu_test::check_close(::nn_gpu_test::values((gpu), (stream)), (cpu).to_vector<double>(), \
                               (dtype));                                                          \
  } while (0)
