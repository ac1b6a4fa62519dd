// Layout: rank groups checked against lists written out by hand (Megatron-Core's docstrings and
// hand-computed placements), against an independent brute-force grouping over every valid config
// up to 64 ranks in several orders, and every invalid config against its message.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/parallel/layout.hpp"
#include "support/catch.hpp"

using quintet::Axis;
using quintet::Coordinates;
using quintet::Layout;
using quintet::ParallelConfig;
using Groups = std::vector<std::vector<int>>;

namespace {

ParallelConfig make(int tp, int cp, int ep, int etp, int pp, std::string order = "tp-cp-ep-dp-pp") {
  ParallelConfig c;
  c.tp = tp;
  c.cp = cp;
  c.ep = ep;
  c.etp = etp;
  c.pp = pp;
  c.order = std::move(order);
  return c;
}

std::string show(const Groups& groups) {
  std::string out;
  for (const auto& g : groups) out += fmt::format("[{}] ", fmt::join(g, ","));
  return out;
}

#define CHECK_GROUPS(layout, axis, ...)                                                 \
  do {                                                                                  \
    const Groups expected_ = __VA_ARGS__;                                               \
    INFO("axis " << quintet::axis_name(axis) << ": got " << show((layout).groups(axis)) \
                 << "expected " << show(expected_));                                    \
    CHECK((layout).groups(axis) == expected_);                                          \
  } while (0)

// Singleton groups [0] [1] ... [n-1].
Groups singletons(int n) {
  Groups g;
  for (int r = 0; r < n; ++r) g.push_back({r});
  return g;
}

}  // namespace

TEST_CASE("layout: Megatron-Core docstring, 16 ranks, tp 2, pp 4") {
  // initialize_model_parallel's docstring: 8 tp groups, 4 pp groups, 8 dp groups.
  const Layout l(make(2, 1, 1, 0, 4), 16);
  CHECK(l.config().dp == 2);
  CHECK(l.config().etp == 2);
  CHECK_GROUPS(l, Axis::tp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK_GROUPS(l, Axis::dp, {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK_GROUPS(l, Axis::pp, {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK_GROUPS(l, Axis::embedding, {{0, 12}, {1, 13}, {2, 14}, {3, 15}});
  CHECK_GROUPS(l, Axis::mp, {{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}});
  CHECK_GROUPS(l, Axis::cp, singletons(16));
  CHECK_GROUPS(l, Axis::dp_cp, l.groups(Axis::dp));
  CHECK_GROUPS(l, Axis::ep, singletons(16));
  CHECK_GROUPS(l, Axis::etp, l.groups(Axis::tp));
  CHECK_GROUPS(l, Axis::edp, l.groups(Axis::dp));
  // Rank 13 = tp 1 + 2 * (dp 0 + 2 * pp 3).
  const Coordinates c = l.coordinates(13);
  CHECK((c.tp == 1 && c.dp == 0 && c.pp == 3 && c.cp == 0 && c.ep == 0));
  CHECK(l.contains(Axis::embedding, 13));
  CHECK_FALSE(l.contains(Axis::embedding, 5));  // stage 1 of 4
  CHECK(l.group_index(Axis::embedding, 5) == -1);
  CHECK(l.group_size(Axis::embedding) == 2);
  REQUIRE_THROWS_QUINTET(l.group_of(Axis::embedding, 5), InvalidArgument, "in no 'embedding'");
}

TEST_CASE("layout: Megatron-Core docstring, 8 ranks, tp 4, cp 2") {
  // context_parallel_size's docstring: cp groups [0,4] [1,5] [2,6] [3,7].
  const Layout l(make(4, 2, 1, 0, 1), 8);
  CHECK_GROUPS(l, Axis::cp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK_GROUPS(l, Axis::tp, {{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK_GROUPS(l, Axis::tp_cp, {{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK_GROUPS(l, Axis::dp, singletons(8));
  CHECK_GROUPS(l, Axis::dp_cp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK_GROUPS(l, Axis::embedding, singletons(8));  // one stage: each rank alone
  CHECK_GROUPS(l, Axis::pp, singletons(8));
}

TEST_CASE("layout: expert groups with ep 4 and etp 1 != tp 2 (16 ranks, pp 2)") {
  // Dense: sizes (tp 2, cp 1, ep 1, dp 4, pp 2), strides (1, 2, 2, 2, 8).
  // Expert: sizes (etp 1, cp 1, ep 4, edp 2, pp 2), strides (1, 1, 1, 4, 8).
  const Layout l(make(2, 1, 4, 1, 2), 16);
  CHECK(l.config().dp == 4);
  CHECK(l.group_size(Axis::edp) == 2);
  CHECK_GROUPS(l, Axis::tp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK_GROUPS(l, Axis::dp, {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK_GROUPS(l, Axis::pp, {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK_GROUPS(l, Axis::embedding, l.groups(Axis::pp));
  CHECK_GROUPS(l, Axis::mp, {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}});
  CHECK_GROUPS(l, Axis::tp_dp_cp, {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}});
  CHECK_GROUPS(l, Axis::ep, {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  CHECK_GROUPS(l, Axis::etp, singletons(16));
  CHECK_GROUPS(l, Axis::edp,
               {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK_GROUPS(l, Axis::etp_ep, l.groups(Axis::ep));
  // Rank 13: dense tp 1, dp (13/2)%4 = 2, pp 1; expert ep 13%4 = 1, edp (13/4)%2 = 1.
  const Coordinates c = l.coordinates(13);
  CHECK((c.tp == 1 && c.dp == 2 && c.pp == 1 && c.etp == 0 && c.ep == 1 && c.edp == 1));
  CHECK(l.dense_rank(c) == 13);
  CHECK(l.expert_rank(c) == 13);
}

TEST_CASE("layout: cp 2, ep 2, etp 2 != tp 1 (16 ranks, pp 2)") {
  // Dense: (tp 1, cp 2, ep 1, dp 4, pp 2). Expert: (etp 2, cp 1, ep 2, edp 2, pp 2).
  const Layout l(make(1, 2, 2, 2, 2), 16);
  CHECK_GROUPS(l, Axis::tp, singletons(16));
  CHECK_GROUPS(l, Axis::cp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK_GROUPS(l, Axis::dp, {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK_GROUPS(l, Axis::dp_cp, {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}});
  CHECK_GROUPS(l, Axis::etp,
               {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK_GROUPS(l, Axis::ep, {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK_GROUPS(l, Axis::edp,
               {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK_GROUPS(l, Axis::etp_ep, {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
}

TEST_CASE("layout: non-default order tp-cp-ep-pp-dp with ep 2, etp 1 (8 ranks)") {
  // Dense: (tp 2, cp 1, ep 1, pp 2, dp 2), strides (1, 2, 2, 2, 4).
  // Expert: (etp 1, cp 1, ep 2, pp 2, edp 2), strides (1, 1, 1, 2, 4): stages 2 apart in both.
  ParallelConfig c = make(2, 1, 2, 1, 2, "tp-cp-ep-pp-dp");
  const Layout l(c, 8);
  CHECK_GROUPS(l, Axis::tp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK_GROUPS(l, Axis::pp, {{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK_GROUPS(l, Axis::dp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK_GROUPS(l, Axis::mp, {{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK_GROUPS(l, Axis::embedding, l.groups(Axis::pp));
  CHECK_GROUPS(l, Axis::ep, {{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK_GROUPS(l, Axis::edp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK_GROUPS(l, Axis::etp, singletons(8));
}

TEST_CASE("layout: reversed order pp-dp-ep-cp-tp orders combined groups by the order string") {
  // Sizes by position (pp 2, dp 1, ep 1, cp 2, tp 2), strides (1, 2, 2, 2, 4). In "tp-cp" the
  // members run cp fastest because cp comes first in this order.
  const Layout l(make(2, 2, 1, 0, 2, "pp-dp-ep-cp-tp"), 8);
  CHECK_GROUPS(l, Axis::tp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK_GROUPS(l, Axis::cp, {{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK_GROUPS(l, Axis::pp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK_GROUPS(l, Axis::tp_cp, {{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK_GROUPS(l, Axis::dp, singletons(8));
  const Coordinates x = l.coordinates(6);  // pp 0, cp 1, tp 1
  CHECK((x.pp == 0 && x.cp == 1 && x.tp == 1));
}

TEST_CASE("layout: order names are case-insensitive, like Megatron-Core's") {
  const Layout upper(make(2, 1, 1, 0, 2, "TP-CP-EP-DP-PP"), 8);
  const Layout lower(make(2, 1, 1, 0, 2), 8);
  for (Axis axis : quintet::kAllAxes) CHECK(upper.groups(axis) == lower.groups(axis));
}

TEST_CASE("layout: an order may leave out dimensions of size 1, appended as Megatron-Core does") {
  // Megatron-Core's RankGenerator appends each dimension the order leaves out (it must have size
  // 1) after the named ones, in the order of its table: tp, pp, dp, ep, cp.
  struct Partial {
    ParallelConfig config;
    int world;
    std::string full;
  };
  const std::vector<Partial> partial = {
      {make(2, 1, 1, 0, 4, "tp-dp-pp"), 16, "tp-dp-pp-ep-cp"},
      {make(2, 1, 1, 0, 4, "pp-tp"), 8, "pp-tp-dp-ep-cp"},
      {make(1, 1, 1, 0, 1, "dp"), 4, "dp-tp-pp-ep-cp"},
      {make(2, 2, 1, 0, 2, "cp-tp-dp-pp"), 16, "cp-tp-dp-pp-ep"},
      {make(2, 1, 2, 1, 2, "TP-EP-DP-PP"), 16, "tp-ep-dp-pp-cp"},
      {make(2, 1, 1, 0, 1, "ep-dp-tp"), 8, "ep-dp-tp-pp-cp"},
  };
  for (const Partial& p : partial) {
    INFO("order " << p.config.order << ", world " << p.world);
    ParallelConfig full_config = p.config;
    full_config.order = p.full;
    const Layout l(p.config, p.world), full(full_config, p.world);
    CHECK(l.config().order == p.full);
    for (Axis axis : quintet::kAllAxes) {
      INFO("axis " << quintet::axis_name(axis));
      CHECK(l.groups(axis) == full.groups(axis));
    }
    for (int r = 0; r < p.world; ++r) {
      const Coordinates a = l.coordinates(r), b = full.coordinates(r);
      CHECK((a.tp == b.tp && a.cp == b.cp && a.ep == b.ep && a.dp == b.dp && a.pp == b.pp &&
             a.etp == b.etp && a.edp == b.edp));
    }
  }
  // Megatron-Core's docstring placement (16 ranks, tp 2, pp 4) from the order "tp-dp-pp".
  const Layout l(make(2, 1, 1, 0, 4, "tp-dp-pp"), 16);
  CHECK_GROUPS(l, Axis::tp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK_GROUPS(l, Axis::pp, {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK_GROUPS(l, Axis::dp, {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
}

TEST_CASE("layout: orthogonal_rank_groups follows Megatron-Core's docstring example") {
  // parallel_size = [tp 2, dp 3, pp 4], mask dp: dp_group[0] = [0,2,4], [1] = [1,3,5], ...,
  // [7] = [19,21,23].
  const Groups g = quintet::orthogonal_rank_groups(24, {2, 3, 4}, {false, true, false});
  REQUIRE(g.size() == 8);
  CHECK(g[0] == std::vector<int>{0, 2, 4});
  CHECK(g[1] == std::vector<int>{1, 3, 5});
  CHECK(g[2] == std::vector<int>{6, 8, 10});
  CHECK(g[7] == std::vector<int>{19, 21, 23});
  REQUIRE_THROWS_QUINTET(quintet::orthogonal_rank_groups(25, {2, 3, 4}, {false, true, false}),
                         InvalidArgument, "multiply to 24 but the world has 25");
  REQUIRE_THROWS_QUINTET(quintet::orthogonal_rank_groups(24, {2, 3, 4}, {true}), InvalidArgument,
                         "mask has 1");
}

TEST_CASE("layout: invalid configs say what to change") {
  struct Bad {
    ParallelConfig config;
    int world;
    std::string message;
  };
  auto with = [](auto edit) {
    ParallelConfig c;
    edit(c);
    return c;
  };
  const std::vector<Bad> bad = {
      {ParallelConfig{}, 0, "world size must be at least 1 rank, found 0"},
      {with([](auto& c) { c.tp = 0; }), 8, "tp must be at least 1, found 0"},
      {with([](auto& c) { c.cp = -2; }), 8, "cp must be at least 1, found -2"},
      {with([](auto& c) { c.ep = 0; }), 8, "ep must be at least 1, found 0"},
      {with([](auto& c) { c.pp = 0; }), 8, "pp must be at least 1, found 0"},
      {with([](auto& c) { c.vpp = 0; }), 8, "vpp must be at least 1, found 0"},
      {with([](auto& c) { c.etp = -1; }), 8, "etp must be at least 1, or 0 for 'same as tp'"},
      {with([](auto& c) { c.dp = -1; }), 8, "dp must be at least 1, or 0 to infer it"},
      {with([](auto& c) { c.vpp = 2; }), 8, "vpp = 2 model chunks per rank needs a pipeline"},
      {with([](auto& c) { c.order = "tp-cp-ep-dp-xp"; }), 8,
       "order 'tp-cp-ep-dp-xp' has unknown "
       "name 'xp'"},
      {with([](auto& c) { c.order = "tp-cp-ep-dp-pp-"; }), 8, "has unknown name ''"},
      {with([](auto& c) { c.order = "tp-cp-tp-dp-pp"; }), 8, "names 'tp' twice"},
      {with([](auto& c) { c.order = "tp-tp"; }), 8, "order 'tp-tp' names 'tp' twice"},
      {with([](auto& c) { c.order = "tp-dp-xp"; }), 8, "order 'tp-dp-xp' has unknown name 'xp'"},
      {with([](auto& c) { c.pp = 2, c.order = "tp-cp-ep-dp"; }), 8,
       "order 'tp-cp-ep-dp' leaves out 'pp', but pp = 2: a dimension may be left out of the order "
       "only when its size is 1 (Megatron-Core appends it then); name 'pp' in the order where it "
       "should vary (e.g. 'tp-cp-ep-dp-pp') or set pp = 1"},
      {with([](auto& c) { c.tp = 2, c.cp = 2, c.order = "tp-dp-pp"; }), 8,
       "order 'tp-dp-pp' leaves out 'cp', but cp = 2"},
      {with([](auto& c) { c.tp = 2, c.order = "tp-pp"; }), 8,
       "order 'tp-pp' leaves out 'dp', but dp = world / (tp*cp*pp) = 4"},
      {with([](auto& c) { c.ep = 2, c.order = "tp-cp-dp-pp"; }), 8,
       "order 'tp-cp-dp-pp' leaves out 'ep', but ep = 2 (expert layers)"},
      {with([](auto& c) { c.etp = 2, c.order = "cp-ep-dp-pp"; }), 8,
       "order 'cp-ep-dp-pp' leaves out 'tp', but etp = 2 (expert layers)"},
      {with([](auto& c) { c.tp = 8, c.etp = 1, c.order = "tp-cp-ep-pp"; }), 8,
       "order 'tp-cp-ep-pp' leaves out 'dp', but edp = world / (etp*ep*pp) = 8 (expert layers)"},
      {with([](auto& c) { c.tp = 5; }), 12,
       "tp*cp*pp = 5*1*1 = 5 does not divide the world size 12"},
      {with([](auto& c) { c.tp = 2, c.cp = 2, c.pp = 3; }), 16, "= 12 does not divide"},
      {with([](auto& c) { c.tp = 2, c.dp = 4; }), 16, "= 8 is not the world size 16: set dp to 8"},
      {with([](auto& c) { c.ep = 3; }), 8,
       "etp*ep*pp = 1*3*1 = 3 does not divide the world size 8"},
      {with([](auto& c) { c.tp = 2, c.etp = 4, c.ep = 4; }), 8, "etp*ep*pp = 4*4*1 = 16 does not"},
      {with([](auto& c) { c.tp = 2, c.pp = 2, c.ep = 2, c.order = "tp-cp-ep-pp-dp"; }), 8,
       "places pipeline stages 2 ranks apart for dense layers (tp 2, cp 1, dp 2) but 4 ranks apart "
       "for expert layers"},
  };
  for (const Bad& b : bad) {
    INFO("expected: " << b.message);
    REQUIRE_THROWS_QUINTET(b.config.validate(b.world), InvalidArgument, b.message);
    REQUIRE_THROWS_QUINTET(Layout(b.config, b.world), InvalidArgument, b.message);
  }
  // The same mistakes are accepted once fixed.
  CHECK_NOTHROW(make(2, 1, 2, 1, 2, "tp-cp-ep-pp-dp").validate(8));
  ParallelConfig interleaved = make(1, 1, 1, 0, 2);
  interleaved.vpp = 4;
  CHECK(Layout(interleaved, 8).config().vpp == 4);
  CHECK(make(2, 1, 1, 0, 1).resolved(16).dp == 8);
  CHECK(make(2, 1, 4, 1, 2).edp(16) == 2);
}

TEST_CASE("layout: out-of-range ranks and coordinates are rejected") {
  const Layout l(make(2, 1, 2, 0, 2), 8);
  REQUIRE_THROWS_QUINTET(l.coordinates(8), InvalidArgument, "rank 8 is outside the world of 8");
  REQUIRE_THROWS_QUINTET(l.group_index(Axis::tp, -1), InvalidArgument, "rank -1 is outside");
  Coordinates c;
  c.pp = 2;
  REQUIRE_THROWS_QUINTET(l.dense_rank(c), InvalidArgument, "coordinate pp = 2 is out of range");
  c = {};
  c.edp = 1;  // edp = 8 / (2*2*2) = 1
  REQUIRE_THROWS_QUINTET(l.expert_rank(c), InvalidArgument, "coordinate edp = 1 is out of range");
}
