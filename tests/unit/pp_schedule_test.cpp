// The schedule IR: action codes, validate() on hand-written schedules, the text form.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "quintet/parallel/pipeline/schedule.hpp"
#include "support/catch.hpp"

using namespace quintet::pipeline;

namespace {

// 1F1B on two ranks, two microbatches, written by hand.
constexpr const char* kHand = R"(# a hand-written 1F1B
schedule hand pp 2 vpp 1 microbatches 2
stages 0 1
rank 0: 0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1
rank 1: 1RF0 1F0 1B0 1SB0 1RF1 1F1 1B1 1SB1
)";

Schedule hand() { return Schedule::parse(kHand); }

}  // namespace

TEST_CASE("action codes print and parse", "[pp]") {
  CHECK(Action{ActionKind::forward, 2, 0}.str() == "2F0");
  CHECK(Action{ActionKind::send_backward, 11, 15}.str() == "11SB15");
  CHECK(Action::parse("2F0") == Action{ActionKind::forward, 2, 0});
  CHECK(Action::parse("3RB12") == Action{ActionKind::recv_backward, 3, 12});
  CHECK(Action::parse("0W7") == Action{ActionKind::weight_grad, 0, 7});
  CHECK(Action::parse("1I0") == Action{ActionKind::input_grad, 1, 0});
  for (const char* bad : {"2X0", "F0", "2F", "2f0", "2SX1", "a2F0", "2F0x", "", "2 F0"}) {
    INFO(bad);
    REQUIRE_THROWS_QUINTET(Action::parse(bad), InvalidArgument, "is not an action");
  }
  CHECK(is_compute(ActionKind::weight_grad));
  CHECK_FALSE(is_compute(ActionKind::recv_forward));
}

TEST_CASE("schedule kind names", "[pp]") {
  CHECK(parse_schedule_kind("zb-v") == ScheduleKind::zb_v);
  CHECK(schedule_kind_name(ScheduleKind::one_f_one_b) == "1f1b");
  REQUIRE_THROWS_QUINTET(parse_schedule_kind("pipedream"), InvalidArgument,
                         "gpipe, 1f1b, interleaved, zb-h1 or zb-v");
}

TEST_CASE("a hand-written schedule parses to what it says", "[pp]") {
  const Schedule s = hand();
  CHECK(s.name == "hand");
  CHECK(s.pp == 2);
  CHECK(s.microbatches == 2);
  CHECK(s.stage_rank == std::vector<int>{0, 1});
  REQUIRE(s.actions.size() == 2);
  CHECK(s.actions[1][3] == Action{ActionKind::send_backward, 1, 0});
  CHECK_FALSE(s.split_backward());
  CHECK(s.stages_of(1) == std::vector<int>{1});
  CHECK(s.remote_boundary(0));
  CHECK_FALSE(s.remote_boundary(1));
  CHECK(s.peer(Action{ActionKind::recv_backward, 0, 1}) == 1);
  // str() is the canonical form: no comment, single spaces.
  CHECK(s.str() == std::string(kHand).substr(std::string(kHand).find("schedule")));
}

TEST_CASE("str() -> parse() round trips every generator's schedule", "[pp]") {
  struct Case {
    ScheduleKind kind;
    int pp, vpp, m;
  };
  for (const Case& c :
       {Case{ScheduleKind::gpipe, 3, 1, 5}, Case{ScheduleKind::one_f_one_b, 4, 1, 7},
        Case{ScheduleKind::interleaved, 2, 3, 4}, Case{ScheduleKind::zb_h1, 4, 1, 6},
        Case{ScheduleKind::zb_v, 3, 2, 5}, Case{ScheduleKind::one_f_one_b, 1, 1, 2}}) {
    const Schedule s = make_schedule(c.kind, c.pp, c.vpp, c.m);
    INFO(s.name << " pp " << c.pp);
    const Schedule back = Schedule::parse(s.str());
    CHECK(back == s);
    CHECK(back.str() == s.str());
  }
}

TEST_CASE("load() reads a file and names it in errors", "[pp]") {
  const std::string path = "pp_schedule_test_hand.schedule";
  {
    std::ofstream out(path);
    out << kHand;
  }
  CHECK(Schedule::load(path) == hand());
  {
    std::ofstream out(path);
    out << "schedule x pp 1 vpp 1 microbatches 1\nstages 0\nrank 0: 0F0 0Q0\n";
  }
  REQUIRE_THROWS_QUINTET(Schedule::load(path), InvalidArgument, path + ": line 3");
  std::remove(path.c_str());
  REQUIRE_THROWS_QUINTET(Schedule::load("no/such/file.schedule"), System, "no/such/file.schedule");
}

TEST_CASE("malformed text is refused with the line", "[pp]") {
  const std::string head = "schedule h pp 2 vpp 1 microbatches 1\nstages 0 1\n";
  // A bad action code on line 3.
  REQUIRE_THROWS_QUINTET(Schedule::parse(head + "rank 0: 0F0 0SX0 0B0\nrank 1: 1F0 1B0\n"),
                         InvalidArgument, "line 3: '0SX0' is not an action");
  // An unknown keyword on line 2.
  REQUIRE_THROWS_QUINTET(Schedule::parse("schedule h pp 1 vpp 1 microbatches 1\nstage 0\n"),
                         InvalidArgument, "line 2: unknown keyword 'stage'");
  // Rank 1's line missing: the error is at the end of the text, after line 3.
  REQUIRE_THROWS_QUINTET(Schedule::parse(head + "rank 0: 0F0 0B0\n"), InvalidArgument,
                         "line 3 (end of text): expected a line 'rank 1: <actions>'");
  // Ranks out of order.
  REQUIRE_THROWS_QUINTET(Schedule::parse(head + "rank 1: 1F0 1B0\nrank 0: 0F0 0B0\n"),
                         InvalidArgument, "line 3: expected 'rank 0: <actions>'");
  // A header with a missing field, a stages line of the wrong length.
  REQUIRE_THROWS_QUINTET(Schedule::parse("schedule h pp 2 vpp 1\n"), InvalidArgument,
                         "line 1: expected 'schedule <name> pp <P> vpp <V> microbatches <M>'");
  REQUIRE_THROWS_QUINTET(Schedule::parse("schedule h pp 2 vpp 1 microbatches 1\nstages 0\n"),
                         InvalidArgument, "line 2: expected the ranks of 2 stages");
  REQUIRE_THROWS_QUINTET(Schedule::parse("schedule h pp two vpp 1 microbatches 1\n"),
                         InvalidArgument, "line 1: expected pp (an integer), found 'two'");
}

TEST_CASE("validate() names the rank and the action of each defect", "[pp]") {
  // hand() with rank's list replaced by the actions of text ("0F0 0SF0 ...").
  auto with = [](int rank, const std::string& text) {
    Schedule s = hand();
    s.actions[rank].clear();
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t end = std::min(text.find(' ', at), text.size());
      s.actions[rank].push_back(Action::parse(text.substr(at, end - at)));
      at = end + 1;
    }
    return s;
  };
  const auto A = [](const char* text) { return Action::parse(text); };
  CHECK_NOTHROW(hand().validate());

  // Backward before forward on rank 1.
  REQUIRE_THROWS_QUINTET(with(1, "1RF0 1B0 1F0 1SB0 1RF1 1F1 1B1 1SB1").validate(), InvalidArgument,
                         "on rank 1, 1B0 must come after 1F0");
  // A send before the compute it carries.
  REQUIRE_THROWS_QUINTET(with(0, "0SF0 0F0 0F1 0SF1 0RB0 0B0 0RB1 0B1").validate(), InvalidArgument,
                         "on rank 0, 0SF0 must come after 0F0");
  // A receive after its consumer.
  REQUIRE_THROWS_QUINTET(with(0, "0F0 0SF0 0F1 0SF1 0B0 0RB0 0RB1 0B1").validate(), InvalidArgument,
                         "on rank 0, 0B0 must come after 0RB0");
  // The receives of rank 1 in the other order than rank 0's sends.
  REQUIRE_THROWS_QUINTET(with(1, "1RF1 1RF0 1F0 1B0 1SB0 1F1 1B1 1SB1").validate(), InvalidArgument,
                         "rank 0's 1st send to rank 1 is 0SF0, which rank 1 receives as 1RF0");
  // An action on a rank that does not hold its stage.
  REQUIRE_THROWS_QUINTET(with(0, "0F0 1F0").validate(), InvalidArgument,
                         "rank 0 runs 1F0, but stage 1 is on rank 1");
  // A forward run twice.
  REQUIRE_THROWS_QUINTET(with(0, "0F0 0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1").validate(),
                         InvalidArgument, "rank 0 has 0F0 twice");
  // A missing backward.
  REQUIRE_THROWS_QUINTET(with(0, "0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1").validate(), InvalidArgument,
                         "rank 0 never runs the backward of 0F1");
  // Both forms of backward.
  REQUIRE_THROWS_QUINTET(with(0, "0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1 0I1 0W1").validate(),
                         InvalidArgument, "rank 0 runs both 0B1 and 0I1");
  // W before its I.
  REQUIRE_THROWS_QUINTET(with(0, "0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0W1 0I1").validate(),
                         InvalidArgument, "on rank 0, 0W1 must come after 0I1");
  // A transfer between stages on one rank: stages 0 and 1 both on rank 0 (vpp 2, pp 1).
  const Schedule local = Schedule::parse(
      "schedule l pp 1 vpp 2 microbatches 1\nstages 0 0\nrank 0: 0F0 1F0 1B0 0B0\n");
  CHECK(local.num_stages() == 2);
  Schedule bad_local = local;
  bad_local.actions[0].insert(bad_local.actions[0].begin() + 1, A("0SF0"));
  REQUIRE_THROWS_QUINTET(bad_local.validate(), InvalidArgument,
                         "stages 0 and 1 are both on rank 0");
  // Neighbouring stages on one rank in the wrong order.
  Schedule swapped = local;
  swapped.actions[0] = {A("1F0"), A("0F0"), A("1B0"), A("0B0")};
  REQUIRE_THROWS_QUINTET(swapped.validate(), InvalidArgument, "1F0 must come after 0F0");
  // A placement that gives one rank two stages and the other none.
  Schedule placed = hand();
  placed.stage_rank = {0, 0};
  REQUIRE_THROWS_QUINTET(placed.validate(), InvalidArgument,
                         "rank 0 holds 2 stages, expected vpp = 1");
  // A name the text form could not read back.
  Schedule named = hand();
  named.name = "my schedule";
  REQUIRE_THROWS_QUINTET(named.validate(), InvalidArgument, "expected one word");
  // A send removed: the receive is left unmatched.
  Schedule unmatched = hand();
  unmatched.actions[0].erase(unmatched.actions[0].begin() + 3);  // 0SF1
  REQUIRE_THROWS_QUINTET(unmatched.validate(), InvalidArgument, "0SF1 is missing");
}
