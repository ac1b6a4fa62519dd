// The router's logits ops on the CPU (quintet/nn/router_ops.hpp) against the composition they
// replace: cast(x, f32) then linear_forward / linear_backward_input / linear_backward_weight in
// f32, for f32 and f64 x, one expert and many, an odd d; bad inputs rejected.
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "quintet/nn/ops.hpp"
#include "quintet/nn/router_ops.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::nn;

namespace {
const Stream kCpu;

// max |got - want| over max |want|: the sums differ from the linear ops' only in their order.
double worst_rel(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    num = std::max(num, std::abs(g[i] - w[i]));
    den = std::max(den, std::abs(w[i]));
  }
  return den > 0.0 ? num / den : num;
}

}  // namespace

TEST_CASE("router logits ops equal cast + linear in f32", "[nn][router]") {
  const auto [T, d, E, dtype] =
      GENERATE(std::make_tuple(40, 64, 8, DType::f32), std::make_tuple(33, 301, 1, DType::f32),
               std::make_tuple(17, 301, 64, DType::f64), std::make_tuple(5, 1024, 8, DType::f64));
  INFO("T " << T << " d " << d << " E " << E << " " << dtype_name(dtype));
  const Tensor x = Tensor::randn({T, d}, 11 + d).to(dtype);
  const Tensor w = Tensor::randn({E, d}, 12 + E);
  const Tensor dl = Tensor::randn({T, E}, 13 + T);
  const Tensor xf = cast(x, DType::f32, kCpu);

  const Tensor logits = router_logits_forward(x, w, kCpu);
  REQUIRE(logits.dtype() == DType::f32);
  CHECK(worst_rel(logits, linear_forward(xf, w, Tensor(), kCpu)) <= 1e-5);

  const Tensor dx = router_logits_backward_input(dl, w, dtype, kCpu);
  REQUIRE(dx.dtype() == dtype);
  CHECK(worst_rel(dx, cast(linear_backward_input(dl, w, kCpu), dtype, kCpu)) <= 1e-5);

  // Accumulates onto what dw held.
  const Tensor start = Tensor::randn({E, d}, 14);
  Tensor dw = start.clone(), want = start.clone();
  router_logits_backward_weight(dl, x, dw, kCpu);
  linear_backward_weight(dl, xf, want, Tensor(), kCpu);
  CHECK(worst_rel(dw, want) <= 1e-5);
  // Not just the starting values: the gradient moved dw.
  CHECK(worst_rel(dw, start) > 1e-2);
}

TEST_CASE("router logits ops reject bad inputs", "[nn][router]") {
  const Tensor x = Tensor::randn({4, 16}, 1), w = Tensor::randn({3, 16}, 2);
  const Tensor dl = Tensor::randn({4, 3}, 3);
  Tensor dw = Tensor::zeros({3, 16}, DType::f32);
  REQUIRE_THROWS_QUINTET(router_logits_forward(x, Tensor::randn({3, 15}, 4), kCpu), InvalidArgument,
                         "w must be a 2-D f32 tensor [rows, 16]");
  REQUIRE_THROWS_QUINTET(router_logits_forward(x, w.to(DType::f64), kCpu), InvalidArgument,
                         "w must be a 2-D f32");
  REQUIRE_THROWS_QUINTET(router_logits_forward(x.to(DType::i32), w, kCpu), InvalidArgument,
                         "x has dtype i32");
  REQUIRE_THROWS_QUINTET(router_logits_forward(x.view({64}), w, kCpu), InvalidArgument,
                         "expected [tokens, dim]");
  REQUIRE_THROWS_QUINTET(router_logits_forward(x, Tensor::randn({0, 16}, 5), kCpu), InvalidArgument,
                         "take 1 to 256");
  REQUIRE_THROWS_QUINTET(
      router_logits_forward(Tensor::randn({4, 2}, 6), Tensor::randn({257, 2}, 7), kCpu),
      InvalidArgument, "take 1 to 256");
  REQUIRE_THROWS_QUINTET(
      router_logits_backward_input(Tensor::randn({4, 2}, 8), w, DType::f32, kCpu), InvalidArgument,
      "dlogits must be a 2-D f32 tensor [rows, 3]");
  REQUIRE_THROWS_QUINTET(router_logits_backward_input(dl, w, DType::bf16, kCpu), InvalidArgument,
                         "dx dtype bf16");
  REQUIRE_THROWS_QUINTET(router_logits_backward_input(dl.to(DType::f64), w, DType::f32, kCpu),
                         InvalidArgument, "dlogits must be a 2-D f32");
  REQUIRE_THROWS_QUINTET(
      router_logits_backward_weight(dl, x, Tensor::zeros({3, 15}, DType::f32), kCpu),
      InvalidArgument, "dw must be a 2-D f32 tensor [rows, 16]");
  REQUIRE_THROWS_QUINTET(
      router_logits_backward_weight(dl, x, Tensor::zeros({3, 16}, DType::f64), kCpu),
      InvalidArgument, "dw must be a 2-D f32");
  REQUIRE_THROWS_QUINTET(router_logits_backward_weight(Tensor::randn({5, 3}, 9), x, dw, kCpu),
                         InvalidArgument, "dlogits must be a 2-D f32 tensor [4, 3]");
  const Tensor wide = Tensor::zeros({16, 6}, DType::f32);
  REQUIRE_THROWS_QUINTET(
      router_logits_backward_weight(dl, x, wide.transpose(0, 1).narrow(0, 0, 3), kCpu),
      InvalidArgument, "contiguous");
  // Nothing was written by the rejected calls.
  CHECK(dw.to_vector<float>() == std::vector<float>(48, 0.0f));
}
