// FP8 ("hybrid") tp linear layers on the GPU against the CPU emulation: a column- and a
// row-parallel layer (tp = 1 on each rank's GPU), bf16 (its forward with fast accumulation) and
// f32, with and without bias, current and delayed scaling over two steps, at a shape cuBLASLt's
// FP8 kernels take (multiples of 16) and one they do not (the f32 fallback): output, input
// gradient, weight and bias gradients equal f32 GEMMs of the same inputs rounded through FP8
// (nn::fp8_round_trip at the scales of their amaxes) within the bf16 / f32 bars of the nn GPU
// tests, differ from the layer without FP8, and the delayed histories read back by fp8_end_step
// hold the tensors' amaxes. Exits 77 (skipped) without a GPU.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/tensor_parallel/fp8.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

const Stream kCpu;

// A tensor's values on the host as f32.
Tensor host(const Tensor& t, const Stream& s) {
  const Tensor c = t.contiguous(s).to(Device::cpu(), s);
  s.synchronize();
  return c.to(DType::f32);
}

// ||got - want|| / ||want|| and max |got - want| / max |want|, within the nn GPU tests' bf16 bars,
// or for f32 the f32 bars where the product ran as the f32 fallback, and 2^-10 and 2^-9 where it
// ran on Hopper's FP8 tensor cores (aligned): their accumulator keeps about 14 bits of the running
// sum whether or not cuBLASLt promotes partial sums to f32 (on an H100: 7e-5 and 1.4e-4 of a
// 1e-5 and 1e-4 bar), while a wrong scale or layout is off by more than 2^-4.
void check_close(const Tensor& got, const Tensor& want, DType t, bool aligned,
                 const std::string& what) {
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  REQUIRE(g.size() == w.size());
  double num = 0.0, den = 0.0, worst = 0.0, top = 0.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double d = static_cast<double>(g[i]) - w[i];
    num += d * d;
    den += static_cast<double>(w[i]) * w[i];
    worst = std::max(worst, std::abs(d));
    top = std::max(top, std::abs(static_cast<double>(w[i])));
  }
  const double norm = std::sqrt(num / std::max(den, 1e-30)),
               rel_worst = worst / std::max(top, 1e-30);
  INFO(what << ": relative error norm " << norm << ", worst element " << rel_worst);
  const bool f32_exact = t == DType::f32 && !aligned;
  CHECK(norm < (t == DType::bf16 ? 1e-2 : f32_exact ? 1e-5 : 0x1p-10));
  CHECK(rel_worst < (t == DType::bf16 ? 0x1p-5 : f32_exact ? 1e-4 : 0x1p-9));
}

nn::Fp8TensorScale& scale_named(nn::Module& m, const std::string& name) {
  for (auto& [n, s] : m.named_fp8_scales())
    if (n == name) return *s;
  FAIL("no FP8 scale " << name);
  throw;
}

}  // namespace

TEST_CASE("gpu FP8 tp linear layers equal the CPU emulation", "[tp][fp8][gpu]") {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cuda;
  World world = init(config);
  const Stream s = Stream::create(world.device());
  std::unique_ptr<Communicator> solo = world.comm().split(world.rank(), 0, "solo");
  const DType t = GENERATE(DType::bf16, DType::f32);
  const bool aligned = GENERATE(true, false);
  const bool bias = GENERATE(false, true);
  const bool column = GENERATE(true, false);
  const nn::Fp8Scaling scaling = GENERATE(nn::Fp8Scaling::current, nn::Fp8Scaling::delayed);
  INFO(dtype_name(t) << (aligned ? " aligned" : " odd") << " bias " << bias
                     << (column ? " column" : " row") << " " << nn::fp8_scaling_name(scaling));
  const std::int64_t kB = 2, kS = aligned ? 16 : 5, d = aligned ? 32 : 12, h = aligned ? 64 : 24;
  const std::int64_t in = column ? d : h, out = column ? h : d;
  const nn::Fp8Recipe recipe{nn::Fp8Mode::hybrid, scaling, 2, 0};
  std::unique_ptr<nn::Module> mine;
  if (column) {
    mine = std::make_unique<tensor_parallel::ColumnParallelLinear>(
        *solo, in, out,
        tensor_parallel::ColumnParallelOptions{.bias = bias, .init_std = 0.5f, .fp8 = recipe});
  } else {
    mine = std::make_unique<tensor_parallel::RowParallelLinear>(
        *solo, in, out,
        tensor_parallel::RowParallelOptions{.bias = bias, .init_std = 0.5f, .fp8 = recipe});
  }
  nn::ParameterStore store(*mine, t, s, 31);
  REQUIRE(mine->named_fp8_scales().size() == 3);
  std::vector<nn::Fp8TensorScale*> scales;
  for (auto& [name, f] : mine->named_fp8_scales()) scales.push_back(f);

  // The weight and bias as the GPU's GEMMs read them: the master values in the compute dtype.
  const auto params = mine->named_parameters();
  const Tensor w = host(params.at(0).second->data(), s).to(t).to(DType::f32);
  const Tensor b = bias ? host(params.at(1).second->data(), s).to(t).to(DType::f32) : Tensor();
  const float aw = nn::fp8_amax(w, kCpu);
  float prev_ax = 0.0f, prev_ady = 0.0f;
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    // Inputs with a wide range, so FP8 rounding shows; rounded to the compute dtype.
    const Tensor x =
        nn::scale(Tensor::randn({kB, kS, in}, 40 + step), 3.0f, kCpu).to(t).to(DType::f32);
    const Tensor dy =
        nn::scale(Tensor::randn({kB, kS, out}, 50 + step), 1e-3f, kCpu).to(t).to(DType::f32);
    const float ax = nn::fp8_amax(x, kCpu), ady = nn::fp8_amax(dy, kCpu);
    // Current scaling, and delayed scaling's first step: the tensors' own amaxes; delayed
    // scaling's second step: the history's (the first step's amaxes; w's is the same).
    const bool history = scaling == nn::Fp8Scaling::delayed && step == 1;
    const auto sc = [](float a, nn::Fp8Format f) {
      return nn::fp8_scale_from_amax(a, f, 0, 1.0f, "reference");
    };
    const float sx = sc(history ? prev_ax : ax, nn::Fp8Format::e4m3);
    const float sw = sc(aw, nn::Fp8Format::e4m3);
    const float sdy = sc(history ? prev_ady : ady, nn::Fp8Format::e5m2);
    const Tensor xq = nn::fp8_round_trip(x, sx, nn::Fp8Format::e4m3, kCpu);
    const Tensor wq = nn::fp8_round_trip(w, sw, nn::Fp8Format::e4m3, kCpu);
    const Tensor dyq = nn::fp8_round_trip(dy, sdy, nn::Fp8Format::e5m2, kCpu);
    const Tensor y_want = nn::linear_forward(xq, wq, b, kCpu);
    const Tensor dx_want = nn::linear_backward_input(dyq, wq, kCpu);
    Tensor dw_want = Tensor::zeros(w.shape());
    Tensor db_want = bias ? Tensor::zeros(b.shape()) : Tensor();
    nn::linear_backward_weight(dyq, xq, dw_want, db_want, kCpu);

    store.zero_grad(s);
    nn::Context ctx(s);
    const Tensor y = mine->forward(ctx, x.to(world.device(), s).to(t, s));
    check_close(host(y, s), y_want, t, aligned, "output");
    const Tensor dx = mine->backward(ctx, dy.to(world.device(), s).to(t, s));
    check_close(host(dx, s), dx_want, t, aligned, "input gradient");
    check_close(host(params.at(0).second->grad(), s), dw_want, t, aligned, "weight gradient");
    if (bias)
      check_close(host(params.at(1).second->grad(), s), db_want, t, aligned, "bias gradient");
    // FP8 is not the plain layer.
    const std::vector<float> a = host(y, s).to_vector<float>(),
                             p = nn::linear_forward(x, w, b, kCpu).to_vector<float>();
    double off = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) off = std::max(off, std::fabs(double(a[i]) - p[i]));
    CHECK(off > 1e-3);

    tensor_parallel::fp8_end_step(scales, {solo.get()}, s);
    if (scaling == nn::Fp8Scaling::delayed) {
      CHECK(scale_named(*mine, "fp8_x").history().front() == ax);
      CHECK(scale_named(*mine, "fp8_w").history().front() == aw);
      CHECK(scale_named(*mine, "fp8_dy").history().front() == ady);
    }
    prev_ax = ax;
    prev_ady = ady;
  }
}

namespace {
// A GPU tensor's values on the host as f32 (exact for bf16), for bit-for-bit comparisons.
std::vector<float> values(const Tensor& t, const Stream& s) {
  return host(t, s).to_vector<float>();
}
}  // namespace

TEST_CASE("gpu FP8 column layers reading one x cast it once, bit for bit two casts",
          "[tp][fp8][gpu]") {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cuda;
  World world = init(config);
  const Stream s = Stream::create(world.device());
  std::unique_ptr<Communicator> solo = world.comm().split(world.rank(), 0, "solo");
  const DType t = GENERATE(DType::bf16, DType::f32);
  const bool aligned = GENERATE(true, false);
  const nn::Fp8Scaling scaling = GENERATE(nn::Fp8Scaling::current, nn::Fp8Scaling::delayed);
  INFO(dtype_name(t) << (aligned ? " aligned" : " odd") << " " << nn::fp8_scaling_name(scaling));
  // Odd sizes (the f32 fallback GEMM and the scalar casts) with biases.
  const std::int64_t kB = 2, kS = aligned ? 16 : 5, in = aligned ? 32 : 12;
  const std::int64_t out_a = aligned ? 64 : 24, out_b = aligned ? 48 : 20;
  const tensor_parallel::ColumnParallelOptions o{
      .bias = !aligned,
      .init_std = 0.5f,
      .enter_region = false,
      .fp8 = nn::Fp8Recipe{nn::Fp8Mode::hybrid, scaling, 2, 0}};
  // a1 and b1 through forward_shared_input; a2 and b2, the same weights, one forward each.
  tensor_parallel::ColumnParallelLinear a1(*solo, in, out_a, o), b1(*solo, in, out_b, o);
  tensor_parallel::ColumnParallelLinear a2(*solo, in, out_a, o), b2(*solo, in, out_b, o);
  nn::ParameterStore sa1(a1, t, s, 31), sb1(b1, t, s, 32), sa2(a2, t, s, 31), sb2(b2, t, s, 32);
  const std::vector<nn::Module*> shared{&a1, &b1}, apart{&a2, &b2};
  std::vector<nn::Fp8TensorScale*> scales1, scales2;
  for (nn::Module* m : shared)
    for (auto& [name, f] : m->named_fp8_scales()) scales1.push_back(f);
  for (nn::Module* m : apart)
    for (auto& [name, f] : m->named_fp8_scales()) scales2.push_back(f);
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    if (step == 3 && scaling == nn::Fp8Scaling::delayed) {
      // b's x history no longer a's: its delayed scale differs, so x is cast for each.
      for (nn::Module* m : {static_cast<nn::Module*>(&b1), static_cast<nn::Module*>(&b2)})
        scale_named(*m, "fp8_x").set_state({1000.0f, 0.0f}, 448.0f / 1000.0f);
    }
    const auto gpu = [&](const Tensor& v) { return v.to(world.device(), s).to(t, s); };
    const Tensor x = gpu(nn::scale(Tensor::randn({kB, kS, in}, 60 + step), 3.0f, kCpu));
    const Tensor dya = gpu(nn::scale(Tensor::randn({kB, kS, out_a}, 70 + step), 1e-3f, kCpu));
    const Tensor dyb = gpu(nn::scale(Tensor::randn({kB, kS, out_b}, 80 + step), 2e-3f, kCpu));
    for (nn::ParameterStore* st : {&sa1, &sb1, &sa2, &sb2}) st->zero_grad(s);
    nn::Context c1(s), c2(s);
    const auto [ya1, yb1] =
        tensor_parallel::ColumnParallelLinear::forward_shared_input(c1, a1, b1, x);
    const Tensor ya2 = a2.forward(c2, x), yb2 = b2.forward(c2, x);
    CHECK(values(ya1, s) == values(ya2, s));
    CHECK(values(yb1, s) == values(yb2, s));
    CHECK(values(b1.backward(c1, dyb), s) == values(b2.backward(c2, dyb), s));
    CHECK(values(a1.backward(c1, dya), s) == values(a2.backward(c2, dya), s));
    for (std::size_t m = 0; m < 2; ++m) {
      const auto p1 = shared[m]->named_parameters(), p2 = apart[m]->named_parameters();
      REQUIRE(p1.size() == p2.size());
      for (std::size_t i = 0; i < p1.size(); ++i) {
        INFO(p1[i].first);
        CHECK(values(p1[i].second->grad(), s) == values(p2[i].second->grad(), s));
      }
    }
    tensor_parallel::fp8_end_step(scales1, {solo.get()}, s);
    tensor_parallel::fp8_end_step(scales2, {solo.get()}, s);
    for (std::size_t i = 0; i < scales1.size(); ++i) {
      INFO(scales1[i]->what());
      CHECK(scales1[i]->history() == scales2[i]->history());
      CHECK(scales1[i]->delayed_scale() == scales2[i]->delayed_scale());
    }
  }
}
