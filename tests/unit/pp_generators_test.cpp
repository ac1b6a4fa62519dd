// The generators over pp 1-8, vpp 1-3, microbatches 1-16: every valid combination is a well-formed,
// deadlock-free schedule (checked here independently of validate()), every other one is refused
// with its rule.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "quintet/parallel/pipeline/schedule.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"
#include "support/catch.hpp"

using namespace quintet::pipeline;

namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b,
                                   ScheduleKind::interleaved, ScheduleKind::zb_h1,
                                   ScheduleKind::zb_v};

// The rule each generator documents; empty when (pp, vpp, m) is valid.
std::string broken_rule(ScheduleKind kind, int pp, int vpp, int m) {
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b:
      return vpp == 1 ? "" : "takes vpp = 1";
    case ScheduleKind::zb_h1:
      if (vpp != 1) return "takes vpp = 1";
      return m >= pp ? "" : "needs microbatches >= pp";
    case ScheduleKind::interleaved:
      if (vpp < 2) return "takes vpp >= 2";
      return m % pp == 0 ? "" : "microbatches must be a multiple of pp";
    case ScheduleKind::zb_v:
      if (vpp != 2) return "takes vpp = 2";
      return m >= pp ? "" : "needs microbatches >= pp";
  }
  return "?";
}

// The rank each stage must be on.
std::vector<int> expected_placement(ScheduleKind kind, int pp, int vpp) {
  std::vector<int> out(pp * vpp);
  for (int s = 0; s < pp * vpp; ++s) {
    out[s] = kind == ScheduleKind::zb_v ? (s < pp ? s : 2 * pp - 1 - s) : s % pp;
  }
  return out;
}

bool is_send(ActionKind k) {
  return k == ActionKind::send_forward || k == ActionKind::send_backward;
}

// The properties of a schedule checked from its lists alone.
void check_well_formed(const Schedule& s, ScheduleKind kind) {
  const int S = s.num_stages(), M = s.microbatches;
  REQUIRE(s.stage_rank == expected_placement(kind, s.pp, s.vpp));
  const bool split = kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_v;
  CHECK(s.split_backward() == split);
  // count[kind][stage][mb] and position on its rank
  std::map<std::tuple<int, int, int>, std::vector<int>> where;
  for (int r = 0; r < s.pp; ++r) {
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& a = s.actions[r][i];
      REQUIRE(s.stage_rank[a.stage] == r);
      where[{static_cast<int>(a.kind), a.stage, a.microbatch}].push_back(i);
    }
  }
  auto pos = [&](ActionKind k, int st, int mb) {
    auto it = where.find({static_cast<int>(k), st, mb});
    return it == where.end() ? std::vector<int>{} : it->second;
  };
  for (int st = 0; st < S; ++st) {
    for (int mb = 0; mb < M; ++mb) {
      INFO("stage " << st << " microbatch " << mb);
      const auto f = pos(ActionKind::forward, st, mb);
      REQUIRE(f.size() == 1);
      if (split) {
        const auto i = pos(ActionKind::input_grad, st, mb),
                   w = pos(ActionKind::weight_grad, st, mb);
        REQUIRE(i.size() == 1);
        REQUIRE(w.size() == 1);
        CHECK(pos(ActionKind::backward, st, mb).empty());
        CHECK(f[0] < i[0]);
        CHECK(i[0] < w[0]);
      } else {
        const auto b = pos(ActionKind::backward, st, mb);
        REQUIRE(b.size() == 1);
        CHECK(pos(ActionKind::input_grad, st, mb).empty());
        CHECK(f[0] < b[0]);
      }
      // Transfers exactly at boundaries that cross ranks.
      const bool out = st + 1 < S && s.stage_rank[st + 1] != s.stage_rank[st];
      const bool in = st > 0 && s.stage_rank[st - 1] != s.stage_rank[st];
      CHECK(pos(ActionKind::send_forward, st, mb).size() == (out ? 1u : 0u));
      CHECK(pos(ActionKind::recv_backward, st, mb).size() == (out ? 1u : 0u));
      CHECK(pos(ActionKind::recv_forward, st, mb).size() == (in ? 1u : 0u));
      CHECK(pos(ActionKind::send_backward, st, mb).size() == (in ? 1u : 0u));
    }
  }
  // Every send matches, in order, exactly one receive of the peer.
  for (int a = 0; a < s.pp; ++a) {
    for (int b = 0; b < s.pp; ++b) {
      std::vector<Action> sent, received;
      for (const Action& x : s.actions[a]) {
        if (!is_send(x.kind)) continue;
        const int to = x.kind == ActionKind::send_forward ? x.stage + 1 : x.stage - 1;
        if (s.stage_rank[to] != b) continue;
        sent.push_back({x.kind == ActionKind::send_forward ? ActionKind::recv_forward
                                                           : ActionKind::recv_backward,
                        to, x.microbatch});
      }
      for (const Action& x : s.actions[b]) {
        if (x.kind != ActionKind::recv_forward && x.kind != ActionKind::recv_backward) continue;
        const int from = x.kind == ActionKind::recv_forward ? x.stage - 1 : x.stage + 1;
        if (s.stage_rank[from] == a) received.push_back(x);
      }
      INFO("rank " << a << " -> rank " << b);
      CHECK(sent == received);
    }
  }
}

}  // namespace

TEST_CASE("every generator, pp 1-8, vpp 1-3, microbatches 1-16", "[pp]") {
  int valid = 0, refused = 0;
  for (ScheduleKind kind : kKinds) {
    for (int pp = 1; pp <= 8; ++pp) {
      for (int vpp = 1; vpp <= 3; ++vpp) {
        for (int m = 1; m <= 16; ++m) {
          INFO(schedule_kind_name(kind) << " pp " << pp << " vpp " << vpp << " m " << m);
          const std::string rule = broken_rule(kind, pp, vpp, m);
          if (!rule.empty()) {
            REQUIRE_THROWS_QUINTET(make_schedule(kind, pp, vpp, m), InvalidArgument, rule);
            ++refused;
            continue;
          }
          const Schedule s = make_schedule(kind, pp, vpp, m);
          CHECK(s.name == schedule_kind_name(kind));
          check_well_formed(s, kind);
          CHECK_NOTHROW(s.validate());
          const Simulation sim = simulate(s);
          CHECK_FALSE(sim.deadlock);
          CHECK(sim.deadlock_report.empty());
          // A pure function: the same arguments give the same schedule.
          CHECK(make_schedule(kind, pp, vpp, m) == s);
          ++valid;
        }
      }
    }
  }
  CHECK(valid + refused == 5 * 8 * 3 * 16);
  CHECK(valid > 500);
}

TEST_CASE("1F1B warms up with min(pp - rank - 1, m) forwards", "[pp]") {
  for (int pp = 1; pp <= 8; ++pp) {
    for (int m = 1; m <= 16; ++m) {
      const Schedule s = make_schedule(ScheduleKind::one_f_one_b, pp, 1, m);
      for (int r = 0; r < pp; ++r) {
        int forwards = 0;  // before the first backward: the warm-up and the first steady F
        for (const Action& a : s.actions[r]) {
          if (a.kind == ActionKind::backward) break;
          forwards += a.kind == ActionKind::forward;
        }
        INFO("pp " << pp << " m " << m << " rank " << r);
        CHECK(forwards == std::min(pp - r - 1, m) + (m > pp - r - 1 ? 1 : 0));
      }
    }
  }
}

TEST_CASE("non-positive sizes and bad costs are refused", "[pp]") {
  REQUIRE_THROWS_QUINTET(make_schedule(ScheduleKind::gpipe, 0, 1, 4), InvalidArgument,
                         "expected pp, vpp and microbatches >= 1");
  REQUIRE_THROWS_QUINTET(make_schedule(ScheduleKind::one_f_one_b, 2, 1, 0), InvalidArgument,
                         "expected pp, vpp and microbatches >= 1");
  ActionCosts costs;
  costs.weight_grad = 3.0;  // more than the whole backward
  REQUIRE_THROWS_QUINTET(make_schedule(ScheduleKind::zb_h1, 2, 1, 4, costs), InvalidArgument,
                         "weight_grad <= backward");
}

TEST_CASE("schedules planned for other costs are still well formed and deadlock-free", "[pp]") {
  for (double w : {0.0, 0.5, 1.5}) {
    ActionCosts costs;
    costs.forward = 1.0;
    costs.backward = 3.0;
    costs.weight_grad = w;
    costs.p2p = 0.25;
    for (ScheduleKind kind : kKinds) {
      const int vpp = kind == ScheduleKind::interleaved || kind == ScheduleKind::zb_v ? 2 : 1;
      const Schedule s = make_schedule(kind, 4, vpp, 8, costs);
      INFO(s.name << " w " << w);
      check_well_formed(s, kind);
      CHECK_FALSE(simulate(s).deadlock);
      CHECK_FALSE(simulate(s, costs).deadlock);
    }
  }
}

TEST_CASE("ZB-H1 planned at its costs beats 1F1B at the same peak memory, whatever the costs",
          "[pp]") {
  // Costs as measured on CPU ranks (I longer than F, W shorter), and unit-like ones.
  for (const auto& [f, b, w] : {std::tuple{1.0, 1.8, 0.65}, std::tuple{1.0, 2.0, 1.0},
                                std::tuple{1.0, 3.0, 0.5}, std::tuple{1.0, 2.5, 1.5}}) {
    ActionCosts costs;
    costs.forward = f;
    costs.backward = b;
    costs.weight_grad = w;
    for (int pp = 2; pp <= 8; ++pp) {
      for (int m = pp; m <= 32; m += 3) {
        INFO("F " << f << " B " << b << " W " << w << " pp " << pp << " m " << m);
        const Simulation zb = simulate(make_schedule(ScheduleKind::zb_h1, pp, 1, m, costs), costs);
        const Simulation one =
            simulate(make_schedule(ScheduleKind::one_f_one_b, pp, 1, m, costs), costs);
        CHECK(zb.makespan < one.makespan);
        CHECK(*std::max_element(zb.peak_in_flight.begin(), zb.peak_in_flight.end()) <= pp);
      }
    }
  }
}

TEST_CASE("planned at costs whose sums round differently, 1F1B keeps its closed-form bubble",
          "[pp]") {
  // Costs like these once put receives one compute early (equal times differing in the last
  // bits), holding up the sends behind them: 1F1B at pp 4, m 16 ran with a bubble of 0.29.
  for (const auto& [f, b, w] : {std::tuple{96.4, 170.7, 70.5}, std::tuple{0.96437, 1.7070354, 0.7},
                                std::tuple{0.1, 0.3, 0.1}}) {
    ActionCosts costs;
    costs.forward = f;
    costs.backward = b;
    costs.weight_grad = w;
    for (int pp = 2; pp <= 8; ++pp) {
      for (int m = 1; m <= 16; ++m) {
        INFO("F " << f << " B " << b << " pp " << pp << " m " << m);
        const Schedule s = make_schedule(ScheduleKind::one_f_one_b, pp, 1, m, costs);
        CHECK(simulate(s, costs).bubble_fraction ==
              Approx(double(pp - 1) / (m + pp - 1)).margin(1e-9));
      }
    }
  }
}
