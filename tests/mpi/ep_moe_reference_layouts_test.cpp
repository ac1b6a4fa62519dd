// The MoE layer (quintet/parallel/expert/moe_layer.hpp: its Router, TokenDispatcher and Experts)
// under mpirun at ep 1..4 (3 included), etp 2, and tp 2 with and without sequence parallelism,
// against the independent per-token f64 reference (support/moe_reference.hpp) and its finite
// differences, the layer in f64: each rank's output and input gradient equal the reference's on
// its data-parallel shard, and every parameter gradient as data parallelism sees it (summed over
// edp, or over dp) equals the sum of the shards' reference gradients. Dropless and with capacity
// dropping (each rank routes its own shard, so the reference applies the capacity per shard),
// in one chunk and in overlapped chunks, and skewed routing: a balancing bias sends every token
// to experts 0 and 1, so the other experts, and with ep > 1 every other ep rank, receive none.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "quintet/nn/context.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/mesh.hpp"
#include "support/moe_reference_check.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace quintet::expert;
using tp_test::agreed;
using tp_test::chunk;
using tp_test::cpu_world;
using tp_test::data_parallel_grad;
using tp_test::shard_of;

namespace {

const Stream kCpu;
constexpr std::int64_t kB = 2, kS = 4, kD = 4, kF = 4;
constexpr double kTol = 1e-5;
constexpr float kLossScale = 0.5f;

struct Case {
  std::string name;
  ParallelConfig layout;
  moe_ref::Config config;
  bool sequence_parallel = false;
  int chunks = 1;
  bool skew = false;
};

moe_ref::Config config(std::int64_t experts, bool swiglu, double capacity) {
  moe_ref::Config c;
  c.experts = experts;
  c.top_k = 2;
  c.dim = kD;
  c.ffn = kF;
  c.swiglu = swiglu;
  c.capacity_factor = capacity;
  c.aux_coeff = 0.3;
  c.z_coeff = 0.05;
  return c;
}

void run_case(World& world, const Case& c) {
  INFO("case " << c.name << " at " << world.size() << " ranks");
  const moe_ref::Config& rc = c.config;
  Mesh mesh(Layout(c.layout, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  const int shards = mesh.size(Axis::dp), shard = mesh.rank(Axis::dp);
  MoEOptions options = moe_ref::options_of(rc);
  options.sequence_parallel = c.sequence_parallel;
  options.overlap_chunks = c.chunks;
  moe_ref::Params p;
  if (c.skew) {
    p.bias.assign(static_cast<std::size_t>(rc.experts), 0.0);
    p.bias[0] = p.bias[1] = 100.0;
    options.router.bias_rate = 1e-3f;  // the layer routes with its bias only when it balances
  }
  MoELayer layer({&tp, nullptr, &mesh.comm(Axis::ep), &mesh.comm(Axis::etp)}, kD, options);
  nn::ParameterStore store(layer, DType::f64, kCpu, 5);
  if (c.skew) layer.set_balance_bias(std::vector<float>(p.bias.begin(), p.bias.end()));

  // Every parameter a fresh draw of its whole shape, the same on every rank; the layer holds its
  // shard.
  const std::map<std::string, std::vector<double>*> slots = {{"router.weight", &p.router},
                                                             {"experts.fc.weight", &p.fc},
                                                             {"experts.up.weight", &p.up},
                                                             {"experts.proj.weight", &p.proj}};
  std::uint64_t seed = 1000;
  std::vector<std::pair<nn::Parameter*, std::vector<double>*>> params;
  for (const auto& [name, param] : layer.named_parameters()) {
    INFO("parameter " << name);
    REQUIRE(slots.count(name) == 1);
    const auto& a = param->attributes();
    const Tensor full = moe_ref::draw(a.full_shape.empty() ? param->shape() : a.full_shape, seed++,
                                      DType::f64, 0.5);
    param->data().copy_(shard_of(full, *param));
    *slots.at(name) = full.to_vector<double>();
    params.emplace_back(param, slots.at(name));
  }
  // Shard r's input and output gradient; with sequence parallelism a tp rank holds its part of
  // the sequence.
  const auto x_of = [](int r) { return moe_ref::draw({kB, kS, kD}, 100 + r, DType::f64, 1.0); };
  const auto dy_of = [](int r) { return moe_ref::draw({kB, kS, kD}, 200 + r, DType::f64, 1.0); };
  const auto local = [&](const Tensor& full) {
    return c.sequence_parallel ? chunk(full, 1, tp.rank(), tp.size()) : full;
  };

  nn::Context ctx(kCpu);
  ctx.set_loss_scale(kLossScale);
  const Tensor y = layer.forward(ctx, local(x_of(shard)));
  const Tensor dx = layer.backward(ctx, local(dy_of(shard)));
  std::vector<Tensor> grads;
  for (const auto& [param, values] : params) grads.push_back(data_parallel_grad(*param, mesh));
  const MoEStats stats = layer.finish_step(mesh.comm(Axis::tp_dp_cp));

  agreed(world.comm(), [&] {
    // Each shard through the reference: this rank's own output and input gradient, and every
    // shard's parameter gradients summed.
    std::vector<std::vector<double>> want_grads(params.size());
    double dropped = 0.0;
    std::vector<double> load(static_cast<std::size_t>(rc.experts), 0.0);
    for (int r = 0; r < shards; ++r) {
      INFO("shard " << r);
      std::vector<double> xv = x_of(r).to_vector<double>();
      const std::vector<double> dyv = dy_of(r).to_vector<double>();
      const moe_ref::Result want = moe_ref::forward(rc, p, xv, kB);
      if (c.skew) {
        for (std::int64_t e = 2; e < rc.experts; ++e) REQUIRE(want.load[e] == 0);
      }
      dropped += static_cast<double>(want.dropped);
      for (std::size_t e = 0; e < load.size(); ++e) load[e] += static_cast<double>(want.load[e]);
      const moe_ref::Loss loss{rc, p, xv, dyv, kB, kLossScale};
      if (r == shard) {
        const auto own = [&](const std::vector<double>& v) {
          return local(Tensor::from_vector(v, {kB, kS, kD})).to_vector<double>();
        };
        moe_ref::require_close(y, own(want.y), kTol, "output");
        moe_ref::require_close(dx, own(loss.grad(xv)), kTol, "input gradient");
      }
      for (std::size_t i = 0; i < params.size(); ++i) {
        const std::vector<double> g = loss.grad(*params[i].second);
        want_grads[i].resize(g.size(), 0.0);
        for (std::size_t j = 0; j < g.size(); ++j) want_grads[i][j] += g[j];
      }
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      nn::Parameter& param = *params[i].first;
      const Tensor full =
          Tensor::from_vector(want_grads[i], {static_cast<std::int64_t>(want_grads[i].size())});
      moe_ref::require_close(grads[i], shard_of(full, param).to_vector<double>(), kTol,
                             "gradient of " + param.name());
    }
    CHECK(stats.load == load);
    CHECK(stats.dropped == dropped);
    CHECK(stats.assignments == static_cast<double>(shards * kB * kS * rc.top_k));
    if (rc.capacity_factor > 0.0) {
      CHECK(dropped > 0);  // the case exercises the capacity
    } else {
      CHECK(dropped == 0);
    }
  });
}

}  // namespace

TEST_CASE("ep: the MoE layer at every layout equals the per-token f64 reference", "[ep]") {
  World world = cpu_world();
  const int n = world.size();
  std::vector<Case> cases;
  cases.push_back({"ep = world, GELU, dropless", ParallelConfig{.ep = n}, config(2 * n, false, 0)});
  cases.push_back({"ep = world, SwiGLU, capacity 0.75, 3 overlapped chunks",
                   ParallelConfig{.ep = n}, config(2 * n, true, 0.75), false, 3});
  cases.push_back({"ep = world, skewed: every token on experts 0 and 1", ParallelConfig{.ep = n},
                   config(2 * n, false, 0), false, 1, true});
  if (n % 2 == 0) {
    cases.push_back({"etp 2 x ep world/2, SwiGLU, capacity 0.75, 2 chunks",
                     ParallelConfig{.ep = n / 2, .etp = 2}, config(n, true, 0.75), false, 2});
    cases.push_back({"tp 2 = etp 2 x ep world/2, capacity 0.75",
                     ParallelConfig{.tp = 2, .ep = n / 2}, config(n, false, 0.75)});
    cases.push_back({"tp 2 + sp, etp 1 x ep world, skewed",
                     ParallelConfig{.tp = 2, .ep = n, .etp = 1}, config(2 * n, true, 0), true, 1,
                     true});
  }
  for (const Case& c : cases) run_case(world, c);
}
