// Naming the laggard (collectives/laggard.hpp, issue #44), the part both backends share: progress
// reports round-trip; the pure decision (find_laggards) names the member that never reached a
// collective, one that does not answer (stopped or dead), one without the communicator, the idle
// peer of a send, and nobody when every member has reached it; the sentence says so; stuck_op
// reads the recorder; name_laggards asks its channel once, bounded, and says nothing without one.
#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/flight_recorder.hpp"
#include "collectives/laggard.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::detail;

namespace {

// A report of one rank that holds communicator `name` over `members` at these counters, as the
// monitor sends it (through a registry).
std::string report_of(const std::string& name, const std::vector<int>& members, int enqueued,
                      int completed) {
  FlightRegistry registry(0, 1, "", 8);
  auto rec = std::make_shared<FlightRecorder>(name, 0, members, 8);
  registry.add(rec);
  for (int s = 0; s <= enqueued; ++s) rec->enqueued(s, "all_reduce", DType::f32, 4, -1);
  for (int s = 0; s <= completed; ++s) rec->completed(s, true);
  return progress_report(registry);
}

// The same, parsed: one communicator's line.
CommProgress progress_of(const std::string& name, const std::vector<int>& members,
                         std::int64_t enqueued, std::int64_t completed) {
  CommProgress c;
  c.name = name;
  c.world_ranks = members;
  c.progress = {enqueued, enqueued, completed};
  if (completed < enqueued) {
    c.pending_op = "all_reduce";
    c.pending_seq = completed + 1;
    c.pending_s = 3;
  }
  return c;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("rank lists collapse runs") {
  CHECK(rank_list({2, 0, 1, 5}) == "0-2, 5");
  CHECK(rank_list({7}) == "7");
  CHECK(rank_list({1, 3, 4}) == "1, 3-4");
}

TEST_CASE("progress reports round-trip") {
  const auto comms = parse_progress_report(report_of("pp", {0, 4}, 7, 5));
  REQUIRE(comms.size() == 1);
  CHECK(comms[0].name == "pp");
  CHECK(comms[0].world_ranks == std::vector<int>{0, 4});
  CHECK(comms[0].progress.enqueued == 7);
  CHECK(comms[0].progress.completed == 5);
  CHECK(comms[0].pending_op == "all_reduce");
  CHECK(comms[0].pending_seq == 6);
}

TEST_CASE("the decision: a collective waits for every member") {
  // A communicator of 3 to 6 members drawn from a job of 10; the stuck rank and the laggard are
  // two of them, drawn too.
  std::mt19937 rng(4401);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int> job(10);
    for (int r = 0; r < 10; ++r) job[static_cast<std::size_t>(r)] = r;
    std::shuffle(job.begin(), job.end(), rng);
    const std::size_t n = 3 + rng() % 4;
    std::vector<int> members(job.begin(), job.begin() + static_cast<std::ptrdiff_t>(n));
    std::sort(members.begin(), members.end());
    const int me = members[rng() % n];
    int late = me;
    while (late == me) late = members[rng() % n];
    const std::int64_t seq = 1 + static_cast<std::int64_t>(rng() % 5000);
    INFO("members " << rank_list(members) << ", stuck " << me << ", late " << late << ", #" << seq);
    const StuckOp stuck{"dp (nccl)", members, me, "all_reduce", seq, -1};

    // Every rank answers: the members at seq (its predecessor completed), the late one before it,
    // the others of the job on another communicator.
    std::map<int, std::vector<CommProgress>> reports;
    for (int r = 0; r < 10; ++r) {
      if (r == me) continue;
      const bool member = std::find(members.begin(), members.end(), r) != members.end();
      if (!member) {
        reports[r] = {progress_of("tp", {r}, 3, 3)};
      } else if (r == late) {
        reports[r] = {progress_of("tp", {r}, 9, 8),
                      progress_of("dp (nccl)", members, seq - 1, seq - 1)};
      } else {
        reports[r] = {progress_of("dp (nccl)", members, seq, seq - 1)};
      }
    }
    LaggardVerdict v = find_laggards(stuck, reports, 10);
    REQUIRE(v.behind.size() == 1);
    CHECK(v.behind[0].rank == late);
    CHECK(v.behind[0].why == Laggard::Why::never_reached);
    CHECK(v.behind[0].issued == seq - 1);
    CHECK(v.behind[0].elsewhere == "it waits for all_reduce #9 on 'tp' (3 s)");
    std::vector<int> waiting = v.waiting;
    CHECK(waiting.front() == me);
    std::sort(waiting.begin(), waiting.end());
    std::vector<int> others = members;
    others.erase(std::find(others.begin(), others.end(), late));
    CHECK(waiting == others);
    CHECK(v.silent.empty());
    const std::string said = describe_laggards(stuck, v, 15);
    CHECK(contains(said, "rank " + std::to_string(late) + " never reached all_reduce #" +
                             std::to_string(seq) + " on 'dp (nccl)' (it has issued up to #" +
                             std::to_string(seq - 1) +
                             " there; it waits for all_reduce #9 on "
                             "'tp' (3 s))"));
    CHECK(contains(said, "waited 15 s)"));
    CHECK(contains(said, rank_list(others) + " waited 15 s"));

    // Stopped or dead: no answer from it, nor from one rank outside the communicator.
    reports.erase(late);
    int outside = -1;
    for (int r : job) {
      if (std::find(members.begin(), members.end(), r) == members.end()) outside = r;
    }
    reports.erase(outside);
    v = find_laggards(stuck, reports, 10);
    REQUIRE(v.behind.size() == 1);
    CHECK(v.behind[0].rank == late);
    CHECK(v.behind[0].why == Laggard::Why::silent);
    CHECK(v.silent == std::vector<int>{outside});
    const std::string stopped = describe_laggards(stuck, v, 15);
    CHECK(contains(stopped, "rank " + std::to_string(late) + " has not completed all_reduce #" +
                                std::to_string(seq) +
                                " on 'dp (nccl)' and does not answer: it is stopped or dead"));
    CHECK(contains(stopped, "; rank " + std::to_string(outside) +
                                " of the job does not answer (stopped or dead)"));

    // It has reached the operation too: the hang is elsewhere, nobody is named.
    reports[late] = {progress_of("dp (nccl)", members, seq, seq - 1)};
    v = find_laggards(stuck, reports, 10);
    CHECK(v.behind.empty());
    CHECK(describe_laggards(stuck, v, 15).empty());

    // A communicator of that name over other ranks is not this one.
    std::vector<int> other_members = members;
    other_members.back() = 10;
    reports[late] = {progress_of("dp (nccl)", other_members, seq, seq - 1)};
    v = find_laggards(stuck, reports, 10);
    REQUIRE(v.behind.size() == 1);
    CHECK(v.behind[0].why == Laggard::Why::no_communicator);
    CHECK(contains(describe_laggards(stuck, v, 15), "rank " + std::to_string(late) +
                                                        " has no communicator 'dp (nccl)' of these "
                                                        "ranks (it waits for all_reduce #"));
  }
}

TEST_CASE("the decision: a send waits for its peer only") {
  const std::vector<int> members{4, 6, 7, 9};
  const StuckOp send{"pp", members, 4, "send", 12, 2};  // to the group's rank 2: world rank 7
  std::map<int, std::vector<CommProgress>> reports{{6, {progress_of("pp", members, 3, 3)}},
                                                   {7, {progress_of("pp", members, 11, 11)}}};
  LaggardVerdict v = find_laggards(send, reports, 10);
  REQUIRE(v.behind.size() == 1);
  CHECK(v.behind[0].rank == 7);
  CHECK(v.behind[0].why == Laggard::Why::idle_peer);
  CHECK(v.behind[0].completed == 11);
  // Members that are not its peer, and ranks outside the group, are neither named nor silent
  // members; the outside ones that did not answer are listed.
  CHECK(v.silent == std::vector<int>{0, 1, 2, 3, 5, 8, 9});
  const std::string said = describe_laggards(send, v, 10);
  CHECK(contains(said,
                 "rank 7, the peer of send #12 on 'pp', has no operation pending there (it "
                 "has completed up to #11; it waits for no operation)"));
  CHECK(contains(said, "(rank 4 waited 10 s)"));
  CHECK_FALSE(contains(said, "rank 6"));

  reports[7] = {progress_of("pp", members, 12, 11)};  // its recv is pending: it waits too
  v = find_laggards(send, reports, 10);
  CHECK(v.behind.empty());
  CHECK(v.waiting == std::vector<int>{4, 7});
}

TEST_CASE("stuck_op reads the first operation not completed from the recorder") {
  FlightRecorder rec("pp", 1, {3, 5, 8}, 4);
  for (int s = 0; s <= 6; ++s) rec.enqueued(s, s == 4 ? "send" : "all_gather", DType::f32, 4, 2);
  for (int s = 0; s <= 3; ++s) rec.completed(s, true);
  // Waiting for #6, but #4 (a send to rank 2) is the first not completed.
  StuckOp stuck = stuck_op(rec, 5, "all_gather", 6, -1);
  CHECK(stuck.comm == "pp");
  CHECK(stuck.members == std::vector<int>{3, 5, 8});
  CHECK(stuck.world_rank == 5);
  CHECK(stuck.seq == 4);
  CHECK(stuck.op == "send");
  CHECK(stuck.peer == 2);
  rec.completed(4, true);
  stuck = stuck_op(rec, 5, "all_gather", 5, 1);  // the one waited for: its own name and peer
  CHECK(stuck.seq == 5);
  CHECK(stuck.op == "all_gather");
  CHECK(stuck.peer == 1);

  FlightRecorder counters("pp", 0, {0, 1}, 0);  // no ring: the name is unknown
  counters.enqueued(0, "broadcast", DType::f32, 4, 0);
  counters.enqueued(1, "broadcast", DType::f32, 4, 0);
  stuck = stuck_op(counters, 0, "broadcast", 1, 0);
  CHECK(stuck.seq == 0);
  CHECK(stuck.op == "operation");
  CHECK(stuck.peer == -1);
}

TEST_CASE("name_laggards asks its channel once, bounded, and says nothing without one") {
  // World rank 0 of 'pp (nccl)' over {0, 1, 2, 3}, stuck on all_reduce #4; rank 3 issued up to #3.
  FlightRecorder rec("pp (nccl)", 0, {0, 1, 2, 3}, 16);
  for (int s = 0; s <= 4; ++s) rec.enqueued(s, "all_reduce", DType::f32, 4, -1);
  for (int s = 0; s <= 3; ++s) rec.completed(s, true);
  const std::vector<int> members{0, 1, 2, 3};
  int queries = 0;
  std::chrono::milliseconds asked_for{0};
  ProgressChannel channel;
  channel.world_rank = 0;
  channel.world_size = 4;
  channel.query = [&](std::chrono::milliseconds wait) {
    ++queries;
    asked_for = wait;
    return std::map<int, std::string>{{1, report_of("pp (nccl)", members, 4, 3)},
                                      {2, report_of("pp (nccl)", members, 4, 3)},
                                      {3, report_of("pp (nccl)", members, 3, 3)}};
  };
  const std::string said = name_laggards(rec, "all_reduce", 4, -1, channel, 15);
  CHECK(queries == 1);
  CHECK(asked_for == kLaggardAnswerWait);
  CHECK(contains(said, "rank 3 never reached all_reduce #4 on 'pp (nccl)'"));
  CHECK(contains(said, "(ranks 0-2 waited 15 s)"));

  CHECK(name_laggards(rec, "all_reduce", 4, -1, ProgressChannel{}, 15).empty());
  channel.query = [](std::chrono::milliseconds) -> std::map<int, std::string> {
    throw std::runtime_error("lost");
  };
  CHECK(name_laggards(rec, "all_reduce", 4, -1, channel, 15).empty());
}
