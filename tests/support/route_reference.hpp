// The router's rules for one token written plainly in f64, for the tests of the router
// (tests/unit/ep_router_test.cpp) and of the fused routing op (tests/unit/ep_moe_ops_test.cpp):
// a row's scores, the experts in selection order (a tie to the lower expert), and a check of a
// routing's scores, top-k and weights against them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"
#include "support/catch.hpp"

namespace route_ref {

// The scores of row t of logits [T, E] (f32, CPU) in f64: softmax over the experts, or sigmoid.
inline std::vector<double> scores(const quintet::Tensor& logits, std::int64_t t,
                                  quintet::nn::RouteScore score) {
  const std::int64_t E = logits.size(1);
  std::vector<double> p(static_cast<std::size_t>(E));
  for (std::int64_t e = 0; e < E; ++e) p[e] = logits.at<float>({t, e});
  if (score == quintet::nn::RouteScore::softmax) {
    const double m = *std::max_element(p.begin(), p.end());
    double s = 0.0;
    for (double& v : p) s += (v = std::exp(v - m));
    for (double& v : p) v /= s;
  } else {
    for (double& v : p) v = 1.0 / (1.0 + std::exp(-v));
  }
  return p;
}

// The experts by decreasing selection score `sel`, a tie to the lower expert.
inline std::vector<int> selection_order(const std::vector<double>& sel) {
  std::vector<int> order(sel.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
  return order;
}

// Token t of a routing r (CPU tensors probs [T, E], experts, weights and kept [T, k]; the
// router's Routing or the fused op's RouteOutput) against the reference: every score equals p,
// the k experts are the first k of `order`, each kept, with weight p (divided by the k scores'
// sum when renormalized), within 1e-6 relative.
template <typename R>
void check_token(const R& r, std::int64_t t, const std::vector<double>& p,
                 const std::vector<int>& order, int k, bool renormalize) {
  for (std::size_t e = 0; e < p.size(); ++e) {
    CHECK(r.probs.template at<float>({t, static_cast<std::int64_t>(e)}) ==
          Approx(p[e]).epsilon(1e-6));
  }
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += p[order[j]];
  for (int j = 0; j < k; ++j) {
    CHECK(r.experts.template at<std::int32_t>({t, j}) == order[j]);
    const double want = renormalize ? p[order[j]] / sum : p[order[j]];
    CHECK(r.weights.template at<float>({t, j}) == Approx(want).epsilon(1e-6));
    CHECK(r.kept.template at<std::uint8_t>({t, j}) == 1);
  }
}

}  // namespace route_ref
