// The router's rules written plainly in f64, for the tests of the router
// (tests/unit/ep_router_test.cpp) and of the fused routing ops (tests/unit/ep_moe_ops_test.cpp):
// a row's scores and logsumexp, the experts in selection order (a tie to the lower expert), a
// check of a routing's scores, top-k and weights against them, and the gradient that
// nn::moe_route_backward returns (through the weights, the aux loss's term and the z loss's).
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

// log(sum_e exp(logits[t, e])) of row t of logits [T, E] (f32, CPU), in f64.
inline double lse(const quintet::Tensor& logits, std::int64_t t) {
  const std::int64_t E = logits.size(1);
  double m = -INFINITY, s = 0.0;
  for (std::int64_t e = 0; e < E; ++e) {
    m = std::max(m, static_cast<double>(logits.at<float>({t, e})));
  }
  for (std::int64_t e = 0; e < E; ++e) s += std::exp(logits.at<float>({t, e}) - m);
  return m + std::log(s);
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

// d(loss)/d(logits) [T, E] (row-major, f64) for the loss
//   sum_{t, j} dweights[t, j] w[t, j]  +  aux_scale sum_{t, e} counts[g(t), e] p[t, e]
//   +  z_scale sum_t lse_t^2,
// with p the scores of logits (CPU f32 [T, E]), w the weights of the given selection (experts,
// kept [T, k]: p at the selected experts, divided by the sum over all k selected when
// renormalize, 0 where not kept), g(t) = t / (T / G) for counts [G, E] f32 (undefined: no aux
// term). The counts carry no gradient (the aux loss's f is a count).
inline std::vector<double> route_backward(
    const quintet::Tensor& dweights, const quintet::Tensor& logits, const quintet::Tensor& experts,
    const quintet::Tensor& kept, const quintet::Tensor& counts, double aux_scale, double z_scale,
    quintet::nn::RouteScore score, bool renormalize) {
  const std::int64_t T = logits.size(0), E = logits.size(1), k = experts.size(1);
  std::vector<double> out(static_cast<std::size_t>(T * E));
  for (std::int64_t t = 0; t < T; ++t) {
    const std::vector<double> p = scores(logits, t, score);
    // d(loss)/d(p): the weights' term, then the aux loss's.
    std::vector<double> dp(static_cast<std::size_t>(E), 0.0);
    double S = 0.0, gp = 0.0;
    for (std::int64_t j = 0; j < k; ++j) S += p[experts.at<std::int32_t>({t, j})];
    for (std::int64_t j = 0; j < k; ++j) {
      if (kept.at<std::uint8_t>({t, j}) != 0) {
        gp += dweights.at<float>({t, j}) * p[experts.at<std::int32_t>({t, j})];
      }
    }
    for (std::int64_t j = 0; j < k; ++j) {
      const double g = kept.at<std::uint8_t>({t, j}) != 0 ? dweights.at<float>({t, j}) : 0.0;
      // w_j = p_j / S: dw_i/dp_j = delta_ij / S - p_i / S^2 over all k selected.
      dp[experts.at<std::int32_t>({t, j})] += renormalize ? g / S - gp / (S * S) : g;
    }
    if (counts.defined()) {
      const std::int64_t g = t / (T / counts.size(0));
      for (std::int64_t e = 0; e < E; ++e) dp[e] += aux_scale * counts.at<float>({g, e});
    }
    // Through the scores: softmax's Jacobian diag(p) - p p^T, or sigmoid's p (1 - p).
    double dot = 0.0;
    for (std::int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    const double l = lse(logits, t);
    for (std::int64_t e = 0; e < E; ++e) {
      const double ds = score == quintet::nn::RouteScore::softmax ? p[e] * (dp[e] - dot)
                                                                  : dp[e] * p[e] * (1.0 - p[e]);
      // d(lse^2)/d(logits) = 2 lse softmax(logits).
      const double dz = 2.0 * l * std::exp(logits.at<float>({t, e}) - l);
      out[static_cast<std::size_t>(t * E + e)] = ds + z_scale * dz;
    }
  }
  return out;
}

}  // namespace route_ref
