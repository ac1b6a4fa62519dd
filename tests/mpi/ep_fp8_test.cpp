// The MoE layer's FP8 experts (quintet/parallel/expert/experts.hpp, "hybrid": x and W in E4M3, dy
// in E5M2, per-tensor scales reduced over the stage) under mpirun at 2 and 4 ranks, dp 1: tp =
// every rank with ep = every rank (etp 1, with and without sequence parallelism and a shared
// expert) and with etp = tp (ep 1), GELU and SwiGLU, current and delayed scaling over two steps:
// the output, the input gradient and every parameter gradient equal one rank's FP8 layer within
// the f32 tolerance (the FP8 emulation is deterministic and every amax is the whole tensor's),
// the delayed histories equal one rank's after each step (within f32 rounding), and FP8 is not
// f32. At dp 2, ep 2
// equals ep 1 (the amaxes span the replicas either way). Bad FP8 settings are refused before any
// communication.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "quintet/nn/context.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/tensor_parallel/fp8.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace quintet::expert;
using namespace tp_test;

namespace {

const Stream kCpu;
constexpr std::int64_t kB = 2, kS = 8, kD = 16, kF = 12;
constexpr std::uint64_t kSeed = 91;

MoEOptions options(std::int64_t experts, nn::Activation act, nn::Fp8Scaling scaling) {
  MoEOptions o;
  o.router =
      RouterConfig{.experts = experts, .top_k = 2, .aux_loss_coeff = 0.01f, .z_loss_coeff = 0.001f};
  o.router.idle_warning_steps = 0;
  o.expert_ffn = kF;
  o.activation = act;
  o.init_std = 0.5f;  // weights wide enough that E4M3 rounding shows
  o.proj_init_std = 0.5f;
  o.fp8 = nn::Fp8Recipe{nn::Fp8Mode::hybrid, scaling, 2, 0};
  return o;
}

std::vector<nn::Fp8TensorScale*> scales_of(const nn::Module& m) {
  std::vector<nn::Fp8TensorScale*> out;
  for (auto& [name, s] : m.named_fp8_scales()) out.push_back(s);
  return out;
}

// The largest |a - b| over two tensors of one shape.
double max_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(DType::f64).to_vector<double>();
  const std::vector<double> y = b.to(DType::f64).to_vector<double>();
  double d = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(x[i] - y[i]));
  return d;
}

struct Case {
  std::string name;
  ParallelConfig layout;  // dp 1: tp = every rank
  MoEOptions options;
};

void run_case(World& world, const Case& c) {
  INFO("case " << c.name << " at " << world.size() << " ranks, "
               << nn::fp8_scaling_name(c.options.fp8.scaling) << " scaling");
  Mesh mesh(Layout(c.layout, world.size()), world.comm());
  REQUIRE(mesh.size(Axis::dp) == 1);
  Communicator& tp = mesh.comm(Axis::tp);
  Communicator& stage = mesh.comm(Axis::tp_dp_cp);
  const bool sp = c.options.sequence_parallel;
  MoELayer mine({&tp, nullptr, &mesh.comm(Axis::ep), &mesh.comm(Axis::etp), &stage}, kD, c.options);
  nn::ParameterStore my_store(mine, DType::f32, kCpu, kSeed);
  const std::unique_ptr<Communicator> self = world.comm().split(world.rank(), 0, "self");
  MoEOptions one = c.options;
  one.sequence_parallel = false;
  MoELayer ref({self.get(), nullptr, nullptr, nullptr, self.get()}, kD, one);
  nn::ParameterStore ref_store(ref, DType::f32, kCpu, kSeed);
  MoEOptions plain = one;  // the same layer in f32
  plain.fp8 = {};
  MoELayer f32({self.get()}, kD, plain);
  nn::ParameterStore f32_store(f32, DType::f32, kCpu, kSeed);
  std::size_t experts_roles = 0;
  for (const auto& [name, s] : mine.named_fp8_scales())
    experts_roles += name.rfind("experts.", 0) == 0;
  REQUIRE(experts_roles == (c.options.activation == nn::Activation::swiglu ? 8u : 6u));
  const auto local = [&](const Tensor& full) {
    return sp ? chunk(full, 1, tp.rank(), tp.size()) : full;
  };

  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    const Tensor x = nn::scale(Tensor::randn({kB, kS, kD}, 100 + step), 2.0f, kCpu);
    const Tensor dy = nn::scale(Tensor::randn({kB, kS, kD}, 200 + step), 1e-3f, kCpu);
    for (nn::ParameterStore* s : {&my_store, &ref_store, &f32_store}) s->zero_grad(kCpu);
    nn::Context rctx(kCpu), fctx(kCpu), ctx(kCpu);
    const Tensor y_ref = ref.forward(rctx, x);
    const Tensor dx_ref = ref.backward(rctx, dy);
    const Tensor y_f32 = f32.forward(fctx, x);
    const Tensor y = mine.forward(ctx, local(x));
    const Tensor dx = mine.backward(ctx, local(dy));
    const auto grads = data_parallel_grads(mine, mesh);
    mine.finish_step(stage);
    ref.finish_step(*self);
    f32.finish_step(*self);
    tensor_parallel::fp8_end_step(scales_of(mine), {&stage}, kCpu);
    tensor_parallel::fp8_end_step(scales_of(ref), {self.get()}, kCpu);
    agreed(world.comm(), [&] {
      require_close(y, local(y_ref), "output");
      require_close(dx, local(dx_ref), "input gradient");
      for (const auto& [name, g] : grads) {
        const nn::Parameter& p = param_named(mine, name);
        require_close(g, shard_of(param_named(ref, name).grad(), p), name + " gradient");
      }
      CHECK(max_diff(y_ref, y_f32) > 1e-3);  // FP8 is not f32
      const auto got = mine.named_fp8_scales(), want = ref.named_fp8_scales();
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("FP8 scale " << got[i].first);
        CHECK(got[i].first == want[i].first);
        // Within f32's rounding: an amax of a GEMM's output (h, the gradients) is one rank's up
        // to the order of a sum; the inputs' (x, w) are exact.
        const std::vector<float>& h = got[i].second->history();
        require_close(
            Tensor::from_vector(h, {static_cast<std::int64_t>(h.size())}),
            Tensor::from_vector(want[i].second->history(), {static_cast<std::int64_t>(h.size())}),
            "amax history", 0.0, 1e-5);
        CHECK(got[i].second->delayed_scale() ==
              Approx(want[i].second->delayed_scale()).epsilon(1e-5));
      }
    });
  }
}

}  // namespace

TEST_CASE("ep: FP8 experts at every dp-1 layout equal one rank's FP8 layer", "[ep][fp8]") {
  World world = cpu_world();
  const int n = world.size();
  const nn::Fp8Scaling scaling = GENERATE(nn::Fp8Scaling::current, nn::Fp8Scaling::delayed);
  std::vector<Case> cases;
  cases.push_back({"tp = ep = world, etp 1, GELU", ParallelConfig{.tp = n, .ep = n, .etp = 1},
                   options(2 * n, nn::Activation::gelu, scaling)});
  {
    MoEOptions o = options(2 * n, nn::Activation::swiglu, scaling);
    o.sequence_parallel = true;
    o.shared_experts = 1;
    cases.push_back({"tp = ep = world + sp, etp 1, SwiGLU, shared expert",
                     ParallelConfig{.tp = n, .ep = n, .etp = 1}, o});
  }
  cases.push_back({"tp = etp = world, ep 1, SwiGLU", ParallelConfig{.tp = n, .ep = 1},
                   options(4, nn::Activation::swiglu, scaling)});
  for (const Case& c : cases) run_case(world, c);
}

TEST_CASE("ep: FP8 experts at dp 2 are the same with ep 2 and ep 1", "[ep][fp8]") {
  World world = cpu_world();
  if (world.size() != 2) return;  // the two-rank layouts
  Mesh spread(Layout(ParallelConfig{.ep = 2}, 2), world.comm());
  Mesh whole(Layout(ParallelConfig{}, 2), world.comm());
  const MoEOptions o = options(4, nn::Activation::swiglu, nn::Fp8Scaling::current);
  const auto groups = [](Mesh& m) {
    return MoEGroups{&m.comm(Axis::tp), nullptr, &m.comm(Axis::ep), &m.comm(Axis::etp),
                     &m.comm(Axis::tp_dp_cp)};
  };
  MoELayer a(groups(spread), kD, o), b(groups(whole), kD, o);
  nn::ParameterStore sa(a, DType::f32, kCpu, kSeed), sb(b, DType::f32, kCpu, kSeed);
  // Each replica its own tokens.
  const Tensor x = nn::scale(Tensor::randn({kB, kS, kD}, 300 + world.rank()), 2.0f, kCpu);
  const Tensor dy = nn::scale(Tensor::randn({kB, kS, kD}, 400 + world.rank()), 1e-3f, kCpu);
  nn::Context ca(kCpu), cb(kCpu);
  const Tensor ya = a.forward(ca, x), yb = b.forward(cb, x);
  const Tensor dxa = a.backward(ca, dy), dxb = b.backward(cb, dy);
  std::vector<std::pair<Tensor, Tensor>> grads;
  for (const auto& [name, p] : a.named_parameters()) {
    grads.emplace_back(data_parallel_grad(*p, spread),
                       shard_of(data_parallel_grad(param_named(b, name), whole), *p));
  }
  agreed(world.comm(), [&] {
    require_close(ya, yb, "output");
    require_close(dxa, dxb, "input gradient");
    for (const auto& [ga, gb] : grads) require_close(ga, gb, "gradient");
  });
}

TEST_CASE("ep: bad FP8 MoE settings are refused before any communication", "[ep][fp8]") {
  World world = cpu_world();
  const int n = world.size();
  Mesh mesh(Layout(ParallelConfig{.ep = n}, n), world.comm());
  const MoEGroups g{&mesh.comm(Axis::tp), nullptr, &mesh.comm(Axis::ep), &mesh.comm(Axis::etp)};
  const MoEOptions o = options(2 * n, nn::Activation::gelu, nn::Fp8Scaling::delayed);
  // No stage communicator to reduce the amaxes over.
  REQUIRE_THROWS_QUINTET(MoELayer(g, kD, o), InvalidArgument, "needs the stage communicator");
  MoEOptions no_history = o;
  no_history.fp8.amax_history = 0;
  MoEGroups with_stage = g;
  with_stage.stage = &mesh.comm(Axis::tp_dp_cp);
  REQUIRE_THROWS_QUINTET(MoELayer(with_stage, kD, no_history), InvalidArgument, "amax_history = 0");
}
