// Mesh under mpirun: for several layouts of the whole job, every axis's communicator holds exactly
// the layout's group in the layout's order (all_gather of the global rank ids returns the group
// list; all_reduce of them returns its sum), pipeline neighbours exchange their ids, and the
// helpers agree with the Layout.
#include <fmt/format.h>

#include <numeric>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/parallel/mesh.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

World cpu_world() {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;
  config.timeout_s = 60;
  return init(config);
}

ParallelConfig make(int tp, int cp, int ep, int etp, int pp, int vpp = 1,
                    std::string order = "tp-cp-ep-dp-pp") {
  ParallelConfig c;
  c.tp = tp, c.cp = cp, c.ep = ep, c.etp = etp, c.pp = pp, c.vpp = vpp;
  c.order = std::move(order);
  return c;
}

// Checks one mesh against its layout through real communication on every axis.
void check_mesh(const Mesh& mesh) {
  const Layout& layout = mesh.layout();
  const int me = mesh.global_rank();
  const Coordinates x = layout.coordinates(me);
  CHECK((mesh.coordinates().tp == x.tp && mesh.coordinates().cp == x.cp &&
         mesh.coordinates().dp == x.dp && mesh.coordinates().pp == x.pp &&
         mesh.coordinates().ep == x.ep && mesh.coordinates().etp == x.etp &&
         mesh.coordinates().edp == x.edp));
  for (Axis axis : kAllAxes) {
    INFO("axis " << axis_name(axis));
    REQUIRE(mesh.has(axis) == layout.contains(axis, me));
    if (!mesh.has(axis)) {
      REQUIRE_THROWS_QUINTET(mesh.comm(axis), InvalidArgument, "is in no 'embedding' group");
      continue;
    }
    const std::vector<int>& group = layout.group_of(axis, me);
    Communicator& comm = mesh.comm(axis);
    CHECK(comm.name() == axis_name(axis));
    CHECK(mesh.rank(axis) == layout.index_in_group(axis, me));
    CHECK(mesh.size(axis) == static_cast<int>(group.size()));
    CHECK(mesh.group(axis) == group);

    Tensor id = Tensor::full({1}, me, DType::f64);
    Tensor sum = Tensor::empty({1}, DType::f64);
    comm.all_reduce(id, sum, ReduceOp::sum).wait();
    CHECK(sum.item({0}) == std::accumulate(group.begin(), group.end(), 0.0));

    Tensor gathered = Tensor::empty({static_cast<std::int64_t>(group.size())}, DType::f64);
    comm.all_gather(id, gathered).wait();
    std::vector<int> order;
    for (std::size_t i = 0; i < group.size(); ++i) {
      order.push_back(static_cast<int>(gathered.item({static_cast<std::int64_t>(i)})));
    }
    CHECK(order == group);
  }

  // Pipeline neighbours: send my id to the next stage, receive the previous stage's.
  const int pp = layout.config().pp;
  CHECK(mesh.pp_stage() == x.pp);
  CHECK(mesh.is_first_stage() == (x.pp == 0));
  CHECK(mesh.is_last_stage() == (x.pp == pp - 1));
  const std::vector<int>& pipeline = layout.group_of(Axis::pp, me);
  CHECK(mesh.pp_next_rank() == pipeline[(x.pp + 1) % pp]);
  CHECK(mesh.pp_prev_rank() == pipeline[(x.pp + pp - 1) % pp]);
  if (pp > 1) {
    Tensor mine = Tensor::full({1}, me, DType::f64);
    Tensor from_prev = Tensor::full({1}, -1.0, DType::f64);
    mesh.comm(Axis::pp)
        .p2p({P2POp::send(mine, mesh.pp_next_peer()), P2POp::recv(from_prev, mesh.pp_prev_peer())})
        .wait();
    CHECK(from_prev.item({0}) == mesh.pp_prev_rank());
  }
}

}  // namespace

TEST_CASE("mesh: every axis's communicator is the layout's group") {
  World world = cpu_world();
  const int n = world.size();
  const std::vector<ParallelConfig> candidates = {
      ParallelConfig{},
      make(2, 1, 1, 0, 2),
      make(2, 1, 2, 0, 2),
      make(2, 2, 1, 0, 2),
      make(1, 2, 2, 2, 2),
      make(2, 1, 4, 1, 2),
      make(2, 1, 2, 1, 2, 1, "tp-cp-ep-pp-dp"),
      make(2, 2, 1, 0, 2, 1, "pp-dp-ep-cp-tp"),
      make(2, 1, 1, 0, 4, 2),
  };
  int used = 0;
  for (const ParallelConfig& c : candidates) {
    try {
      c.validate(n);
    } catch (const Error&) {
      continue;  // not a layout of this many ranks
    }
    ++used;
    INFO(fmt::format("world {} tp {} cp {} ep {} etp {} pp {} vpp {} order {}", n, c.tp, c.cp, c.ep,
                     c.etp, c.pp, c.vpp, c.order));
    const Mesh mesh(Layout(c, n), world.comm());
    check_mesh(mesh);
  }
  INFO(used << " layouts fit " << n << " ranks");
  CHECK(used >= (n >= 8 ? 7 : 1));
}

TEST_CASE("mesh: a layout for another world size is rejected before any split") {
  World world = cpu_world();
  const int n = world.size();
  REQUIRE_THROWS_QUINTET(
      Mesh(Layout(ParallelConfig{}, 2 * n), world.comm()), InvalidArgument,
      fmt::format("the layout is for {} ranks but communicator 'world' has {}", 2 * n, n));
  // The world is still usable: nobody entered a split.
  Tensor t = Tensor::full({1}, 1.0, DType::f64);
  world.comm().all_reduce(t).wait();
  CHECK(t.item({0}) == n);
}

TEST_CASE("mesh: moving keeps the communicators") {
  World world = cpu_world();
  ParallelConfig c;
  c.pp = world.size() % 2 == 0 ? 2 : 1;
  Mesh first(Layout(c, world.size()), world.comm());
  Communicator* dp = &first.comm(Axis::dp);
  Mesh moved = std::move(first);
  CHECK(&moved.comm(Axis::dp) == dp);
  check_mesh(moved);
}
