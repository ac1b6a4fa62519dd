// The fused MoE ops of quintet/nn/ops.hpp on one GPU against the CPU ops: moe_route_forward
// (softmax and sigmoid, k = 1, 2 and k = E, ties, the balancing bias, the aux and z statistics,
// more experts than a warp's lanes, tokens not a multiple of a tile), the capacity rule,
// moe_route_backward with the aux and z terms, and moe_permute / moe_unpermute / their backward
// (f32 and bf16, an expert with no token, dropped assignments, a token with every assignment
// dropped, sorted rows of no assignment; rows that take the 16-byte vector kernels, d = 64 and
// 1024, and rows that do not, d = 1 and 301, with d = 300 vectors for f32 only). Exits 77
// (skipped) without a GPU.
#include <cmath>
#include <tuple>
#include <vector>

#include "gpu/nn_gpu_compare.hpp"

using namespace quintet;
using namespace nn_gpu_test;
using nn::RouteScore;

namespace {

// Values of a tensor on either device, after the stream's work.
std::vector<double> host(const Tensor& t, const Stream& s) { return values(t, s); }

void require_close(const Tensor& gpu, const Tensor& cpu, const Stream& s, double tol,
                   const char* what) {
  const double e = rel_err(gpu, cpu, s);
  INFO(what << ": relative error " << e << " (tolerance " << tol << ")");
  REQUIRE(e <= tol);
}

}  // namespace

TEST_CASE("gpu moe_route_forward / backward equal the CPU ops", "[ep][gpu]") {
  const Stream s = Stream::create(Device::cuda(0));
  // (score, k, renormalize, experts, tokens, groups, capacity, bias)
  const auto [score, k, renorm, E, T, G, capacity, with_bias] =
      GENERATE(std::make_tuple(RouteScore::softmax, 2, true, 7, 96, 3, 0, false),
               std::make_tuple(RouteScore::softmax, 1, false, 7, 50, 2, 0, true),
               std::make_tuple(RouteScore::sigmoid, 3, true, 7, 96, 3, 0, true),
               std::make_tuple(RouteScore::softmax, 8, true, 8, 40, 4, 0, false),   // k = E
               std::make_tuple(RouteScore::softmax, 2, true, 70, 133, 7, 0, true),  // E > 32
               std::make_tuple(RouteScore::sigmoid, 8, false, 300, 61, 1, 0, false),
               // 6 warps a block (their statistics fill the shared memory), 2 tiles a group
               std::make_tuple(RouteScore::softmax, 2, true, 1000, 50, 2, 0, true),
               std::make_tuple(RouteScore::softmax, 2, true, 7, 96, 3, 20, false),  // capacity
               std::make_tuple(RouteScore::softmax, 1, false, 6, 64, 0, 5, true));
  INFO("score " << static_cast<int>(score) << " k " << k << " E " << E << " T " << T << " G " << G
                << " capacity " << capacity << " bias " << with_bias);
  Tensor logits = Tensor::randn({T, E}, 5 + E);
  // Ties: token 0's top two logits equal; token 1's every logit equal (k-way tie).
  logits.at<float>({0, 1}) = logits.at<float>({0, E - 1}) = 5.0f;
  for (std::int64_t e = 0; e < E; ++e) logits.at<float>({1, e}) = 0.5f;
  Tensor bias;
  if (with_bias) {
    std::vector<float> b(static_cast<std::size_t>(E));
    for (std::int64_t e = 0; e < E; ++e) b[e] = 0.01f * static_cast<float>((e * 7) % 5) - 0.02f;
    bias = Tensor::from_vector(b, {E});
  }
  nn::RouteOptions o;
  o.top_k = k;
  o.score = score;
  o.renormalize = renorm;
  o.groups = G;
  o.z_scale = 0.01;
  const Device dev = s.device();
  const Tensor z_cpu = Tensor::full({1}, 0.5, DType::f64);
  const Tensor z_gpu = z_cpu.to(dev, s);
  nn::RouteOutput want = nn::moe_route_forward(logits, bias, o, z_cpu, Stream());
  nn::RouteOutput got =
      nn::moe_route_forward(logits.to(dev, s), with_bias ? bias.to(dev, s) : Tensor(), o, z_gpu, s);
  // Selections exactly (ties to the lower expert on both), scores and weights to f32 rounding.
  CHECK(host(got.experts, s) == host(want.experts, Stream()));
  CHECK(host(got.kept, s) == host(want.kept, Stream()));
  require_close(got.probs, want.probs, s, 1e-6, "probs");
  require_close(got.weights, want.weights, s, 1e-6, "weights");
  require_close(got.lse, want.lse, s, 1e-6, "lse");
  CHECK(host(z_gpu, s)[0] == Approx(host(z_cpu, Stream())[0]).epsilon(1e-6));
  if (G > 0) {
    CHECK(host(got.counts, s) == host(want.counts, Stream()));
    require_close(got.prob_sum, want.prob_sum, s, 1e-6, "prob sums");
  } else {
    CHECK(!got.counts.defined());
  }
  // Without a bias, the E-way tie of token 1 picks experts 0..k-1 in order.
  if (!with_bias) {
    const std::vector<double> ex = host(got.experts, s);
    for (int j = 0; j < k; ++j) CHECK(ex[k + j] == j);
  }

  if (capacity > 0) {
    const std::int64_t dw = nn::moe_drop_over_capacity_(want.probs, want.experts, capacity,
                                                        want.weights, want.kept, Stream());
    CHECK(dw > 0);
    CHECK(nn::moe_drop_over_capacity_(got.probs, got.experts, capacity, got.weights, got.kept, s) ==
          -1);
    CHECK(host(got.kept, s) == host(want.kept, Stream()));
    require_close(got.weights, want.weights, s, 1e-6, "weights after the capacity");
  }

  const Tensor dweights = Tensor::randn({T, k}, 6);
  const Tensor counts_cpu = G > 0 ? want.counts : Tensor();
  const Tensor dl_want =
      nn::moe_route_backward(dweights, logits, want.probs, want.experts, want.kept, want.lse,
                             counts_cpu, 0.03, 0.02, o, Stream());
  const Tensor dl_got =
      nn::moe_route_backward(dweights.to(dev, s), logits.to(dev, s), got.probs, got.experts,
                             got.kept, got.lse, G > 0 ? got.counts : Tensor(), 0.03, 0.02, o, s);
  require_close(dl_got, dl_want, s, 1e-5, "logit gradient");
}

TEST_CASE("gpu moe_route_forward with no tokens", "[ep][gpu]") {
  const Stream s = Stream::create(Device::cuda(0));
  nn::RouteOptions o;
  o.groups = 2;
  const nn::RouteOutput r =
      nn::moe_route_forward(Tensor::zeros({0, 4}).to(s.device(), s), Tensor(), o, Tensor(), s);
  CHECK(host(r.counts, s) == std::vector<double>(8, 0.0));
  CHECK(host(r.prob_sum, s) == std::vector<double>(8, 0.0));
}

TEST_CASE("gpu moe_permute / moe_unpermute equal the CPU ops", "[ep][gpu]") {
  const Stream s = Stream::create(Device::cuda(0));
  const DType dtype = GENERATE(DType::f32, DType::bf16);
  const std::int64_t d = GENERATE(1, 64, 300, 301, 1024);
  constexpr std::int64_t kT = 37, kE = 6, kK = 2;
  INFO("dtype " << dtype_name(dtype) << " d " << d);
  // Random experts, none for expert 4, every 5th assignment dropped and both of token 1's.
  std::vector<std::int32_t> ex(kT * kK);
  std::vector<std::uint8_t> kp(kT * kK, 1);
  for (std::int64_t a = 0; a < kT * kK; ++a) {
    ex[a] = static_cast<std::int32_t>((a * 7 + a / 3) % kE);
    if (ex[a] == 4) ex[a] = 5;
    if (a % 5 == 3 || a / kK == 1) kp[a] = 0;
  }
  const Tensor experts = Tensor::from_vector(ex, {kT, kK});
  const Tensor kept = Tensor::from_vector(kp, {kT, kK});
  const Tensor weights = Tensor::randn({kT, kK}, 3);
  // The CPU reference computes in f32 on the GPU's (possibly bf16-rounded) values.
  const Tensor x = Tensor::randn({kT, d}, 4).to(dtype).to(DType::f32);
  const Device dev = s.device();
  const nn::PermuteOutput want = nn::moe_permute(x, experts, kept, kE, Stream());
  const nn::PermuteOutput got =
      nn::moe_permute(x.to(dev, s).to(dtype, s), experts.to(dev, s), kept.to(dev, s), kE, s);
  CHECK(host(got.counts, s) == host(want.counts, Stream()));
  CHECK(host(got.counts, s)[4] == 0);
  CHECK(host(got.offsets, s) == host(want.offsets, Stream()));
  CHECK(host(got.slot, s) == host(want.slot, Stream()));
  CHECK(host(got.source, s) == host(want.source, Stream()));
  CHECK(host(got.rows, s) == host(want.rows, Stream()));  // copies: exact, zeros past the kept

  std::int64_t rows = 0;
  for (std::uint8_t v : kp) rows += v;
  const double tol = dtype == DType::bf16 ? 1e-2 : 1e-6;
  const Tensor sorted_cpu = Tensor::randn({rows, d}, 7).to(dtype).to(DType::f32);
  const Tensor sorted_gpu = sorted_cpu.to(dev, s).to(dtype, s);
  const Tensor g_weights = weights.to(dev, s);
  require_close(nn::moe_unpermute(sorted_gpu, got.slot, g_weights, s),
                nn::moe_unpermute(sorted_cpu, want.slot, weights, Stream()), s, tol,
                "un-permutation with weights");
  require_close(nn::moe_unpermute(sorted_gpu, got.slot, Tensor(), s),
                nn::moe_unpermute(sorted_cpu, want.slot, Tensor(), Stream()), s, tol,
                "un-permutation without weights (the permutation's backward)");
  const Tensor block = Tensor::zeros({kT + 3, d}).to(dev, s).to(dtype, s);
  nn::moe_unpermute_into(sorted_gpu, got.slot, g_weights, block.narrow(0, 3, kT), s);
  require_close(block.narrow(0, 3, kT), nn::moe_unpermute(sorted_cpu, want.slot, weights, Stream()),
                s, tol, "un-permutation into a block of rows");
  const Tensor dy = Tensor::randn({kT, d}, 8).to(dtype).to(DType::f32);
  const nn::UnpermuteGrads gw =
      nn::moe_unpermute_backward(dy, sorted_cpu, want.slot, want.source, weights, Stream());
  const nn::UnpermuteGrads gg = nn::moe_unpermute_backward(dy.to(dev, s).to(dtype, s), sorted_gpu,
                                                           got.slot, got.source, g_weights, s);
  require_close(gg.drows, gw.drows, s, tol, "d(rows)");
  require_close(gg.dweights, gw.dweights, s, dtype == DType::bf16 ? 1e-2 : 1e-5, "d(weights)");
  const std::vector<double> dwg = host(gg.dweights, s);
  for (std::int64_t a = 0; a < kT * kK; ++a) {
    if (kp[a] == 0) CHECK(dwg[a] == 0.0);
  }
  // The permutation's own rows: past the kept ones, sorted rows of no assignment get zeros.
  const nn::UnpermuteGrads fw =
      nn::moe_unpermute_backward(dy, want.rows, want.slot, want.source, weights, Stream());
  const nn::UnpermuteGrads fg = nn::moe_unpermute_backward(dy.to(dev, s).to(dtype, s), got.rows,
                                                           got.slot, got.source, g_weights, s);
  const std::vector<double> drf = host(fg.drows, s);
  for (std::size_t c = static_cast<std::size_t>(rows * d); c < drf.size(); ++c) {
    REQUIRE(drf[c] == 0.0);
  }
  require_close(fg.drows, fw.drows, s, tol, "d(rows) with rows of no assignment");
  require_close(fg.dweights, fw.dweights, s, dtype == DType::bf16 ? 1e-2 : 1e-5,
                "d(weights) with rows of no assignment");
}
