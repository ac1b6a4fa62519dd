// Helpers of the tensor-parallel tests: a CPU world, slicing a reference tensor the way a layer
// shards it, and comparing a sharded module against its unsharded nn counterpart parameter by
// parameter (values and gradients, by name).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/mesh.hpp"
#include "support/catch.hpp"

namespace tp_test {

using namespace quintet;

// f32 tolerance of every comparison: |got - want| <= kAbsTol + kRelTol * |want|. The sharded
// computation sums in another order (partial products over tp, then the reduction).
constexpr double kAbsTol = 2e-5;
constexpr double kRelTol = 1e-4;

inline World cpu_world() {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;
  config.timeout_s = 60;
  return init(config);
}

// Runs a case's comparisons; a failure on one rank fails the case on every rank, so that all of
// them leave it together (a rank that left alone would meet the others' next case's collectives).
template <typename F>
void agreed(Communicator& world, F&& checks) {
  bool failed = false;
  try {
    checks();
  } catch (...) {  // Catch has recorded the failure; count it and carry on
    failed = true;
  }
  Tensor any = Tensor::from_vector(std::vector<float>{failed ? 1.0f : 0.0f}, {});
  world.all_reduce(any, ReduceOp::max).wait();
  INFO("a comparison failed on " << (failed ? "this rank" : "another rank"));
  REQUIRE(any.item() == 0.0f);
}

// Element-wise comparison of two CPU tensors of one shape.
inline void require_close(const Tensor& got, const Tensor& want, const std::string& what,
                          double abs_tol = kAbsTol, double rel_tol = kRelTol) {
  INFO(what << ": got " << shape_str(got.shape()) << ", want " << shape_str(want.shape()));
  REQUIRE(got.numel() == want.numel());
  const std::vector<double> g = got.to(DType::f64).to_vector<double>();
  const std::vector<double> w = want.to(DType::f64).to_vector<double>();
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double excess = std::abs(g[i] - w[i]) - (abs_tol + rel_tol * std::abs(w[i]));
    if (i == 0 || excess > worst) worst = excess, at = i;
  }
  INFO("worst element " << at << ": got " << (g.empty() ? 0.0 : g[at]) << ", want "
                        << (w.empty() ? 0.0 : w[at]));
  REQUIRE(worst <= 0.0);
}

// Chunk r of tp along dim (a contiguous copy).
inline Tensor chunk(const Tensor& t, int dim, int r, int tp) {
  const std::int64_t n = t.size(dim) / tp;
  return t.narrow(dim, r * n, n).contiguous();
}

// The part of the unsharded tensor `full` that parameter p holds (p's shape when not a shard).
inline Tensor shard_of(const Tensor& full, const nn::Parameter& p) {
  const auto& a = p.attributes();
  if (a.full_shape.empty()) return full.view(p.shape());
  Tensor t = full.contiguous().view(a.full_shape);
  for (std::size_t d = 0; d < a.full_shape.size(); ++d) {
    t = t.narrow(static_cast<int>(d), a.shard_start[d], p.shape()[d]);
  }
  return t.contiguous();
}

// The gradient of p as the unsharded model sees it: summed over tp when it is partial
// (reduce_over_tp), as data parallelism would do.
inline Tensor full_grad(const nn::Parameter& p, Communicator& tp) {
  Tensor g = p.grad().clone();
  if (p.attributes().reduce_over_tp) tp.all_reduce(g).wait();
  return g;
}

// The gradient of p as data parallelism sees it on a mesh: expert parameters' summed over edp,
// dense ones' over dp (and over tp when partial).
inline Tensor data_parallel_grad(const nn::Parameter& p, Mesh& mesh) {
  Tensor g = p.grad().clone();
  if (p.attributes().is_expert) {
    mesh.comm(Axis::edp).all_reduce(g).wait();
  } else {
    if (p.attributes().reduce_over_tp) mesh.comm(Axis::tp).all_reduce(g).wait();
    mesh.comm(Axis::dp).all_reduce(g).wait();
  }
  return g;
}

// The parameter of m named `name`; a test failure when m has none.
inline const nn::Parameter& param_named(const nn::Module& m, const std::string& name) {
  for (const auto& [n, p] : m.named_parameters()) {
    if (n == name) return *p;
  }
  FAIL("no parameter " << name);
  throw;  // not reached: FAIL throws
}

// Every parameter's gradient of m as data parallelism sees it (data_parallel_grad), with its
// name, in m's order. Collective over the mesh's dp, edp and tp.
inline std::vector<std::pair<std::string, Tensor>> data_parallel_grads(const nn::Module& m,
                                                                       Mesh& mesh) {
  std::vector<std::pair<std::string, Tensor>> grads;
  for (const auto& [name, p] : m.named_parameters()) {
    grads.emplace_back(name, data_parallel_grad(*p, mesh));
  }
  return grads;
}

// Every parameter of `sharded` has a parameter of the same name in `reference` whose matching
// slice equals its values (same init) or, with grads = true, its gradient.
// Values are compared within value_tol (absolute and relative; 0: exactly).
inline void require_params_match(nn::Module& sharded, nn::Module& reference, Communicator& tp,
                                 bool grads, double value_tol = 0.0) {
  const auto ref = reference.named_parameters();
  const auto mine = sharded.named_parameters();
  REQUIRE(mine.size() == ref.size());
  for (const auto& [name, p] : mine) {
    INFO("parameter " << name << (grads ? " (gradient)" : " (value)"));
    auto it = std::find_if(ref.begin(), ref.end(), [&](const auto& e) { return e.first == name; });
    REQUIRE(it != ref.end());
    const nn::Parameter& q = *it->second;
    REQUIRE(
        q.numel() ==
        shape_numel(p->attributes().full_shape.empty() ? p->shape() : p->attributes().full_shape));
    if (grads) {
      require_close(full_grad(*p, tp), shard_of(q.grad(), *p), name);
    } else {
      require_close(p->data(), shard_of(q.data(), *p), name, value_tol, value_tol);
    }
  }
}

}  // namespace tp_test
