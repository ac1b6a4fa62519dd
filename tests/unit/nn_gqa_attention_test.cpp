// Grouped-query attention on the CPU (k, v with Hkv heads serving H / Hkv query heads each; MQA at
// Hkv = 1): the forward against loops written here over K and V repeated per query head, the
// backward against the attention of the repeated K and V with its dk, dv summed over each group,
// and against central finite differences; causal with offsets, odd lengths; bad head counts.
#include <cmath>
#include <limits>
#include <vector>

#include "quintet/nn/ops.hpp"
#include "support/catch.hpp"
#include "unit/nn_gradcheck.hpp"

using namespace quintet;
using namespace quintet::nn;
using nn_test::dot;
using nn_test::numeric_grad;
using nn_test::randn64;
using nn_test::require_close;

namespace {
const Stream kCpu;

// x [B, Hkv, S, D] with every head repeated `group` times: [B, Hkv * group, S, D].
Tensor repeat_heads(const Tensor& x, std::int64_t group) {
  const std::int64_t B = x.size(0), Hkv = x.size(1), S = x.size(2), D = x.size(3);
  Tensor r = Tensor::zeros({B, Hkv * group, S, D}, DType::f64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hkv * group; ++h)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d)
          r.at<double>({b, h, s, d}) = x.at<double>({b, h / group, s, d});
  return r;
}

// g [B, Hkv * group, S, D] summed over each group of heads: [B, Hkv, S, D].
Tensor sum_groups(const Tensor& g, std::int64_t group) {
  const std::int64_t B = g.size(0), H = g.size(1), S = g.size(2), D = g.size(3);
  Tensor r = Tensor::zeros({B, H / group, S, D}, DType::f64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d)
          r.at<double>({b, h / group, s, d}) += g.at<double>({b, h, s, d});
  return r;
}

// Softmax attention by loops over K and V already repeated per query head.
void loop_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                    Tensor& out, Tensor& lse) {
  const std::int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), Sk = k.size(2), D = q.size(3);
  // The op's scale is an f32 (1/sqrt(D) rounded to f32 when not given).
  const double scale = o.scale > 0 ? o.scale : static_cast<float>(1.0 / std::sqrt(double(D)));
  out = Tensor::zeros(q.shape(), DType::f64);
  lse = Tensor::zeros({B, H, Sq}, DType::f64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        std::vector<double> w(Sk, -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < Sk; ++j) {
          if (o.causal && o.k_offset + j > o.q_offset + i) continue;
          double sdot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            sdot += q.at<double>({b, h, i, d}) * k.at<double>({b, h, j, d});
          w[j] = scale * sdot;
          mx = std::max(mx, w[j]);
        }
        if (std::isinf(mx)) {
          lse.at<double>({b, h, i}) = mx;
          continue;
        }
        double z = 0;
        for (std::int64_t j = 0; j < Sk; ++j) z += std::exp(w[j] - mx);
        lse.at<double>({b, h, i}) = mx + std::log(z);
        for (std::int64_t j = 0; j < Sk; ++j)
          for (std::int64_t d = 0; d < D; ++d)
            out.at<double>({b, h, i, d}) += std::exp(w[j] - mx) / z * v.at<double>({b, h, j, d});
      }
}
}  // namespace

TEST_CASE("grouped-query attention equals attention over K and V repeated per query head",
          "[nn][attention][gqa]") {
  struct Case {
    std::int64_t b, h, hkv, sq, sk, d;
    bool causal;
    std::int64_t q_offset, k_offset;
  };
  const Case cases[] = {
      {2, 4, 2, 5, 7, 3, true, 0, 0},   {1, 6, 1, 7, 7, 4, true, 0, 0},  // MQA
      {2, 6, 3, 9, 5, 2, true, 4, 1},   {1, 4, 2, 5, 6, 3, true, 0, 2},  // rows that see no key
      {1, 8, 2, 3, 11, 5, false, 0, 0}, {2, 3, 3, 4, 4, 3, true, 0, 0},  // MHA: group of 1
  };
  std::uint64_t seed = 100;
  for (const Case& c : cases) {
    INFO("B " << c.b << " H " << c.h << " Hkv " << c.hkv << " Sq " << c.sq << " Sk " << c.sk
              << " causal " << c.causal << " offsets " << c.q_offset << "/" << c.k_offset);
    const std::int64_t group = c.h / c.hkv;
    const Tensor q = randn64({c.b, c.h, c.sq, c.d}, ++seed);
    const Tensor k = randn64({c.b, c.hkv, c.sk, c.d}, ++seed);
    const Tensor v = randn64({c.b, c.hkv, c.sk, c.d}, ++seed);
    const Tensor dout = randn64({c.b, c.h, c.sq, c.d}, ++seed);
    AttentionOptions o;
    o.causal = c.causal;
    o.q_offset = c.q_offset;
    o.k_offset = c.k_offset;
    const Tensor kr = repeat_heads(k, group), vr = repeat_heads(v, group);
    const AttentionOutput a = attention_forward(q, k, v, o, kCpu);
    Tensor want_out, want_lse;
    loop_attention(q, kr, vr, o, want_out, want_lse);
    require_close(a.out, want_out, 1e-12, "out");
    nn_test::require_lse_close(a.lse, want_lse, 1e-12);
    const AttentionGrads g = attention_backward(dout, q, k, v, a.out, a.lse, o, kCpu);
    REQUIRE(g.dk.shape() == k.shape());
    REQUIRE(g.dv.shape() == v.shape());
    const AttentionOutput ar = attention_forward(q, kr, vr, o, kCpu);
    const AttentionGrads gr = attention_backward(dout, q, kr, vr, ar.out, ar.lse, o, kCpu);
    require_close(g.dq, gr.dq, 1e-12, "dq");
    require_close(g.dk, sum_groups(gr.dk, group), 1e-12, "dk summed over the group");
    require_close(g.dv, sum_groups(gr.dv, group), 1e-12, "dv summed over the group");
  }
}

TEST_CASE("grouped-query attention backward against finite differences", "[nn][attention][gqa]") {
  Tensor q = randn64({1, 4, 5, 3}, 201), k = randn64({1, 2, 7, 3}, 202),
         v = randn64({1, 2, 7, 3}, 203);
  const Tensor r = randn64({1, 4, 5, 3}, 204);
  AttentionOptions o;
  SECTION("causal with offsets") {
    o.q_offset = 3;
    o.k_offset = 1;
  }
  SECTION("multi-query, full mask") {
    k = randn64({1, 1, 7, 3}, 205);
    v = randn64({1, 1, 7, 3}, 206);
    o.causal = false;
  }
  const AttentionOutput a = attention_forward(q, k, v, o, kCpu);
  const AttentionGrads g = attention_backward(r, q, k, v, a.out, a.lse, o, kCpu);
  auto loss = [&] { return dot(attention_forward(q, k, v, o, kCpu).out, r); };
  require_close(g.dq, numeric_grad(loss, q), 1e-6, "dq");
  require_close(g.dk, numeric_grad(loss, k), 1e-6, "dk");
  require_close(g.dv, numeric_grad(loss, v), 1e-6, "dv");
}

TEST_CASE("grouped-query attention rejects head counts that do not divide",
          "[nn][attention][gqa]") {
  const Tensor q = Tensor::randn({1, 6, 4, 8}, 1), k = Tensor::randn({1, 4, 4, 8}, 2);
  REQUIRE_THROWS_QUINTET(attention_forward(q, k, k, {}, kCpu), InvalidArgument,
                         "with 4 heads, which must divide q's 6 heads");
  const Tensor k2 = Tensor::randn({1, 2, 4, 8}, 3);
  REQUIRE_THROWS_QUINTET(attention_forward(q, k2, Tensor::randn({1, 3, 4, 8}, 4), {}, kCpu),
                         InvalidArgument, "v has shape [1, 3, 4, 8], expected [1, 2, 4, 8]");
  const AttentionOutput a = attention_forward(q, k2, k2, {}, kCpu);
  const Tensor dq = Tensor::empty(q.shape()), wrong = Tensor::empty(q.shape());
  REQUIRE_THROWS_QUINTET(
      attention_backward_into(q, q, k2, k2, a.out, a.lse, {}, dq, wrong, wrong, kCpu),
      InvalidArgument, "dk has shape [1, 6, 4, 8], expected [1, 2, 4, 8]");
}
