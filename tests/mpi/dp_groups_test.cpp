// Gradient groups of DataParallel under mpirun, for several layouts (tp, cp, ep, pp > 1): dense
// gradients are averaged over dp-cp, expert gradients summed over edp and divided by |dp-cp| (the
// dense replicas whose tokens they saw), sequence-parallel norm gradients
// summed over tp and averaged over dp-cp — checked element by element (ZeRO stage 0: the whole
// gradient; stages 1, 2: the owned shard) against values computed from the Layout's groups. The
// optimizer's global norm equals the norm over the distinct parameters of the whole job, counting
// replicated ones once. Bad inputs throw before any communication.
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/data_parallel/distributed_optimizer.hpp"
#include "support/catch.hpp"
#include "support/nn_adamw.hpp"

using namespace quintet;

namespace {

const Stream kCpu;

World cpu_world() {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;
  config.timeout_s = 60;
  return init(config);
}

enum Kind { kDense, kTpShard, kNorm, kExpert, kExpertShard, kKinds };

// Parameters of every kind (sizes chosen so that no group size divides every bucket).
class Probe : public nn::Module {
 public:
  explicit Probe(bool bad_expert = false) {
    nn::ParameterAttributes tp_shard;
    tp_shard.shard_dim = 0, tp_shard.shard_axis = Axis::tp;
    nn::ParameterAttributes norm;
    norm.reduce_over_tp = true, norm.weight_decay = false;
    nn::ParameterAttributes expert;
    expert.is_expert = true, expert.reduce_over_tp = bad_expert;
    nn::ParameterAttributes expert_shard = expert;
    expert_shard.shard_dim = 0, expert_shard.shard_axis = Axis::etp;
    add_parameter("dense", {37}, nn::ParameterInit::normal(1.0f));
    add_parameter("tp_shard", {11}, nn::ParameterInit::normal(1.0f), tp_shard);
    add_parameter("norm", {70}, nn::ParameterInit::ones(), norm);
    add_parameter("expert", {29}, nn::ParameterInit::normal(1.0f), expert);
    add_parameter("expert_shard", {13}, nn::ParameterInit::normal(1.0f), expert_shard);
  }
  Tensor forward(nn::Context&, const Tensor& x) override { return x; }
  Tensor backward(nn::Context&, const Tensor& dy) override { return dy; }
};

Kind kind_of(const std::string& name) {
  static const std::map<std::string, Kind> kinds = {{"dense", kDense},
                                                    {"tp_shard", kTpShard},
                                                    {"norm", kNorm},
                                                    {"expert", kExpert},
                                                    {"expert_shard", kExpertShard}};
  return kinds.at(name);
}

// The unreduced gradient global rank q contributes. Copies that must be identical in a real model
// (a weight replicated over tp has the same gradient on every tp rank; over etp likewise) get
// the same values, drawn from the first rank of that group.
double local_grad(const Layout& layout, int q, Kind k, std::int64_t i) {
  int source = q;
  if (k == kDense) source = layout.group_of(Axis::tp, q)[0];
  if (k == kExpert) source = layout.group_of(Axis::etp, q)[0];
  return std::sin(0.7 * source + 1.3 * static_cast<int>(k) + 0.11 * static_cast<double>(i)) +
         0.05 * source;
}

// The reduced gradient rank q should hold.
double reduced_grad(const Layout& layout, int q, Kind k, std::int64_t i) {
  const bool expert = k == kExpert || k == kExpertShard;
  const bool over_tp = k == kNorm && layout.config().tp > 1;
  const Axis axis = expert ? Axis::edp : over_tp ? Axis::tp_dp_cp : Axis::dp_cp;
  double sum = 0.0;
  for (int g : layout.group_of(axis, q)) sum += local_grad(layout, g, k, i);
  // Every kind is a mean over the dense replicas (dp x cp): an expert's copies hold sums over the
  // tokens that every replica of their ep group sent them.
  return sum / static_cast<double>(layout.group_of(Axis::dp_cp, q).size());
}

// The norm over the distinct copies of every parameter in the job.
double expected_norm(const Layout& layout, const std::map<Kind, std::int64_t>& sizes) {
  double sq = 0.0;
  for (const auto& [k, n] : sizes) {
    std::set<std::tuple<int, int, int>> seen;  // the coordinates along which copies differ
    for (int q = 0; q < layout.world(); ++q) {
      const Coordinates c = layout.coordinates(q);
      std::tuple<int, int, int> key{c.pp, 0, 0};
      if (k == kTpShard) key = {c.pp, c.tp, 0};
      if (k == kExpert) key = {c.pp, c.ep, 0};
      if (k == kExpertShard) key = {c.pp, c.ep, c.etp};
      if (!seen.insert(key).second) continue;
      for (std::int64_t i = 0; i < n; ++i) {
        const double v = reduced_grad(layout, q, k, i);
        sq += v * v;
      }
    }
  }
  return std::sqrt(sq);
}

void check_layout(Communicator& world, const ParallelConfig& pc, int stage, std::int64_t bytes) {
  const Mesh mesh(Layout(pc, world.size()), world);
  const Layout& layout = mesh.layout();
  const int me = mesh.global_rank();
  INFO("tp " << pc.tp << " cp " << pc.cp << " ep " << pc.ep << " pp " << pc.pp << ", stage "
             << stage << ", bucket bytes " << bytes);
  Probe probe;
  nn::ParameterStore store(probe, DType::f32, kCpu, 3);
  data_parallel::DataParallelConfig config;
  config.zero_stage = stage;
  config.first_bucket_bytes = bytes;
  config.bucket_bytes = bytes;
  data_parallel::DataParallel dp(store, mesh, config, kCpu);
  nn::AdamWConfig adam;
  adam.max_grad_norm = 0.0f;  // no clipping: the step just reports the norm
  data_parallel::DistributedOptimizer optimizer(dp, adam, kCpu);

  for (const data_parallel::GradientBucket& b : dp.buckets()) {
    const Kind k = kind_of(b.params.front()->name());
    const bool expert = k == kExpert || k == kExpertShard;
    CHECK(b.axis == (expert ? Axis::edp : k == kNorm && pc.tp > 1 ? Axis::tp_dp_cp : Axis::dp_cp));
    CHECK(mesh.comm(b.axis).size() == b.shard_count);
  }

  dp.begin_step();
  std::map<Kind, std::int64_t> sizes;
  for (nn::Parameter* p : store.parameters()) {  // backward order
    const Kind k = kind_of(p->name());
    sizes[k] = p->numel();
    std::vector<float> g;
    for (std::int64_t i = 0; i < p->numel(); ++i) {
      g.push_back(static_cast<float>(local_grad(layout, me, k, i)));
    }
    p->grad_for_backward(kCpu).copy_(Tensor::from_vector(g, p->shape()));
    p->mark_grad_ready();
  }
  dp.finish(kCpu);

  const std::vector<float> grads =
      stage == 0 ? store.grad_buffer().to_vector<float>() : std::vector<float>();
  for (int bi = 0; bi < static_cast<int>(dp.buckets().size()); ++bi) {
    const data_parallel::GradientBucket& b = dp.buckets()[bi];
    const std::int64_t lo = stage == 0 ? b.begin : b.owned_begin();
    const std::int64_t hi = stage == 0 ? b.end : b.owned_end();
    const std::vector<float> owned =
        stage == 0 ? std::vector<float>() : dp.owned_grad(bi).to_vector<float>();
    for (const nn::Parameter* p : b.params) {
      const Kind k = kind_of(p->name());
      for (std::int64_t e = std::max(lo, p->offset()); e < std::min(hi, p->offset() + p->numel());
           ++e) {
        const double got = stage == 0 ? grads[e] : owned[e - lo];
        const double want = reduced_grad(layout, me, k, e - p->offset());
        INFO(p->name() << "[" << e - p->offset() << "]");
        REQUIRE(std::abs(got - want) <= 1e-5 * (1.0 + std::abs(want)));
      }
    }
  }
  const nn::OptimizerStepInfo info = optimizer.step(kCpu);
  const double want = expected_norm(layout, sizes);
  INFO("norm " << info.grad_norm() << " vs " << want);
  CHECK(std::abs(info.grad_norm() - want) <= 1e-5 * want);
  CHECK(info.grad_scale() == 1.0f);
}

std::vector<ParallelConfig> layouts(int world) {
  auto make = [](int tp, int cp, int ep, int pp) {
    ParallelConfig c;
    c.tp = tp, c.cp = cp, c.ep = ep, c.pp = pp;
    return c;
  };
  std::vector<ParallelConfig> out = {make(1, 1, 1, 1)};
  if (world == 2) {
    out.push_back(make(2, 1, 1, 1));
    out.push_back(make(1, 1, 2, 1));
    out.push_back(make(1, 1, 1, 2));
  }
  if (world == 4) {
    out.push_back(make(2, 1, 2, 1));
    out.push_back(make(1, 1, 4, 1));
    out.push_back(make(2, 1, 1, 2));
    out.push_back(make(1, 2, 2, 1));
  }
  return out;
}

}  // namespace

TEST_CASE("dp groups: dense over dp-cp, expert over edp, sequence-parallel norms over tp") {
  World world = cpu_world();
  for (const ParallelConfig& pc : layouts(world.size())) {
    for (int stage : {0, 1, 2}) {
      check_layout(world.comm(), pc, stage, 1 << 20);
      if (stage == 1) check_layout(world.comm(), pc, stage, 256);  // one bucket per parameter
    }
  }
}

TEST_CASE("dp: bad input throws before any communication") {
  World world = cpu_world();
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  Probe probe;
  nn::ParameterStore store(probe, DType::f32, kCpu, 3);
  auto config_with = [](const std::function<void(data_parallel::DataParallelConfig&)>& edit) {
    data_parallel::DataParallelConfig c;
    edit(c);
    return c;
  };
  REQUIRE_THROWS_QUINTET(data_parallel::DataParallel(
                             store, mesh, config_with([](auto& c) { c.zero_stage = 3; }), kCpu),
                         InvalidArgument, "zero_stage = 3");
  REQUIRE_THROWS_QUINTET(data_parallel::DataParallel(
                             store, mesh, config_with([](auto& c) { c.bucket_bytes = 0; }), kCpu),
                         InvalidArgument, "bucket_bytes = 0");
  REQUIRE_THROWS_QUINTET(
      data_parallel::DataParallel(store, mesh,
                                  config_with([](auto& c) { c.first_bucket_bytes = -5; }), kCpu),
      InvalidArgument, "first_bucket_bytes = -5");
  {
    Probe bad(true);
    nn::ParameterStore bad_store(bad, DType::f32, kCpu, 3);
    REQUIRE_THROWS_QUINTET(
        data_parallel::DataParallel(bad_store, mesh, data_parallel::DataParallelConfig{}, kCpu),
        InvalidArgument, "asks for reduce_over_tp");
  }
  data_parallel::DataParallel dp(store, mesh, data_parallel::DataParallelConfig{}, kCpu);
  data_parallel::DistributedOptimizer optimizer(dp, nn::AdamWConfig{}, kCpu);
  REQUIRE_THROWS_QUINTET(dp.set_last_microbatch(true), InvalidArgument, "not inside a step");
  REQUIRE_THROWS_QUINTET(store.parameters()[0]->mark_grad_ready(), InvalidArgument,
                         "outside a step");
  REQUIRE_THROWS_QUINTET(dp.finish(kCpu), InvalidArgument, "no step in progress");
  dp.begin_step();
  REQUIRE_THROWS_QUINTET(optimizer.step(kCpu), InvalidArgument, "call DataParallel::finish()");
  store.parameters()[0]->mark_grad_ready();
  REQUIRE_THROWS_QUINTET(store.parameters()[0]->mark_grad_ready(), InvalidArgument,
                         "marked grad-ready twice");
  dp.finish(kCpu);
  REQUIRE_THROWS_QUINTET(dp.finish(kCpu), InvalidArgument, "called twice");
  // A single-process optimizer on a data-parallel store is refused, naming the right one.
  CHECK(store.data_parallel());
  nn::AdamWConfig no_clip;
  no_clip.max_grad_norm = 0.0f;
  nn::AdamW local(store, no_clip, kCpu);
  REQUIRE_THROWS_QUINTET(local.step(kCpu), InvalidArgument,
                         "reduced by a DataParallel (and under ZeRO only partly held here); step "
                         "it with quintet::data_parallel::DistributedOptimizer");
  auto state = optimizer.state();
  state[1].second = Tensor::zeros({3});
  REQUIRE_THROWS_QUINTET(optimizer.load_state(state, kCpu), InvalidArgument, "'master' is");
  // The communicators are still in step on every rank: a collective after the errors completes.
  optimizer.step(kCpu);
  optimizer.wait_for_parameters(kCpu);
}

TEST_CASE("dp: ZeRO-2 refuses a gradient asked for after its bucket was reduced") {
  World world = cpu_world();
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  Probe probe;
  nn::ParameterStore store(probe, DType::f32, kCpu, 3);
  data_parallel::DataParallelConfig config;
  config.zero_stage = 2;
  config.first_bucket_bytes = 4;  // one parameter per bucket
  config.bucket_bytes = 4;
  data_parallel::DataParallel dp(store, mesh, config, kCpu);
  REQUIRE_THROWS_QUINTET(
      data_parallel::DataParallel(store, mesh, data_parallel::DataParallelConfig{}, kCpu),
      InvalidArgument, "one DataParallel per store");
  nn::Parameter& first = *store.parameters().front();
  REQUIRE_THROWS_QUINTET(first.grad_for_backward(kCpu), InvalidArgument, "outside a step");
  dp.begin_step();
  first.grad_for_backward(kCpu).fill_(1.0);
  first.mark_grad_ready();  // bucket 0 reduces now
  REQUIRE_THROWS_QUINTET(first.grad_for_backward(kCpu), InvalidArgument,
                         "after its bucket was reduced");
  REQUIRE_THROWS_QUINTET(first.grad(), InvalidArgument, "keeps gradients on demand");
  dp.finish(kCpu);  // the rest reduce as zeros; the ranks stay in step
  const data_parallel::GradientBucket& b = dp.buckets().front();
  const std::vector<float> owned = dp.owned_grad(0).to_vector<float>();
  for (std::int64_t e = b.owned_begin(); e < b.owned_end(); ++e) {
    CHECK(owned[e - b.owned_begin()] == (e < first.offset() + first.numel() ? 1.0f : 0.0f));
  }
}

TEST_CASE("dp: the optimizer state round-trips through state() / load_state()") {
  World world = cpu_world();
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  for (int stage : {0, 1}) {
    Probe a, b;
    nn::ParameterStore sa(a, DType::f32, kCpu, 3), sb(b, DType::f32, kCpu, 3);
    data_parallel::DataParallelConfig config;
    config.zero_stage = stage;
    data_parallel::DataParallel da(sa, mesh, config, kCpu), db(sb, mesh, config, kCpu);
    data_parallel::DistributedOptimizer oa(da, nn::AdamWConfig{}, kCpu),
        ob(db, nn::AdamWConfig{}, kCpu);
    auto one_step = [&](nn::ParameterStore& s, data_parallel::DataParallel& d,
                        data_parallel::DistributedOptimizer& o, int t) {
      d.begin_step();
      for (nn::Parameter* p : s.parameters()) {
        p->grad_for_backward(kCpu).copy_(Tensor::randn(p->shape(), 100 + t + mesh.global_rank()));
        p->mark_grad_ready();
      }
      d.finish(kCpu);
      o.step(kCpu);
      o.wait_for_parameters(kCpu);
    };
    one_step(sa, da, oa, 0);
    // b restores a's parameters and optimizer state, then both take the same step.
    Tensor(sb.data_buffer()).copy_(sa.data_buffer());
    ob.load_state(oa.state(), kCpu);
    CHECK(ob.steps() == 1);
    one_step(sa, da, oa, 1);
    one_step(sb, db, ob, 1);
    CHECK(sa.data_buffer().to_vector<float>() == sb.data_buffer().to_vector<float>());
    const auto xa = oa.state(), xb = ob.state();
    for (std::size_t i = 0; i < xa.size(); ++i) {
      INFO(xa[i].first);
      CHECK(xa[i].second.to_vector<double>() == xb[i].second.to_vector<double>());
    }
  }
}

TEST_CASE("dp: nn::AdamW state round-trips through state() / load_state()") {
  Probe a, b;
  nn::ParameterStore sa(a, DType::f32, kCpu, 3), sb(b, DType::f32, kCpu, 3);
  nn::AdamWConfig no_clip;  // the probe has tp-partial and expert weights: no local clipping
  no_clip.max_grad_norm = 0.0f;
  nn::AdamW oa(sa, no_clip, kCpu), ob(sb, no_clip, kCpu);
  auto one_step = [&](nn::ParameterStore& s, nn::AdamW& o, int t) {
    Tensor(s.grad_buffer()).copy_(Tensor::randn(s.grad_buffer().shape(), 200 + t));
    o.step(kCpu);
  };
  one_step(sa, oa, 0);
  Tensor(sb.data_buffer()).copy_(sa.data_buffer());
  ob.load_state(oa.state(), kCpu);
  CHECK(ob.steps() == 1);
  one_step(sa, oa, 1);
  one_step(sb, ob, 1);
  CHECK(sa.data_buffer().to_vector<float>() == sb.data_buffer().to_vector<float>());
  auto bad = oa.state();
  bad.pop_back();
  REQUIRE_THROWS_QUINTET(ob.load_state(bad, kCpu), InvalidArgument, "tensors given");
}
