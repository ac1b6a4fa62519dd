// The MoE layer under mpirun (quintet/parallel/expert/moe_layer.hpp), at ep = 1..4 (every rank of
// the job), with etp 2 and with tp 2 (with and without sequence parallelism): the outputs, the
// input gradients and every parameter gradient equal a one-rank MoE layer of the same seed run on
// each data-parallel shard in turn, within 1e-5 relative (f32; tp_support.hpp's tolerance). Each
// rank routes its own shard, so with a capacity factor the reference applies the same capacity
// per shard. Gradients are compared as data parallelism sees them: expert gradients summed over
// edp, dense ones over dp (and over tp when partial). Also: skewed routing where every token goes
// to the first ep rank (the others receive none; its idle experts are warned about by the stage's
// first rank alone), the step statistics, and bad configurations refused before any
// communication.
#include <memory>
#include <string>
#include <vector>

#include "quintet/nn/context.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/mesh.hpp"
#include "support/stderr_capture.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace quintet::expert;
using namespace tp_test;

namespace {

const Stream kCpu;
constexpr std::int64_t kB = 2, kS = 8, kD = 16, kF = 12;
constexpr std::uint64_t kSeed = 77;

struct Case {
  std::string name;
  ParallelConfig layout;
  MoEOptions options;
  bool skew = false;  // the balancing bias sends every token to experts 0 and 1
};

void run_case(World& world, const Case& c) {
  INFO("case " << c.name << " at " << world.size() << " ranks");
  Mesh mesh(Layout(c.layout, world.size()), world.comm());
  const bool sp = c.options.sequence_parallel;
  const int shards = mesh.size(Axis::dp), shard = mesh.rank(Axis::dp);
  Communicator& tp = mesh.comm(Axis::tp);
  MoELayer mine({&tp, nullptr, &mesh.comm(Axis::ep), &mesh.comm(Axis::etp)}, kD, c.options);
  nn::ParameterStore my_store(mine, DType::f32, kCpu, kSeed);
  const std::unique_ptr<Communicator> self = world.comm().split(world.rank(), 0, "self");
  MoEOptions unchunked = c.options;  // the reference exchanges everything at once
  unchunked.overlap_chunks = 1;
  unchunked.router.idle_warning_steps = 0;  // its ranks are each a stage of one
  MoELayer ref({self.get(), nullptr, nullptr, nullptr}, kD, unchunked);
  nn::ParameterStore ref_store(ref, DType::f32, kCpu, kSeed);
  if (c.skew) {
    std::vector<float> bias(static_cast<std::size_t>(c.options.router.experts), 0.0f);
    bias[0] = bias[1] = 100.0f;
    mine.set_balance_bias(bias);
    ref.set_balance_bias(bias);
  }
  const auto draw = [](std::uint64_t seed) { return Tensor::randn({kB, kS, kD}, seed); };
  const auto local = [&](const Tensor& full) {
    return sp ? chunk(full, 1, tp.rank(), tp.size()) : full;
  };

  // The reference: each data-parallel shard through the one-rank layer in turn.
  std::vector<Tensor> y_ref, dx_ref;
  for (int r = 0; r < shards; ++r) {
    nn::Context ctx(kCpu);
    y_ref.push_back(ref.forward(ctx, draw(100 + r)));
    dx_ref.push_back(ref.backward(ctx, draw(200 + r)));
  }
  nn::Context ctx(kCpu);
  const Tensor y = mine.forward(ctx, local(draw(100 + shard)));
  const Tensor dx = mine.backward(ctx, local(draw(200 + shard)));
  const auto grads = data_parallel_grads(mine, mesh);
  StderrCapture capture;
  const MoEStats stats = mine.finish_step(mesh.comm(Axis::tp_dp_cp));
  const bool warned =
      capture.take().find("received no token in the last 1 steps") != std::string::npos;
  const MoEStats want = ref.finish_step(*self);
  agreed(world.comm(), [&] {
    require_close(y, local(y_ref[shard]), "output");
    require_close(dx, local(dx_ref[shard]), "input gradient");
    for (const auto& [name, g] : grads) {
      INFO("gradient of " << name);
      const nn::Parameter& p = param_named(mine, name);
      const nn::Parameter& q = param_named(ref, name);
      require_close(g, shard_of(q.grad(), p), name);
      require_close(p.data(), shard_of(q.data(), p), name + " (value)", 0.0, 0.0);
    }
    CHECK(stats.load == want.load);
    CHECK(stats.assignments == want.assignments);
    CHECK(stats.dropped == want.dropped);
    CHECK(stats.aux_loss == Approx(want.aux_loss).epsilon(1e-6));
    CHECK(stats.z_loss == Approx(want.z_loss).epsilon(1e-6));
    if (c.skew) CHECK(stats.load[0] == stats.assignments / 2);
    // Experts left idle (the skewed case's 2..E-1 when E > 2, after one step) are warned about
    // by the stage's first rank alone.
    CHECK(warned ==
          (c.skew && c.options.router.experts > 2 && mesh.comm(Axis::tp_dp_cp).rank() == 0));
    if (c.options.router.capacity_factor > 0.0f) CHECK(stats.dropped > 0);
  });
}

MoEOptions options(std::int64_t experts, nn::Activation act = nn::Activation::gelu) {
  MoEOptions o;
  o.router =
      RouterConfig{.experts = experts, .top_k = 2, .aux_loss_coeff = 0.01f, .z_loss_coeff = 0.001f};
  o.expert_ffn = kF;
  o.activation = act;
  return o;
}

}  // namespace

TEST_CASE("ep: the MoE layer equals one rank at every expert-parallel layout", "[ep]") {
  World world = cpu_world();
  const int n = world.size();
  std::vector<Case> cases;
  cases.push_back({"ep = world, GELU, softmax", ParallelConfig{.ep = n}, options(2 * n)});
  {
    MoEOptions o = options(2 * n, nn::Activation::swiglu);
    o.router.score = RouterScore::sigmoid;
    o.shared_experts = 1;
    cases.push_back({"ep = world, SwiGLU, sigmoid, shared expert", ParallelConfig{.ep = n}, o});
  }
  {
    MoEOptions o = options(2 * n);
    o.router.capacity_factor = 0.5f;  // room for half the tokens: some are dropped
    o.router.top_k = 1;
    o.router.renormalize = false;
    cases.push_back({"ep = world, capacity 0.5 (drops)", ParallelConfig{.ep = n}, o});
  }
  {
    MoEOptions o = options(2 * n);
    o.router.bias_rate = 1e-3f;
    o.router.idle_warning_steps = 1;
    cases.push_back(
        {"ep = world, skewed: every token on ep rank 0", ParallelConfig{.ep = n}, o, true});
  }
  {
    MoEOptions o = options(2 * n, nn::Activation::swiglu);
    o.overlap_chunks = 3;
    cases.push_back({"ep = world, 3 overlapped chunks", ParallelConfig{.ep = n}, o});
    MoEOptions tiny = options(2 * n);
    tiny.overlap_chunks = 20;  // more chunks than the 16 tokens: some are empty
    tiny.router.capacity_factor = 0.5f;
    cases.push_back({"ep = world, 20 chunks (some empty), drops", ParallelConfig{.ep = n}, tiny});
  }
  if (n % 2 == 0) {
    {
      MoEOptions o = options(n, nn::Activation::swiglu);
      o.overlap_chunks = 2;
      cases.push_back(
          {"etp 2 x ep world/2, 2 overlapped chunks", ParallelConfig{.ep = n / 2, .etp = 2}, o});
    }
    cases.push_back({"etp 2 x ep world/2", ParallelConfig{.ep = n / 2, .etp = 2},
                     options(n, nn::Activation::swiglu)});
    {
      MoEOptions o = options(n);
      o.shared_experts = 1;
      cases.push_back(
          {"tp 2 = etp 2 x ep world/2, shared expert", ParallelConfig{.tp = 2, .ep = n / 2}, o});
    }
    {
      MoEOptions o = options(2 * n, nn::Activation::swiglu);
      o.sequence_parallel = true;
      o.shared_experts = 1;
      cases.push_back(
          {"tp 2 + sp, etp 1 x ep world", ParallelConfig{.tp = 2, .ep = n, .etp = 1}, o});
    }
    {
      MoEOptions o = options(n);
      o.sequence_parallel = true;
      cases.push_back({"tp 2 + sp = etp 2 x ep world/2", ParallelConfig{.tp = 2, .ep = n / 2}, o});
    }
  }
  for (const Case& c : cases) run_case(world, c);
}

TEST_CASE("ep: bad MoE configurations are refused before any communication", "[ep]") {
  World world = cpu_world();
  const int n = world.size();
  Mesh mesh(Layout(ParallelConfig{.ep = n}, n), world.comm());
  const MoEGroups g{&mesh.comm(Axis::tp), nullptr, &mesh.comm(Axis::ep), &mesh.comm(Axis::etp)};
  if (n > 1) {
    REQUIRE_THROWS_QUINTET(MoELayer(g, kD, options(2 * n + 1)), InvalidArgument,
                           "not divisible by the expert-parallel size");
  }
  MoEOptions k_too_big = options(2);
  k_too_big.router.top_k = 3;
  REQUIRE_THROWS_QUINTET(MoELayer(MoEGroups{g.tp}, kD, k_too_big), InvalidArgument,
                         "more than the 2 experts");
  MoEOptions no_width = options(2);
  no_width.expert_ffn = 0;
  REQUIRE_THROWS_QUINTET(MoELayer(MoEGroups{g.tp}, kD, no_width), InvalidArgument, "expert_ffn");
  REQUIRE_THROWS_QUINTET(MoELayer(MoEGroups{}, kD, options(2)), InvalidArgument,
                         "no tensor-parallel communicator");
  MoEOptions no_chunks = options(2);
  no_chunks.overlap_chunks = 0;
  REQUIRE_THROWS_QUINTET(MoELayer(MoEGroups{g.tp}, kD, no_chunks), InvalidArgument,
                         "overlap_chunks = 0");
  if (n % 2 == 0) {
    Mesh m2(Layout(ParallelConfig{.ep = n / 2, .etp = 2}, n), world.comm());
    MoEOptions odd = options(n);
    odd.expert_ffn = 7;
    REQUIRE_THROWS_QUINTET(
        MoELayer(MoEGroups{&m2.comm(Axis::tp), nullptr, &m2.comm(Axis::ep), &m2.comm(Axis::etp)},
                 kD, odd),
        InvalidArgument, "not divisible by the expert-tensor-parallel size");
    // Without sequence parallelism the tp ranks split the tokens: 3 x 3 do not divide by 2.
    Mesh m3(Layout(ParallelConfig{.tp = 2}, n), world.comm());
    MoELayer layer({&m3.comm(Axis::tp), nullptr, &m3.comm(Axis::ep), &m3.comm(Axis::etp)}, kD,
                   options(2));
    nn::ParameterStore store(layer, DType::f32, kCpu, kSeed);
    nn::Context ctx(kCpu);
    REQUIRE_THROWS_QUINTET(layer.forward(ctx, Tensor::randn({3, 3, kD}, 1)), InvalidArgument,
                           "do not divide");
  }
}

TEST_CASE("ep: many layers' step counters in one all-reduce equal each layer's own", "[ep]") {
  World world = cpu_world();
  const int n = world.size();
  Mesh mesh(Layout(ParallelConfig{.ep = n}, n), world.comm());
  Communicator& stage = mesh.comm(Axis::tp_dp_cp);
  const MoEGroups g{&mesh.comm(Axis::tp), nullptr, &mesh.comm(Axis::ep), &mesh.comm(Axis::etp)};
  // Two layers of different widths (so each one's counters sit at another offset), balanced by
  // the bias, each twice: one pair finished together, the other one layer at a time.
  std::vector<MoEOptions> opts = {options(2 * n), options(3 * n, nn::Activation::swiglu)};
  for (MoEOptions& o : opts) o.router.bias_rate = 0.01f;
  std::vector<std::unique_ptr<MoELayer>> together, alone;
  std::vector<std::unique_ptr<nn::ParameterStore>> stores;
  for (auto* set : {&together, &alone}) {
    for (std::size_t i = 0; i < opts.size(); ++i) {
      set->push_back(std::make_unique<MoELayer>(g, kD, opts[i]));
      stores.push_back(
          std::make_unique<nn::ParameterStore>(*set->back(), DType::f32, kCpu, kSeed + i));
      for (int mb = 0; mb < 2; ++mb) {  // two microbatches, this rank's own tokens
        nn::Context ctx(kCpu);
        set->back()->forward(ctx, Tensor::randn({kB, kS, kD}, 300 + 10 * world.rank() + mb));
      }
    }
  }
  const std::vector<MoELayer*> layers = {together[0].get(), together[1].get()};
  const Tensor counters = reduce_step_counters(layers, stage).summed.to(Device::cpu());
  // A wrong tensor is refused before any layer changes.
  REQUIRE_THROWS_QUINTET(finish_steps(layers, counters.narrow(0, 0, 3).contiguous(), stage),
                         InvalidArgument, "want the");
  const std::vector<MoEStats> got = finish_steps(layers, counters, stage);
  REQUIRE(got.size() == 2);
  for (std::size_t i = 0; i < opts.size(); ++i) {
    INFO("layer " << i);
    const MoEStats want = alone[i]->finish_step(stage);
    CHECK(got[i].load == want.load);
    CHECK(got[i].assignments == want.assignments);
    CHECK(got[i].assignments > 0);
    CHECK(got[i].dropped == want.dropped);
    CHECK(got[i].aux_loss == want.aux_loss);
    CHECK(got[i].z_loss == want.z_loss);
    CHECK(got[i].aux_loss > 0);
    CHECK(together[i]->balance_bias().to_vector<float>() ==
          alone[i]->balance_bias().to_vector<float>());
  }
  // The counters start again from zero: a step without forwards counts nothing.
  const std::vector<MoEStats> empty =
      finish_steps(layers, reduce_step_counters(layers, stage).summed.to(Device::cpu()), stage);
  CHECK(empty[0].assignments == 0);
  CHECK(empty[1].aux_loss == 0);
}
