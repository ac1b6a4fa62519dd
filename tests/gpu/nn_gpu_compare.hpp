// Helpers of the nn GPU tests: inputs drawn on the CPU, moved to the GPU in the compute dtype, and
// the CPU reference fed the very same (rounded) values; relative error norms between a GPU result
// and the CPU op's result.
#pragma once

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

// CHECK_CLOSE(gpu_tensor, cpu_tensor, stream, dtype): relative error norm under the dtype's bar.
#define CHECK_CLOSE(gpu, cpu, stream, dtype)                               \
  do {                                                                     \
    const double nn_err_ = ::nn_gpu_test::rel_err((gpu), (cpu), (stream)); \
    INFO(#gpu " vs " #cpu ": relative error " << nn_err_);                 \
    CHECK(nn_err_ < ::nn_gpu_test::tolerance(dtype));                      \
  } while (0)
