// The MoE router (quintet/parallel/expert/router.hpp): top-k selection and weights against a
// plain reference (support/route_reference.hpp), the capacity's dropping rule exactly, the load
// counted on the device, the aux and z losses as the Router computes them (the fused op's
// statistics, accumulate_aux_loss) at their defined values and with aux_grad_factor's gradient
// against finite differences, the balancing bias update, and bad configurations.
#include <cmath>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/parallel/expert/router.hpp"
#include "support/catch.hpp"
#include "support/route_reference.hpp"

using namespace quintet;
using namespace quintet::expert;

namespace {

Tensor matrix(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  return Tensor::from_vector(v, {rows, cols});
}

// A routing of logits with its aux and z losses, as Router::forward computes them: one
// moe_route_forward with the aux loss's statistics of `groups` groups and the z loss's sum, the
// capacity, and the aux loss from the statistics (accumulate_aux_loss).
struct Routed {
  nn::RouteOutput out;
  Routing routing;
  double aux = 0.0, z = 0.0;
};

Routed route_with_losses(const Tensor& logits, const RouterConfig& rc, std::int64_t groups) {
  const std::int64_t T = logits.size(0);
  nn::RouteOptions o = route_options(rc);
  o.groups = groups;
  o.z_scale = rc.z_loss_coeff / static_cast<double>(T);
  const Tensor z = Tensor::zeros({1}, DType::f64), aux = Tensor::zeros({1}, DType::f64);
  Routed r;
  r.out = nn::moe_route_forward(logits, Tensor(), o, z, Stream());
  r.routing = apply_capacity(r.out, rc);
  accumulate_aux_loss({r.out.counts, r.out.prob_sum}, T / groups, rc, aux);
  r.aux = aux.to_vector<double>()[0];
  r.z = z.to_vector<double>()[0];
  return r;
}

// A loss of the router's outputs: sum of c * weights + the aux and z losses, for finite
// differences against the analytic gradient.
double loss_of(const Tensor& logits, const RouterConfig& rc, const Tensor& c, std::int64_t groups) {
  const Routed r = route_with_losses(logits, rc, groups);
  double l = 0.0;
  const std::vector<float> w = r.routing.weights.to_vector<float>(), cv = c.to_vector<float>();
  for (std::size_t i = 0; i < w.size(); ++i) l += static_cast<double>(w[i]) * cv[i];
  return l + r.aux + r.z;
}

// Its gradient as Router::backward takes it: moe_route_backward with aux_grad_factor's scale for
// the aux term and z_loss_coeff / T for the z loss's mean.
Tensor analytic_grad(const Tensor& logits, const RouterConfig& rc, const Tensor& c,
                     std::int64_t groups) {
  const Routed r = route_with_losses(logits, rc, groups);
  const std::int64_t T = logits.size(0);
  return nn::moe_route_backward(
      c, logits, r.routing.probs, r.routing.experts, r.routing.kept, r.out.lse, r.out.counts,
      aux_grad_factor(rc, groups, T / groups, 1.0f), rc.z_loss_coeff / static_cast<double>(T),
      route_options(rc), Stream());
}

}  // namespace

TEST_CASE("router: top-k and weights equal a reference, ties to the lower expert", "[ep]") {
  const std::int64_t T = 5, E = 6;
  Tensor logits = Tensor::randn({T, E}, 7);
  logits.at<float>({4, 1}) = logits.at<float>({4, 3}) = 5.0f;  // a tie for the top score
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    for (bool renorm : {false, true}) {
      for (int k : {1, 2, 3}) {
        INFO("score " << static_cast<int>(score) << " renormalize " << renorm << " k " << k);
        RouterConfig rc{.experts = E, .top_k = k, .score = score, .renormalize = renorm};
        const Routing r = route(logits, Tensor(), rc);
        for (std::int64_t t = 0; t < T; ++t) {
          const std::vector<double> p = route_ref::scores(logits, t, score);
          route_ref::check_token(r, t, p, route_ref::selection_order(p), k, renorm);
        }
        CHECK(r.dropped == 0);
      }
    }
  }
  // The tie: experts 1 and 3 score the same; 1 is listed first.
  const Routing r = route(logits, Tensor(), RouterConfig{.experts = E, .top_k = 2});
  CHECK(r.experts.at<std::int32_t>({4, 0}) == 1);
  CHECK(r.experts.at<std::int32_t>({4, 1}) == 3);
}

TEST_CASE("router: the balancing bias changes the selection, not the weights", "[ep]") {
  const Tensor logits = matrix({3.0f, 2.0f, 1.0f, 0.0f}, 1, 4);
  RouterConfig rc{.experts = 4, .top_k = 2, .renormalize = false, .bias_rate = 0.1f};
  const Tensor bias = Tensor::from_vector(std::vector<float>{0.0f, 0.0f, 0.0f, 10.0f}, {4});
  const Routing r = route(logits, bias, rc);
  CHECK(r.experts.at<std::int32_t>({0, 0}) == 3);
  CHECK(r.experts.at<std::int32_t>({0, 1}) == 0);
  CHECK(r.weights.at<float>({0, 0}) == Approx(r.probs.at<float>({0, 3})));
  CHECK(r.weights.at<float>({0, 1}) == Approx(r.probs.at<float>({0, 0})));

  // The update: experts above the mean load go down by the rate, below it up, at it unchanged.
  Tensor b = Tensor::from_vector(std::vector<float>{0.5f, 0.0f, 0.0f, 0.0f}, {4});
  update_balance_bias(b, {10.0, 2.0, 4.0, 0.0}, 0.25f);  // mean 4
  CHECK(b.to_vector<float>() == std::vector<float>{0.25f, 0.25f, 0.0f, 0.25f});
}

TEST_CASE("router: the capacity drops the lowest-probability assignments, exactly", "[ep]") {
  // 6 tokens, 3 experts, top-1, capacity factor 1: C = ceil(1 * 6 * 1 / 3) = 2. Tokens 0..4 all
  // prefer expert 0, with probabilities rising by token except tokens 1 and 3, which tie.
  const std::vector<float> l0 = {1.0f, 2.0f, 1.5f, 2.0f, 1.2f, -3.0f};
  std::vector<float> v;
  for (float x : l0) v.insert(v.end(), {x, 0.0f, -1.0f});
  v[5 * 3 + 0] = -3.0f;
  v[5 * 3 + 1] = 1.0f;  // token 5 goes to expert 1
  const RouterConfig rc{.experts = 3, .top_k = 1, .capacity_factor = 1.0f};
  CHECK(rc.capacity(6) == 2);
  const Routing r = route(matrix(v, 6, 3), Tensor(), rc);
  // Expert 0's assignments by probability: tokens 1 and 3 (tied; both kept: C = 2), then 2, 4, 0.
  const std::vector<int> kept_want = {0, 1, 0, 1, 0, 1};
  for (int t = 0; t < 6; ++t) {
    INFO("token " << t);
    CHECK(static_cast<int>(r.kept.at<std::uint8_t>({t, 0})) == kept_want[t]);
    if (kept_want[t] == 0) CHECK(r.weights.at<float>({t, 0}) == 0.0f);
  }
  CHECK(r.dropped == 3);
  // The load: the permutation's counts of the kept assignments, summed on the device microbatch
  // after microbatch, without a host read; bad accumulators refused.
  const Tensor counts =
      nn::moe_permute(Tensor::zeros({6, 1}), r.experts, r.kept, 3, Stream()).counts;
  CHECK(counts.to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 1, 0});
  const Tensor load = Tensor::zeros({3}, DType::f64);
  accumulate_load(counts, load);
  accumulate_load(counts, load);
  CHECK(load.to_vector<double>() == std::vector<double>{4, 2, 0});
  REQUIRE_THROWS_QUINTET(accumulate_load(counts, Tensor::zeros({3})), InvalidArgument,
                         "f64 tensor");
  REQUIRE_THROWS_QUINTET(accumulate_load(counts.to(DType::f64), load), InvalidArgument, "i64");
  // A tie at the capacity's edge: the earlier token is kept.
  const RouterConfig rc1{.experts = 3, .top_k = 1, .capacity_factor = 0.5f};  // C = 1
  const Routing r1 = route(matrix(v, 6, 3), Tensor(), rc1);
  CHECK(r1.kept.at<std::uint8_t>({1, 0}) == 1);
  CHECK(r1.kept.at<std::uint8_t>({3, 0}) == 0);
}

TEST_CASE("router: gradients of the weights, aux loss and z loss equal finite differences",
          "[ep]") {
  const std::int64_t T = 8, E = 5, groups = 2;
  const Tensor base = Tensor::randn({T, E}, 11);
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    for (bool renorm : {false, true}) {
      for (float cf : {0.0f, 1.0f}) {
        INFO("score " << static_cast<int>(score) << " renormalize " << renorm << " capacity "
                      << cf);
        const RouterConfig rc{.experts = E,
                              .top_k = 2,
                              .score = score,
                              .renormalize = renorm,
                              .capacity_factor = cf,
                              .aux_loss_coeff = 0.3f,
                              .z_loss_coeff = 0.05f};
        const Tensor c = Tensor::randn({T, 2}, 13);
        const Tensor g = analytic_grad(base, rc, c, groups);
        const double h = 1e-2;
        for (std::int64_t t = 0; t < T; ++t) {
          for (std::int64_t e = 0; e < E; ++e) {
            Tensor plus = base.clone(), minus = base.clone();
            plus.at<float>({t, e}) += static_cast<float>(h);
            minus.at<float>({t, e}) -= static_cast<float>(h);
            // A step that changes the selection makes the loss jump: such elements are skipped.
            const Routing rp = route(plus, Tensor(), rc), rm = route(minus, Tensor(), rc);
            if (rp.experts.to_vector<std::int32_t>() != rm.experts.to_vector<std::int32_t>() ||
                rp.kept.to_vector<std::uint8_t>() != rm.kept.to_vector<std::uint8_t>()) {
              continue;
            }
            const double fd =
                (loss_of(plus, rc, c, groups) - loss_of(minus, rc, c, groups)) / (2 * h);
            INFO("element " << t << ", " << e);
            CHECK(g.at<float>({t, e}) == Approx(fd).margin(2e-4).epsilon(2e-3));
          }
        }
      }
    }
  }
}

TEST_CASE("router: aux and z losses take their defined values", "[ep]") {
  // Perfectly balanced: 4 tokens, 4 experts, top-1, uniform probabilities -> aux = coeff.
  RouterConfig rc{.experts = 4, .top_k = 1, .aux_loss_coeff = 0.01f, .z_loss_coeff = 0.5f};
  std::vector<float> v(16, 0.0f);
  for (int t = 0; t < 4; ++t) v[t * 4 + t] = 1e-4f;  // token t picks expert t
  const Tensor logits = matrix(v, 4, 4);
  CHECK(route_with_losses(logits, rc, 1).aux == Approx(0.01).epsilon(1e-3));
  // Two groups (sequences) of two tokens, each with its two tokens on two experts: balanced too.
  CHECK(route_with_losses(logits, rc, 2).aux == Approx(0.01).epsilon(1e-3));
  // z loss of all-zero logits: lse = log 4 for every token.
  const Tensor zeros = Tensor::zeros({3, 4});
  CHECK(route_with_losses(zeros, rc, 1).z ==
        Approx(0.5 * std::log(4.0) * std::log(4.0)).epsilon(1e-6));
  // All on one expert: f = (1, 0, 0, 0), P = (p, ...) -> aux = coeff * 4 * p.
  const Tensor skew = matrix({9.0f, 0.0f, 0.0f, 0.0f}, 1, 4);
  const Routed rs = route_with_losses(skew, rc, 1);
  CHECK(rs.aux == Approx(0.01 * 4 * rs.routing.probs.at<float>({0, 0})).epsilon(1e-6));
}

TEST_CASE("router: bad configurations are refused", "[ep]") {
  const Tensor logits = Tensor::randn({2, 4}, 1);
  REQUIRE_THROWS_QUINTET(route(logits, Tensor(), RouterConfig{.experts = 4, .top_k = 5}),
                         InvalidArgument, "more than the 4 experts");
  REQUIRE_THROWS_QUINTET(route(logits, Tensor(), RouterConfig{.experts = 4, .top_k = 0}),
                         InvalidArgument, "between 1 and 8");
  REQUIRE_THROWS_QUINTET(RouterConfig({.experts = 16, .top_k = 9}).validate(), InvalidArgument,
                         "between 1 and 8");
  REQUIRE_THROWS_QUINTET(
      route(logits, Tensor(), RouterConfig{.experts = 4, .top_k = 2, .aux_loss_coeff = -1.0f}),
      InvalidArgument, "aux_loss_coeff");
  REQUIRE_THROWS_QUINTET(route(logits, Tensor(), RouterConfig{.experts = 5, .top_k = 2}),
                         InvalidArgument, "[T, 5]");
  REQUIRE_THROWS_QUINTET(parse_router_score("relu"), InvalidArgument, "softmax or sigmoid");
}
