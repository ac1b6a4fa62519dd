// Checking the MoE layer (quintet/parallel/expert/moe_layer.hpp) against the independent
// reference of moe_reference.hpp: the layer's options for a reference config, shared draws, the
// elementwise comparison, and the reference's loss
//   J = <dy, y> + loss_scale * (aux loss + z loss)
// (what the layer's backward differentiates) with its central differences. Used by
// tests/unit/ep_moe_reference_test.cpp (one rank) and tests/mpi/ep_moe_reference_layouts_test.cpp
// (the expert-parallel layouts).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "quintet/nn/ops.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "support/catch.hpp"
#include "support/moe_reference.hpp"
#include "unit/nn_gradcheck.hpp"

namespace moe_ref {

inline quintet::expert::MoEOptions options_of(const Config& c) {
  using namespace quintet;
  expert::MoEOptions o;
  o.router = expert::RouterConfig{
      .experts = c.experts,
      .top_k = static_cast<int>(c.top_k),
      .score = c.sigmoid ? expert::RouterScore::sigmoid : expert::RouterScore::softmax,
      .renormalize = c.renormalize,
      .capacity_factor = static_cast<float>(c.capacity_factor),
      .aux_loss_coeff = static_cast<float>(c.aux_coeff),
      .z_loss_coeff = static_cast<float>(c.z_coeff)};
  o.expert_ffn = c.ffn;
  o.activation = c.swiglu ? nn::Activation::swiglu : nn::Activation::gelu;
  o.shared_experts = static_cast<int>(c.shared_width / c.ffn);
  return o;
}

// A fresh normal draw of shape in dtype (the values the layer and the reference both use).
inline quintet::Tensor draw(const quintet::Shape& shape, std::uint64_t seed, quintet::DType dtype,
                            double scale) {
  using namespace quintet;
  std::vector<double> v = Tensor::randn(shape, seed, DType::f64).to_vector<double>();
  for (double& x : v) x *= scale;
  return nn::cast(Tensor::from_vector(v, shape), dtype, Stream());
}

// |actual - expected| <= tol * (|expected| + max |expected|) elementwise: relative to the tensor's
// scale, so that small entries of a large gradient are not held to a tighter bound than f32
// routing gives (and exactly zero where all of expected is).
inline void require_close(const quintet::Tensor& actual, const std::vector<double>& expected,
                          double tol, const std::string& what) {
  INFO(what);
  const std::vector<double> a = actual.to_vector<double>();
  REQUIRE(a.size() == expected.size());
  double scale = 0.0;
  for (double e : expected) scale = std::max(scale, std::abs(e));
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i << ": " << a[i] << " vs " << expected[i]);
    REQUIRE(std::abs(a[i] - expected[i]) <= tol * (std::abs(expected[i]) + scale));
  }
}

// The reference's J on x [sequences, seq, d] with dy, and d J / d values by central differences,
// where values is x or one of p's vectors (perturbed in place and restored). Every perturbation
// must route as the unperturbed input (a difference across a change of experts or of drops would
// not be a derivative).
struct Loss {
  const Config& config;
  Params& params;
  std::vector<double>& x;
  const std::vector<double>& dy;
  std::int64_t sequences;
  double loss_scale;

  double operator()(const Result& unperturbed) const {
    const Result r = forward(config, params, x, sequences);
    REQUIRE(r.expert == unperturbed.expert);
    REQUIRE(r.kept == unperturbed.kept);
    double j = 0.0;
    for (std::size_t i = 0; i < r.y.size(); ++i) j += r.y[i] * dy[i];
    return j + loss_scale * (r.aux + r.z);
  }
  std::vector<double> grad(std::vector<double>& values) const {
    using namespace quintet;
    const Result unperturbed = forward(config, params, x, sequences);
    const Tensor view = Tensor::from_blob(values.data(), {static_cast<std::int64_t>(values.size())},
                                          DType::f64, Device::cpu());
    return nn_test::numeric_grad([&] { return (*this)(unperturbed); }, view, 1e-6)
        .to_vector<double>();
  }
};

}  // namespace moe_ref
