// The simulator against closed forms (1F1B's and ZB-H1's bubbles, peak memory), a hand-timed
// schedule, and hand-made deadlocks.
#include <algorithm>
#include <string>
#include <vector>

#include "quintet/parallel/pipeline/schedule.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"
#include "support/catch.hpp"

using namespace quintet::pipeline;

namespace {

ActionCosts costs(double f, double b, double w, double p2p = 0.0) {
  ActionCosts c;
  c.forward = f;
  c.backward = b;
  c.weight_grad = w;
  c.p2p = p2p;
  return c;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("1F1B's bubble is (p - 1) / (m + p - 1)", "[pp]") {
  for (const auto& [f, b] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        INFO("F " << f << " B " << b << " p " << p << " m " << m);
        const Simulation sim =
            simulate(make_schedule(ScheduleKind::one_f_one_b, p, 1, m), costs(f, b, b / 2));
        REQUIRE_FALSE(sim.deadlock);
        CHECK(sim.bubble_fraction == Approx(double(p - 1) / (m + p - 1)).margin(1e-12));
        CHECK(sim.makespan == Approx((f + b) * (m + p - 1)));
        for (double busy : sim.busy) CHECK(busy == Approx((f + b) * m));
      }
    }
  }
}

TEST_CASE("ZB-H1 with T_F = T_I = T_W has a bubble of at most (p - 1) / (3m + p - 1)", "[pp]") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 16; ++m) {
      INFO("p " << p << " m " << m);
      const Simulation sim = simulate(make_schedule(ScheduleKind::zb_h1, p, 1, m), costs(1, 2, 1));
      REQUIRE_FALSE(sim.deadlock);
      CHECK(sim.bubble_fraction <= double(p - 1) / (3 * m + p - 1) + 1e-12);
      // ... with 1F1B's peak memory: p microbatches in flight at most.
      for (int peak : sim.peak_in_flight) CHECK(peak <= p);
    }
  }
}

TEST_CASE("peak in flight: 1F1B holds p on the first stage, GPipe all m", "[pp]") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      INFO("p " << p << " m " << m);
      const Simulation one = simulate(make_schedule(ScheduleKind::one_f_one_b, p, 1, m));
      const Simulation gpipe = simulate(make_schedule(ScheduleKind::gpipe, p, 1, m));
      CHECK(one.peak_in_flight[0] == std::min(p, m));
      for (int r = 0; r < p; ++r) CHECK(one.peak_in_flight[r] == std::min(p - r, m));
      CHECK(gpipe.peak_in_flight[0] == m);
    }
  }
}

TEST_CASE("interleaved with vpp 2 has a smaller bubble than 1F1B", "[pp]") {
  for (int p = 2; p <= 8; ++p) {
    for (int m = p; m <= 16; m += p) {
      INFO("p " << p << " m " << m);
      const double one =
          simulate(make_schedule(ScheduleKind::one_f_one_b, p, 1, m)).bubble_fraction;
      const double inter =
          simulate(make_schedule(ScheduleKind::interleaved, p, 2, m)).bubble_fraction;
      CHECK(inter < one);
    }
  }
}

TEST_CASE("a hand-written schedule is timed as batches run", "[pp]") {
  // Rank 0's second batch holds 0SF1 and 0RB0: 0SF1 cannot complete before rank 1 posts 1RF1,
  // which it does together with 1SB0, after 1B0. Times worked out by hand with F 1, B 2, p2p 0.5.
  const Schedule s = Schedule::parse(
      "schedule hand pp 2 vpp 1 microbatches 2\nstages 0 1\n"
      "rank 0: 0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1\n"
      "rank 1: 1RF0 1F0 1B0 1SB0 1RF1 1F1 1B1 1SB1\n");
  const Simulation sim = simulate(s, costs(1, 2, 1, 0.5));
  REQUIRE_FALSE(sim.deadlock);
  auto at = [&](int rank, int i) { return sim.timeline[rank][i]; };
  CHECK(at(0, 1).start == 1.0);  // [0SF0] after 0F0
  CHECK(at(0, 1).end == 1.5);
  CHECK(at(1, 1).start == 1.5);  // 1F0 after [1RF0]
  CHECK(at(0, 3).start == 2.0);  // [0SF1 0RB0] after 0F1 ...
  CHECK(at(0, 3).end == 5.0);    // ... done once [1SB0 1RF1] starts at 4.5, + 0.5
  CHECK(at(0, 5).start == 5.0);  // 0B0
  CHECK(at(1, 5).start == 5.0);  // 1F1
  CHECK(at(0, 7).start == 8.5);  // 0B1 after [0RB1], done when [1SB1] starts at 8 + 0.5
  CHECK(sim.makespan == 10.5);
  CHECK(sim.busy == std::vector<double>{6.0, 6.0});
  CHECK(sim.bubble_fraction == Approx(1.0 - 12.0 / 21.0));
  CHECK(sim.peak_in_flight == std::vector<int>{2, 1});

  // The trace: one event per compute, one per batch (rank 0: 3 batches, rank 1: 3).
  const std::string trace = chrome_trace(sim);
  CHECK(count(trace, "\"ph\":\"X\"") == 8 + 6);
  CHECK(count(trace, "\"cat\":\"compute\"") == 8);
  CHECK(trace.find("\"name\":\"0SF1 0RB0\"") != std::string::npos);
  CHECK(trace.find("\"name\":\"rank 1 p2p\"") != std::string::npos);
  CHECK(trace.find("\"name\":\"0B1\",\"cat\":\"compute\",\"ph\":\"X\",\"pid\":0,\"tid\":0,"
                   "\"ts\":8500,\"dur\":2000") != std::string::npos);
}

TEST_CASE("a removed send is a deadlock naming the rank; validate() finds the receive", "[pp]") {
  Schedule s = make_schedule(ScheduleKind::one_f_one_b, 4, 1, 8);
  auto& list = s.actions[1];
  const Action removed{ActionKind::send_forward, 1, 3};
  const auto it = std::find(list.begin(), list.end(), removed);
  REQUIRE(it != list.end());
  list.erase(it);
  const Simulation sim = simulate(s);
  CHECK(sim.deadlock);
  INFO(sim.deadlock_report);
  // Rank 2 receives in order, so its last receive from rank 1 is the one that never comes.
  CHECK(sim.deadlock_report.find("rank 2 waits at 2RF7 (the send 1SF7 never comes") !=
        std::string::npos);
  REQUIRE_THROWS_QUINTET(s.validate(), InvalidArgument, "1SF3 is missing");
  REQUIRE_THROWS_QUINTET(check_schedule(s), InvalidArgument, "1SF3 is missing");
}

TEST_CASE("a cycle of waits between two ranks is a deadlock", "[pp]") {
  // Rank 0 posts 0RB0 in a batch of its own, and 0SF1 only after 0B0; rank 1 posts 1RF1 before
  // 1B0 and 1SB0. Each waits for a batch the other posts after the one it waits in. validate()
  // passes: the pairs match in order; only the batching hangs.
  const Schedule s = Schedule::parse(
      "schedule cycle pp 2 vpp 1 microbatches 2\nstages 0 1\n"
      "rank 0: 0F0 0SF0 0F1 0RB0 0B0 0SF1 0RB1 0B1\n"
      "rank 1: 1RF0 1F0 1RF1 1F1 1B0 1SB0 1B1 1SB1\n");
  CHECK_NOTHROW(s.validate());
  const Simulation sim = simulate(s);
  CHECK(sim.deadlock);
  INFO(sim.deadlock_report);
  CHECK(sim.deadlock_report ==
        "rank 0 waits at 0RB0 (rank 1 has not posted 1SB0 yet); its compute waits at 0B0 for its "
        "receive 0RB0\n"
        "rank 1 waits at 1RF1 (rank 0 has not posted 0SF1 yet); its compute waits at 1F1 for its "
        "receive 1RF1\n");
  REQUIRE_THROWS_QUINTET(check_schedule(s), InvalidArgument, "would deadlock");
  // Both ranks ran what came before the wait.
  CHECK(sim.timeline[0].size() == 3);  // 0F0 0SF0 0F1
}

TEST_CASE("one rank, no transfers: the bubble is zero", "[pp]") {
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::zb_v, ScheduleKind::interleaved}) {
    const Schedule s = make_schedule(kind, 1, kind == ScheduleKind::gpipe ? 1 : 2, 3);
    const Simulation sim = simulate(s, costs(1, 3, 1, 7));
    CHECK(sim.bubble_fraction == 0.0);
    CHECK(sim.makespan == Approx(s.vpp * 3 * 4.0));
  }
}

TEST_CASE("costs per stage: each stage's actions take its own costs", "[pp]") {
  // 1F1B on two ranks, one microbatch: 0F0, 1F0, 1B0, 0B0 one after another, plus two transfers.
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 1, 1);
  const std::vector<ActionCosts> per_stage{costs(1, 2, 1, 0.5), costs(3, 4, 2, 0.25)};
  const Simulation sim = simulate(s, per_stage);
  REQUIRE_FALSE(sim.deadlock);
  // 0F0 ends at 1; rank 1's receive of it completes at 1.5 (the sender, stage 0, takes 0.5);
  // 1F0 and 1B0 end at 8.5. Rank 0 posted 0SF0 and 0RB0 as one batch, which completes once
  // 1SB0 is posted (8.5) plus its slowest transfer (0SF0's 0.5): 9, then 0B0 ends at 11.
  CHECK(sim.makespan == Approx(11.0));
  CHECK(sim.busy[0] == Approx(3.0));
  CHECK(sim.busy[1] == Approx(7.0));
  // The same costs everywhere equal the uniform call.
  const std::vector<ActionCosts> same(2, costs(1, 2, 1, 0.5));
  CHECK(simulate(s, same).makespan == simulate(s, costs(1, 2, 1, 0.5)).makespan);
  REQUIRE_THROWS_QUINTET(simulate(s, std::vector<ActionCosts>(3)), InvalidArgument,
                         "3 stage costs for a schedule of 2 stages");
  REQUIRE_THROWS_QUINTET(simulate(s, std::vector<ActionCosts>{costs(1, 2, 1), costs(1, 1, 2)}),
                         InvalidArgument, "for stage 1");
}

TEST_CASE("a replay of given durations equals the costs they come from", "[pp]") {
  const Schedule s = make_schedule(ScheduleKind::zb_h1, 3, 1, 5);
  const std::vector<ActionCosts> per_stage{costs(1, 2, 1, 0.1), costs(1.5, 2.5, 1, 0.1),
                                           costs(2, 3, 1.5, 0.1)};
  std::vector<std::vector<double>> durations(3);
  for (int r = 0; r < 3; ++r) {
    for (const Action& a : s.actions[static_cast<std::size_t>(r)]) {
      const ActionCosts& c = per_stage[static_cast<std::size_t>(a.stage)];
      if (a.kind == ActionKind::forward) durations[r].push_back(c.forward);
      if (a.kind == ActionKind::input_grad) durations[r].push_back(c.backward - c.weight_grad);
      if (a.kind == ActionKind::weight_grad) durations[r].push_back(c.weight_grad);
    }
  }
  const Simulation from_costs = simulate(s, per_stage);
  const Simulation replay = simulate(s, durations, 0.1);
  CHECK(replay.makespan == Approx(from_costs.makespan));
  CHECK(replay.bubble_fraction == Approx(from_costs.bubble_fraction));
  // One slow action delays everything that depends on it.
  durations[1][0] += 10.0;
  CHECK(simulate(s, durations, 0.1).makespan == Approx(from_costs.makespan + 10.0));
  durations[1].pop_back();
  REQUIRE_THROWS_QUINTET(simulate(s, durations, 0.1), InvalidArgument,
                         "rank 1 needs a duration >= 0 for each of its compute actions");
}

TEST_CASE("bad costs are refused", "[pp]") {
  const Schedule s = make_schedule(ScheduleKind::gpipe, 2, 1, 2);
  REQUIRE_THROWS_QUINTET(simulate(s, costs(1, 1, 2)), InvalidArgument, "weight_grad <= backward");
  REQUIRE_THROWS_QUINTET(simulate(s, costs(-1, 1, 0)), InvalidArgument, "costs must be >= 0");
}
