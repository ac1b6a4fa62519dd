// Naming the laggard: when a wait on a communicator times out, the waiting rank asks every other
// rank (JobMonitor::query_progress, over the channel that carries the first error) how far each
// of its communicators has got, and says who is behind instead of "a rank may not have issued the
// matching operation":
//
//   rank 3 never reached all_reduce #2788 on 'pp' (it has issued up to #2787 there and waits for
//   nothing) (ranks 0-2 waited 15 s)
//   rank 5 has not completed send #12 on 'pp' and does not answer: it is stopped or dead
//
// A rank's report lists each communicator of its FlightRegistry on one line: name, the world
// ranks of its members, the highest sequence number enqueued, started and completed, and the
// first operation not completed (its name, sequence number and how long ago it was enqueued).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "collectives/flight_recorder.hpp"
#include "collectives/mpi/progress_thread.hpp"

namespace quintet::detail {

class JobMonitor;

// One communicator's line of a report.
struct CommProgress {
  std::string name;
  std::vector<int> world_ranks;
  FlightProgress progress;
  std::string pending_op;  // the first operation not completed ("" when none)
  std::int64_t pending_seq = -1;
  double pending_s = 0;  // since it was enqueued
};

std::string progress_report(const FlightRegistry& registry);
std::vector<CommProgress> parse_progress_report(const std::string& report);

// "0-2, 5": world ranks, sorted, runs collapsed.
std::string rank_list(std::vector<int> ranks);

// The sentence naming who is behind on rec's communicator, from the other ranks' reports
// (answers: world rank -> report; a rank absent did not answer). `waited`: the operation this rank
// waited for; the one named is the first this rank has not completed. "" when every member has
// reached it (the hang is elsewhere).
std::string describe_laggards(const FlightRecorder& rec, int world_rank, const OpInfo& waited,
                              const std::map<int, std::string>& answers, int world_size,
                              double waited_s);

// Asks the other ranks (up to kAnswerWait) and describes the laggards. "" when nothing is known.
std::string name_laggards(const FlightRecorder& rec, const OpInfo& waited, JobMonitor& monitor,
                          double waited_s);

}  // namespace quintet::detail
