// Naming the laggard: when an operation on a communicator times out (an MPI wait, the NCCL
// watchdog or an NCCL wait), the rank asks every other rank (over the out-of-band channel that
// carries the first error: JobMonitor::query_progress under mpirun) how far each of its
// communicators has got, and says who is behind instead of "a rank may not have issued the
// matching operation":
//
//   rank 3 never reached all_reduce #2788 on 'pp' (it has issued up to #2787 there; it waits for
//   nothing) (ranks 0-2 waited 15 s)
//   rank 5 has not completed send #12 on 'pp' and does not answer: it is stopped or dead
//
// A rank's report lists each communicator of its FlightRegistry on one line: name, the world
// ranks of its members, the highest sequence number enqueued, started and completed, and the
// first operation not completed (its name, sequence number and how long ago it was enqueued).
//
// The decision is a pure function of what the stuck rank knows (StuckOp) and the reports it got
// (find_laggards), the sentence another (describe_laggards); name_laggards asks and calls both,
// over any channel (ProgressChannel). Both backends call it: the MPI one's waits and watchdog
// (progress_thread.cpp), the NCCL one's watchdog expiry and waits (nccl_state.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/flight_recorder.hpp"

namespace quintet::detail {

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

// What a rank whose operation timed out knows: its communicator (the recorder's name and the world
// ranks of its members), its own world rank, and the first operation it has not completed there
// (name, sequence number, peer or root as a rank of the communicator, -1: none).
struct StuckOp {
  std::string comm;
  std::vector<int> members;
  int world_rank = 0;
  std::string op;
  std::int64_t seq = -1;
  int peer = -1;
};

// The StuckOp of rec: its first operation not completed. `waited` (name, seq, peer) is the
// operation the rank waited for; when that is not the first one, name and peer come from the ring
// ("operation", -1 when the ring no longer holds it).
StuckOp stuck_op(const FlightRecorder& rec, int world_rank, std::string_view waited_op,
                 std::int64_t waited_seq, int waited_peer);

// A member of the stuck communicator that the others wait for.
struct Laggard {
  enum class Why {
    never_reached,    // it answered: it has issued only up to `issued` there
    silent,           // it did not answer: stopped or dead (they cannot be told apart)
    no_communicator,  // it answered, and has no communicator of that name and members
    idle_peer,        // the peer of a send/recv/p2p, with nothing pending there
  };
  int rank = -1;
  Why why = Why::silent;
  std::int64_t issued = -1;     // never_reached: the highest sequence number it has enqueued
  std::int64_t completed = -1;  // idle_peer: the highest it has completed
  std::string elsewhere;        // when it answered: "it waits for <op> #<seq> on '<comm>' (N s)"
};

struct LaggardVerdict {
  std::vector<Laggard> behind;  // in the order of the members
  std::vector<int> waiting;     // world ranks waiting on the operation too, the stuck rank first
  std::vector<int> silent;      // ranks of the job outside the communicator that did not answer
};

// Who is behind on stuck's operation, from the other ranks' reports (world rank -> its parsed
// report; a rank absent did not answer) in a job of world_size ranks. A collective waits for every
// member, a point-to-point operation (send, recv, p2p) for its peer only. `behind` is empty when
// every member waited for has reached the operation (the hang is elsewhere). Pure.
LaggardVerdict find_laggards(const StuckOp& stuck,
                             const std::map<int, std::vector<CommProgress>>& reports,
                             int world_size);

// The sentence for a verdict: "rank 3 never reached all_reduce #4 on 'pp' (...) (ranks 0-2 waited
// 15 s); ..."; "" when nobody is behind.
std::string describe_laggards(const StuckOp& stuck, const LaggardVerdict& verdict, double waited_s);

// The out-of-band channel the ranks compare their progress over: this rank's place in the job and
// a query that asks every other rank for its progress_report, waiting up to `wait` (world rank ->
// report; a rank that did not answer is absent). The query must never throw and never wait longer
// than `wait`. JobMonitor's (progress_channel in job_monitor.hpp) under mpirun.
struct ProgressChannel {
  int world_rank = 0;
  int world_size = 1;
  std::function<std::map<int, std::string>(std::chrono::milliseconds wait)> query;
};

// How long a rank whose operation timed out waits for the others' reports: a JobMonitor answers
// within a poll (20 ms) unless its rank is stopped or dead, and those never do.
constexpr std::chrono::milliseconds kLaggardAnswerWait{2000};

// Asks over channel (at most kLaggardAnswerWait) and describes who is behind on rec's first
// operation not completed (see stuck_op for `waited_*`); waited_s: how long this rank waited (for
// the message). "" when nobody is known to be behind or the channel has no query. Never throws.
std::string name_laggards(const FlightRecorder& rec, std::string_view waited_op,
                          std::int64_t waited_seq, int waited_peer, const ProgressChannel& channel,
                          double waited_s) noexcept;

}  // namespace quintet::detail
