// The router's logits ops (quintet/nn/router_ops.hpp) on one GPU against the CPU ops on the same
// values and against the composition they replace on the GPU (cast(x, f32), then the f32 linear
// ops): E = 8 and 64 (the weight in shared memory and read from global memory), E = 3 and 200
// (a last chunk of experts not full), d = 1024 and 300 (quads of 4 elements) and 301 (a lane per
// element), f32 and bf16 x; bad inputs rejected on the GPU. Exits 77 (skipped) without a GPU.
#include <cmath>
#include <tuple>
#include <vector>

#include "gpu/nn_gpu_compare.hpp"
#include "quintet/nn/router_ops.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {

// f32 results: the sums differ only in their order, so both the norm and the worst element stay
// within 1e-5 of the reference's scale.
void require_f32_close(const Tensor& gpu, const Tensor& want, const Stream& s, const char* what) {
  const std::vector<double> g = values(gpu, s), w = values(want, s);
  const double norm = rel_err(g, w), worst = worst_err(g, w);
  INFO(what << ": relative error norm " << norm << ", worst element " << worst);
  CHECK(norm <= 1e-5);
  CHECK(worst <= 1e-5);
}

// dx rounded once into dtype against an f32 reference: within the rounding (half an ULP, 2^-9 of
// the value in bf16) and the f32 order's 1e-5 of the largest magnitude.
void require_rounded_close(const Tensor& gpu, const Tensor& want, DType dtype, const Stream& s,
                           const char* what) {
  const std::vector<double> g = values(gpu, s), w = values(want, s);
  REQUIRE(g.size() == w.size());
  double top = 0.0;
  for (const double v : w) top = std::max(top, std::abs(v));
  const double ulp = dtype == DType::bf16 ? 0x1p-8 : 0x1p-23;
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO(what << ": element " << i << " got " << g[i] << " want " << w[i]);
    REQUIRE(std::abs(g[i] - w[i]) <= ulp * std::abs(w[i]) + 1e-5 * top);
  }
}

}  // namespace

TEST_CASE("gpu router logits ops equal the CPU ops and cast + linear", "[nn][gpu][router]") {
  const Stream s = Stream::create(Device::cuda(0));
  const auto [T, d, E, dtype] = GENERATE(
      std::make_tuple(1000, 1024, 8, DType::bf16), std::make_tuple(1000, 1024, 64, DType::bf16),
      std::make_tuple(300, 1024, 8, DType::f32), std::make_tuple(300, 1024, 64, DType::f32),
      std::make_tuple(257, 301, 8, DType::bf16), std::make_tuple(257, 301, 64, DType::f32),
      std::make_tuple(257, 300, 8, DType::bf16), std::make_tuple(129, 1024, 3, DType::bf16),
      std::make_tuple(65, 301, 200, DType::bf16));
  INFO("T " << T << " d " << d << " E " << E << " " << dtype_name(dtype));
  const Input x = random_input({T, d}, 21 + d + E, dtype, s);
  const Input w = random_input({E, d}, 22 + E, DType::f32, s, 0.05);
  const Input dl = random_input({T, E}, 23 + T, DType::f32, s);
  const Stream cpu;

  // Forward: the CPU op, and the old composition on the GPU.
  const Tensor logits = nn::router_logits_forward(x.gpu, w.gpu, s);
  require_f32_close(logits, nn::router_logits_forward(x.cpu, w.cpu, cpu), s, "logits vs CPU");
  require_f32_close(logits, nn::linear_forward(nn::cast(x.gpu, DType::f32, s), w.gpu, Tensor(), s),
                    s, "logits vs cast + linear");

  // Backward input, rounded once into x's dtype.
  const Tensor dx = nn::router_logits_backward_input(dl.gpu, w.gpu, dtype, s);
  REQUIRE(dx.dtype() == dtype);
  require_rounded_close(dx, nn::router_logits_backward_input(dl.cpu, w.cpu, DType::f32, cpu), dtype,
                        s, "dx vs CPU");
  require_rounded_close(dx, nn::linear_backward_input(dl.gpu, w.gpu, s), dtype, s, "dx vs linear");

  // Backward weight, accumulated onto a gradient that already holds values.
  const Tensor start = Tensor::randn({E, d}, 24);
  Tensor dw = start.to(s.device(), s), want_cpu = start.clone(), want_gpu = start.to(s.device(), s);
  nn::router_logits_backward_weight(dl.gpu, x.gpu, dw, s);
  nn::router_logits_backward_weight(dl.cpu, x.cpu, want_cpu, cpu);
  nn::linear_backward_weight(dl.gpu, nn::cast(x.gpu, DType::f32, s), want_gpu, Tensor(), s);
  require_f32_close(dw, want_cpu, s, "dw vs CPU");
  require_f32_close(dw, want_gpu, s, "dw vs linear");
  // The same bits a second time: the chunks are added in a fixed order.
  Tensor again = start.to(s.device(), s);
  nn::router_logits_backward_weight(dl.gpu, x.gpu, again, s);
  CHECK(values(again, s) == values(dw, s));
}

TEST_CASE("gpu router logits ops reject bad inputs", "[nn][gpu][router]") {
  const Stream s = Stream::create(Device::cuda(0));
  const Tensor x = to_gpu(Tensor::randn({4, 16}, 1), DType::bf16, s);
  const Tensor w = to_gpu(Tensor::randn({3, 16}, 2), DType::f32, s);
  const Tensor dl = to_gpu(Tensor::randn({4, 3}, 3), DType::f32, s);
  REQUIRE_THROWS_QUINTET(
      nn::router_logits_forward(x, to_gpu(Tensor::randn({3, 8}, 4), DType::f32, s), s),
      InvalidArgument, "w must be a 2-D f32 tensor [rows, 16]");
  REQUIRE_THROWS_QUINTET(nn::router_logits_forward(x, w.to(DType::bf16, s), s), InvalidArgument,
                         "w must be a 2-D f32");
  REQUIRE_THROWS_QUINTET(nn::router_logits_forward(x, Tensor::randn({3, 16}, 5), s),
                         InvalidArgument, "put every tensor");
  REQUIRE_THROWS_QUINTET(nn::router_logits_backward_input(dl, w, DType::f64, s), InvalidArgument,
                         "dx dtype f64");
  REQUIRE_THROWS_QUINTET(nn::router_logits_backward_weight(
                             dl, x, to_gpu(Tensor::zeros({3, 16}, DType::f32), DType::bf16, s), s),
                         InvalidArgument, "dw must be a 2-D f32");
}
