// The fused MoE ops of quintet/nn/ops.hpp on the CPU: moe_route_forward against a plain f64
// reference (scores, top-k with ties, weights, the aux loss's statistics, logsumexp and the z
// loss's sum: support/route_reference.hpp); moe_route_backward against the f64 reference gradient
// and finite differences of every term; moe_permute / moe_unpermute against a plain sort, gather
// and weighted sum, and their gradients (the adjoint and finite differences); bad arguments
// refused.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/nn/ops.hpp"
#include "support/catch.hpp"
#include "support/route_reference.hpp"

using namespace quintet;
using nn::RouteScore;

namespace {

// Logits with a tie for the top score of token 1 (experts 0 and 2) and for the second of token 3.
Tensor tied_logits(std::int64_t T, std::int64_t E, std::uint64_t seed) {
  Tensor l = Tensor::randn({T, E}, seed);
  if (T > 3 && E > 3) {
    l.at<float>({1, 0}) = l.at<float>({1, 2}) = 4.0f;
    l.at<float>({3, 1}) = 6.0f;
    l.at<float>({3, 2}) = l.at<float>({3, 3}) = 3.0f;
  }
  return l;
}

nn::RouteOptions options(int k, RouteScore score, bool renorm, std::int64_t groups = 0,
                         double z_scale = 0.0) {
  nn::RouteOptions o;
  o.top_k = k;
  o.score = score;
  o.renormalize = renorm;
  o.groups = groups;
  o.z_scale = z_scale;
  return o;
}

// The scalar loss whose logits gradient moe_route_backward returns (routing recomputed from
// logits; the counts held fixed, as the aux loss's f carries no gradient).
double route_loss(const Tensor& logits, const nn::RouteOptions& o, std::int64_t capacity,
                  const Tensor& c, const Tensor& counts, double aux_scale, double z_scale) {
  nn::RouteOutput r = nn::moe_route_forward(logits, Tensor(), o, Tensor(), Stream());
  if (capacity > 0) {
    nn::moe_drop_over_capacity_(r.probs, r.experts, capacity, r.weights, r.kept, Stream());
  }
  const std::int64_t T = logits.size(0), E = logits.size(1);
  double l = 0.0;
  for (std::int64_t a = 0; a < c.numel(); ++a) {
    l += static_cast<double>(r.weights.data<float>()[a]) * c.data<float>()[a];
  }
  if (counts.defined()) {
    const std::int64_t n = T / counts.size(0);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t e = 0; e < E; ++e) {
        l += aux_scale * counts.at<float>({t / n, e}) * r.probs.at<float>({t, e});
      }
    }
  }
  for (std::int64_t t = 0; t < T; ++t)
    l += z_scale * route_ref::lse(logits, t) * route_ref::lse(logits, t);
  return l;
}

}  // namespace

TEST_CASE("moe_route_forward equals a plain reference, statistics included", "[ep]") {
  const std::int64_t T = 12, E = 6, G = 3;
  const Tensor logits = tied_logits(T, E, 3);
  const Tensor bias =
      Tensor::from_vector(std::vector<float>{0.0f, 0.05f, -0.1f, 0.0f, 0.2f, 0.0f}, {E});
  for (RouteScore score : {RouteScore::softmax, RouteScore::sigmoid}) {
    for (bool renorm : {false, true}) {
      for (int k : {1, 2, static_cast<int>(E)}) {
        for (bool with_bias : {false, true}) {
          INFO("score " << static_cast<int>(score) << " renormalize " << renorm << " k " << k
                        << " bias " << with_bias);
          const double z_scale = 0.25;
          Tensor z_sum = Tensor::full({1}, 1.5, DType::f64);
          const nn::RouteOutput r =
              nn::moe_route_forward(logits, with_bias ? bias : Tensor(),
                                    options(k, score, renorm, G, z_scale), z_sum, Stream());
          double z_want = 1.5;
          // The aux loss's statistics per group of T / G tokens: selections, sums of scores.
          std::vector<double> counts_want(G * E, 0.0), prob_sum_want(G * E, 0.0);
          for (std::int64_t t = 0; t < T; ++t) {
            const std::vector<double> p = route_ref::scores(logits, t, score);
            std::vector<double> sel = p;
            if (with_bias) {
              for (std::int64_t e = 0; e < E; ++e) {
                sel[e] = static_cast<float>(p[e]) + bias.at<float>({e});
              }
            }
            const std::vector<int> order = route_ref::selection_order(sel);
            route_ref::check_token(r, t, p, order, k, renorm);
            const double l = route_ref::lse(logits, t);
            CHECK(r.lse.at<float>({t}) == Approx(l).epsilon(1e-6));
            z_want += z_scale * l * l;
            const std::int64_t g = t / (T / G);
            for (int j = 0; j < k; ++j) counts_want[g * E + order[j]] += 1.0;
            for (std::int64_t e = 0; e < E; ++e) prob_sum_want[g * E + e] += p[e];
          }
          // Ties go to the lower expert.
          if (!with_bias) CHECK(r.experts.at<std::int32_t>({1, 0}) == 0);
          if (!with_bias && k >= 2) CHECK(r.experts.at<std::int32_t>({3, 1}) == 2);
          // The statistics: counts exactly, sums of scores to f32 rounding; the z loss's sum
          // added to what z_sum held.
          const std::vector<float> counts = r.counts.to_vector<float>();
          const std::vector<float> prob_sum = r.prob_sum.to_vector<float>();
          REQUIRE(counts.size() == counts_want.size());
          REQUIRE(prob_sum.size() == prob_sum_want.size());
          for (std::size_t i = 0; i < counts.size(); ++i) {
            INFO("group " << i / E << " expert " << i % E);
            CHECK(counts[i] == counts_want[i]);
            CHECK(prob_sum[i] == Approx(prob_sum_want[i]).epsilon(1e-6));
          }
          CHECK(z_sum.to_vector<double>()[0] == Approx(z_want).epsilon(1e-8));
        }
      }
    }
  }
}

TEST_CASE("moe_route_forward: no statistics without groups; the capacity rule", "[ep]") {
  const Tensor logits = tied_logits(8, 4, 9);
  const nn::RouteOutput r = nn::moe_route_forward(
      logits, Tensor(), options(2, RouteScore::softmax, true), Tensor(), Stream());
  CHECK(!r.counts.defined());
  CHECK(!r.prob_sum.defined());
  // k = E with capacity 3 of 8 tokens: each expert keeps its 3 largest probs.
  nn::RouteOutput all = nn::moe_route_forward(
      logits, Tensor(), options(4, RouteScore::softmax, false), Tensor(), Stream());
  const std::int64_t dropped =
      nn::moe_drop_over_capacity_(all.probs, all.experts, 3, all.weights, all.kept, Stream());
  CHECK(dropped == 4 * (8 - 3));
  for (std::int64_t e = 0; e < 4; ++e) {
    std::vector<float> kept_p, dropped_p;
    for (std::int64_t a = 0; a < 32; ++a) {
      if (all.experts.data<std::int32_t>()[a] != e) continue;
      const float p = all.probs.at<float>({a / 4, e});
      if (all.kept.data<std::uint8_t>()[a] != 0) {
        kept_p.push_back(p);
        CHECK(all.weights.data<float>()[a] == p);
      } else {
        dropped_p.push_back(p);
        CHECK(all.weights.data<float>()[a] == 0.0f);
      }
    }
    REQUIRE(kept_p.size() == 3);
    CHECK(*std::min_element(kept_p.begin(), kept_p.end()) >=
          *std::max_element(dropped_p.begin(), dropped_p.end()));
  }
}

TEST_CASE("moe_route_backward equals a plain reference and finite differences", "[ep]") {
  const std::int64_t T = 8, E = 5, G = 2;
  const Tensor logits = Tensor::randn({T, E}, 21);
  for (RouteScore score : {RouteScore::softmax, RouteScore::sigmoid}) {
    for (bool renorm : {false, true}) {
      for (int k : {1, 2, 5}) {
        for (std::int64_t capacity : {0, 3}) {
          INFO("score " << static_cast<int>(score) << " renormalize " << renorm << " k " << k
                        << " capacity " << capacity);
          const nn::RouteOptions o = options(k, score, renorm, G);
          nn::RouteOutput r = nn::moe_route_forward(logits, Tensor(), o, Tensor(), Stream());
          if (capacity > 0) {
            nn::moe_drop_over_capacity_(r.probs, r.experts, capacity, r.weights, r.kept, Stream());
          }
          const Tensor c = Tensor::randn({T, k}, 23);
          const double aux_scale = 0.07, z_scale = 0.03;
          const Tensor g = nn::moe_route_backward(c, logits, r.probs, r.experts, r.kept, r.lse,
                                                  r.counts, aux_scale, z_scale, o, Stream());
          // The f64 reference, on the op's selection and drops, to f32 rounding.
          const std::vector<double> want = route_ref::route_backward(
              c, logits, r.experts, r.kept, r.counts, aux_scale, z_scale, score, renorm);
          const std::vector<float> got = g.to_vector<float>();
          REQUIRE(got.size() == want.size());
          for (std::size_t i = 0; i < got.size(); ++i) {
            INFO("element " << i / E << ", " << i % E);
            CHECK(got[i] == Approx(want[i]).margin(1e-6).epsilon(1e-5));
          }
          // Finite differences of each term, where the step keeps the selection.
          const double h = 1e-2;
          for (std::int64_t t = 0; t < T; ++t) {
            for (std::int64_t e = 0; e < E; ++e) {
              Tensor plus = logits.clone(), minus = logits.clone();
              plus.at<float>({t, e}) += static_cast<float>(h);
              minus.at<float>({t, e}) -= static_cast<float>(h);
              nn::RouteOutput rp = nn::moe_route_forward(plus, Tensor(), o, Tensor(), Stream());
              nn::RouteOutput rm = nn::moe_route_forward(minus, Tensor(), o, Tensor(), Stream());
              if (capacity > 0) {
                nn::moe_drop_over_capacity_(rp.probs, rp.experts, capacity, rp.weights, rp.kept,
                                            Stream());
                nn::moe_drop_over_capacity_(rm.probs, rm.experts, capacity, rm.weights, rm.kept,
                                            Stream());
              }
              if (rp.experts.to_vector<std::int32_t>() != r.experts.to_vector<std::int32_t>() ||
                  rm.experts.to_vector<std::int32_t>() != r.experts.to_vector<std::int32_t>() ||
                  rp.kept.to_vector<std::uint8_t>() != r.kept.to_vector<std::uint8_t>() ||
                  rm.kept.to_vector<std::uint8_t>() != r.kept.to_vector<std::uint8_t>()) {
                continue;
              }
              const double fd = (route_loss(plus, o, capacity, c, r.counts, aux_scale, z_scale) -
                                 route_loss(minus, o, capacity, c, r.counts, aux_scale, z_scale)) /
                                (2 * h);
              INFO("element " << t << ", " << e);
              CHECK(g.at<float>({t, e}) == Approx(fd).margin(3e-4).epsilon(3e-3));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("moe_permute and moe_unpermute equal a plain sort, gather and weighted sum", "[ep]") {
  const std::int64_t T = 9, E = 5, k = 2, d = 3;
  // Expert 3 gets no token; two assignments are dropped.
  std::vector<std::int32_t> ex = {0, 1, 1, 4, 2, 0, 4, 1, 0, 2, 1, 0, 2, 4, 4, 0, 1, 2};
  std::vector<std::uint8_t> kp(T * k, 1);
  kp[5] = 0;
  kp[12] = 0;
  const Tensor experts = Tensor::from_vector(ex, {T, k});
  const Tensor kept = Tensor::from_vector(kp, {T, k});
  const Tensor weights = Tensor::randn({T, k}, 31);
  // The kept assignments sorted by expert, then by assignment.
  std::vector<std::int32_t> order;
  for (std::int32_t a = 0; a < T * k; ++a) {
    if (kp[a] != 0) order.push_back(a);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return ex[a] < ex[b]; });
  const auto rows = static_cast<std::int64_t>(order.size());
  std::vector<std::int64_t> counts(E, 0);
  std::vector<std::int32_t> slot(T * k, -1), source(T * k, -1);
  for (std::int64_t i = 0; i < rows; ++i) {
    ++counts[ex[order[i]]];
    slot[order[i]] = static_cast<std::int32_t>(i);
    source[i] = order[i];
  }
  REQUIRE(counts[3] == 0);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dtype_name(dt));
    const Tensor x = Tensor::randn({T, d}, 33).to(dt);
    const nn::PermuteOutput p = nn::moe_permute(x, experts, kept, E, Stream());
    CHECK(p.counts.to_vector<std::int64_t>() == counts);
    std::vector<std::int64_t> offsets(E + 1, 0);
    std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
    CHECK(p.offsets.to_vector<std::int64_t>() == offsets);
    CHECK(p.slot.to_vector<std::int32_t>() == slot);
    CHECK(p.source.to_vector<std::int32_t>() == source);
    const std::vector<double> xv = x.to(DType::f64).to_vector<double>();
    const std::vector<double> rv = p.rows.to(DType::f64).to_vector<double>();
    for (std::int64_t i = 0; i < T * k; ++i) {
      for (std::int64_t c = 0; c < d; ++c) {
        CHECK(rv[i * d + c] == (i < rows ? xv[(order[i] / k) * d + c] : 0.0));
      }
    }
    // The weighted sum per token, and its backward.
    const Tensor sorted = Tensor::randn({rows, d}, 34).to(dt);
    const std::vector<double> sv = sorted.to(DType::f64).to_vector<double>();
    const std::vector<float> wv = weights.to_vector<float>();
    const std::vector<double> y =
        nn::moe_unpermute(sorted, p.slot, weights, Stream()).to(DType::f64).to_vector<double>();
    const Tensor dy = Tensor::randn({T, d}, 35).to(dt);
    const std::vector<double> dyv = dy.to(DType::f64).to_vector<double>();
    const nn::UnpermuteGrads g =
        nn::moe_unpermute_backward(dy, sorted, p.slot, p.source, weights, Stream());
    const std::vector<double> dr = g.drows.to(DType::f64).to_vector<double>();
    const std::vector<float> dw = g.dweights.to_vector<float>();
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t c = 0; c < d; ++c) {
        double want = 0.0;
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int32_t i = slot[t * k + j];
          if (i >= 0) want += static_cast<double>(wv[t * k + j]) * sv[i * d + c];
        }
        CHECK(y[t * d + c] == Approx(want).margin(1e-6));
      }
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        const std::int32_t i = slot[a];
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c) {
          if (i >= 0) {
            CHECK(dr[i * d + c] == Approx(wv[a] * dyv[t * d + c]).margin(1e-6));
            dot += dyv[t * d + c] * sv[i * d + c];
          }
        }
        CHECK(dw[a] == Approx(dot).margin(1e-6));
      }
    }
    // The same written into a block of rows of a larger output, the other rows left alone.
    const Tensor big = Tensor::full({T + 2, d}, 7.0, dt);
    nn::moe_unpermute_into(sorted, p.slot, weights, big.narrow(0, 1, T), Stream());
    const std::vector<double> bv = big.to(DType::f64).to_vector<double>();
    CHECK(std::vector<double>(bv.begin() + d, bv.end() - d) == y);
    CHECK(bv.front() == 7.0);
    CHECK(bv.back() == 7.0);
    // The permutation's backward is the un-permutation without weights: <P x, r> = <x, P^T r>.
    const Tensor r = Tensor::randn({T * k, d}, 37).to(dt);
    const std::vector<double> rr = r.to(DType::f64).to_vector<double>();
    const std::vector<double> ptr =
        nn::moe_unpermute(r, p.slot, Tensor(), Stream()).to(DType::f64).to_vector<double>();
    double lhs = 0.0, rhs = 0.0;
    for (std::size_t i = 0; i < rv.size(); ++i) lhs += rv[i] * rr[i];
    for (std::size_t i = 0; i < xv.size(); ++i) rhs += xv[i] * ptr[i];
    CHECK(lhs == Approx(rhs).epsilon(1e-5));
  }
}

TEST_CASE("moe_unpermute's gradients equal finite differences (f64)", "[ep]") {
  const std::int64_t T = 4, E = 3, k = 2, d = 3;
  const Tensor experts =
      Tensor::from_vector(std::vector<std::int32_t>{0, 2, 2, 0, 1, 2, 0, 1}, {T, k});
  std::vector<std::uint8_t> kp(T * k, 1);
  kp[3] = 0;
  const Tensor kept = Tensor::from_vector(kp, {T, k});
  const Tensor x = Tensor::randn({T, d}, 41).to(DType::f64);
  const nn::PermuteOutput p = nn::moe_permute(x, experts, kept, E, Stream());
  const Tensor rows = p.rows.narrow(0, 0, T * k - 1).contiguous();
  const Tensor w = Tensor::randn({T, k}, 43);
  const Tensor c = Tensor::randn({T, d}, 45).to(DType::f64);
  auto loss = [&](const Tensor& r, const Tensor& wt) {
    const std::vector<double> y = nn::moe_unpermute(r, p.slot, wt, Stream()).to_vector<double>();
    const std::vector<double> cv = c.to_vector<double>();
    return std::inner_product(y.begin(), y.end(), cv.begin(), 0.0);
  };
  const nn::UnpermuteGrads g = nn::moe_unpermute_backward(c, rows, p.slot, p.source, w, Stream());
  const double h = 1e-3;
  for (std::int64_t i = 0; i < rows.numel(); ++i) {
    Tensor a = rows.clone(), b = rows.clone();
    a.data<double>()[i] += h;
    b.data<double>()[i] -= h;
    CHECK(g.drows.data<double>()[i] == Approx((loss(a, w) - loss(b, w)) / (2 * h)).margin(1e-9));
  }
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    Tensor a = w.clone(), b = w.clone();
    a.data<float>()[i] += 1e-2f;
    b.data<float>()[i] -= 1e-2f;
    const double fd = (loss(rows, a) - loss(rows, b)) /
                      (static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]);
    CHECK(g.dweights.data<float>()[i] == Approx(fd).margin(1e-5));
  }
  CHECK(g.dweights.data<float>()[3] == 0.0f);  // dropped
}

TEST_CASE("the MoE ops refuse bad arguments", "[ep]") {
  const Tensor logits = Tensor::randn({6, 4}, 1);
  REQUIRE_THROWS_QUINTET(
      nn::moe_route_forward(logits, Tensor(), options(5, RouteScore::softmax, true), Tensor(),
                            Stream()),
      InvalidArgument, "top_k = 5");
  REQUIRE_THROWS_QUINTET(
      nn::moe_route_forward(logits, Tensor(), options(2, RouteScore::softmax, true, 4), Tensor(),
                            Stream()),
      InvalidArgument, "groups = 4");
  REQUIRE_THROWS_QUINTET(
      nn::moe_route_forward(logits.to(DType::f64), Tensor(), options(2, RouteScore::softmax, true),
                            Tensor(), Stream()),
      InvalidArgument, "logits must be");
  REQUIRE_THROWS_QUINTET(
      nn::moe_route_forward(logits, Tensor::zeros({3}), options(2, RouteScore::softmax, true),
                            Tensor(), Stream()),
      InvalidArgument, "bias must be");
  REQUIRE_THROWS_QUINTET(
      nn::moe_route_forward(logits, Tensor(), options(2, RouteScore::softmax, true),
                            Tensor::zeros({1}), Stream()),
      InvalidArgument, "z_sum must be");
  const Tensor ex = Tensor::from_vector(std::vector<std::int32_t>{0, 4}, {1, 2});
  const Tensor kept = Tensor::from_vector(std::vector<std::uint8_t>{1, 1}, {1, 2});
  REQUIRE_THROWS_QUINTET(nn::moe_permute(Tensor::zeros({1, 3}), ex, kept, 4, Stream()),
                         InvalidArgument, "names expert 4 of 4");
  const Tensor slot = Tensor::from_vector(std::vector<std::int32_t>{0, 2}, {1, 2});
  REQUIRE_THROWS_QUINTET(nn::moe_unpermute(Tensor::zeros({2, 3}), slot, Tensor(), Stream()),
                         InvalidArgument, "row 2 of 2");
  REQUIRE_THROWS_QUINTET(nn::moe_unpermute_into(Tensor::zeros({2, 3}), slot, Tensor(),
                                                Tensor::zeros({2, 3}), Stream()),
                         InvalidArgument, "out has shape");
  REQUIRE_THROWS_QUINTET(
      nn::moe_unpermute_backward(Tensor::zeros({1, 3}), Tensor::zeros({2, 3}), slot,
                                 Tensor::zeros({2}), Tensor::zeros({1, 2}), Stream()),
      InvalidArgument, "source must be");
}
