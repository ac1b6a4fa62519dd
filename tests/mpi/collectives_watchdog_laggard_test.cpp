// The NCCL watchdog's expiry names the rank that is behind (issue #44), driven on the CPU: what
// NcclState::expired does before it aborts, without the GPU. Each rank records the world's
// operations as 'world (nccl)' in a FlightRegistry that its JobMonitor answers from (as
// quintet::init's NCCL world does under mpirun); all complete all_reduce #1; every rank but the
// last issues #2 to a Watchdog (1 s timeout) as an operation that never completes, and its expiry
// handler asks the others over progress_channel(monitor) (name_laggards) and words the message
// (expiry_message), as nccl_state.cpp does. The last rank either withholds #2 and goes on
// answering ("rank k never reached all_reduce #2 on 'world (nccl)' ... (ranks ... waited 1 s)"), or
// is stopped (SIGSTOP; "... does not answer: it is stopped or dead"), where the exchange must end
// within its own bound. The stopped rank is continued afterwards, so nothing is left behind.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/flight_recorder.hpp"
#include "collectives/laggard.hpp"
#include "collectives/mpi/job_monitor.hpp"
#include "collectives/watchdog.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::detail;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTimeout = 1s;
constexpr auto kPeriod = 100ms;

// This rank's place in MPI_COMM_WORLD.
struct Place {
  int rank = 0;
  int size = 1;
  Place() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

// An NCCL operation as the watchdog holds it: complete once `done`; retiring it marks it
// completed in the recorder (NcclWork::retired).
class HeldOp final : public Watchdog::Op {
 public:
  HeldOp(std::shared_ptr<FlightRecorder> rec, std::int64_t seq, std::string describe)
      : rec_(std::move(rec)), seq_(seq), describe_(std::move(describe)) {}
  bool poll() noexcept override { return done.load(); }
  void retired() noexcept override { rec_->completed(seq_, true); }
  std::string describe() const override { return describe_; }
  std::atomic<bool> done{false};

 private:
  std::shared_ptr<FlightRecorder> rec_;
  std::int64_t seq_;
  std::string describe_;
};

struct Expiry {
  std::string message;
  double after_s = 0;  // from the operation's issue to the message
};

// Issues all_reduce #2 on rec to a watchdog and waits (bounded) for its expiry, handled as
// NcclState::expired handles it; then lets the operation complete.
Expiry expire_all_reduce_2(const std::shared_ptr<FlightRecorder>& rec,
                           const ProgressChannel& channel) {
  const double timeout_s = std::chrono::duration<double>(kTimeout).count();
  rec->enqueued(2, "all_reduce", DType::f32, 4096, -1);
  const Place place;
  auto op = std::make_shared<HeldOp>(rec, 2,
                                     "all_reduce #2 on communicator 'world' (nccl, rank " +
                                         std::to_string(place.rank) + " of " +
                                         std::to_string(place.size) + ", cuda:0)");
  std::mutex mutex;
  std::condition_variable cv;
  std::optional<Expiry> expiry;
  const auto t0 = Clock::now();
  Watchdog dog(
      "world", kTimeout, kPeriod, [&](Watchdog::Op& held, std::chrono::nanoseconds pending) {
        const std::string laggards = name_laggards(*rec, "all_reduce", 2, -1, channel, timeout_s);
        const std::string message = expiry_message(
            held.describe(), timeout_s, std::chrono::duration<double>(pending).count(), laggards);
        std::lock_guard lock(mutex);
        expiry = Expiry{message, std::chrono::duration<double>(Clock::now() - t0).count()};
        cv.notify_all();
        return true;
      });
  dog.add(op);
  {
    std::unique_lock lock(mutex);
    cv.wait_for(lock, 30s, [&] { return expiry.has_value(); });
  }
  op->done = true;
  CHECK(dog.stop().empty());
  REQUIRE(expiry.has_value());
  return *expiry;
}

// The world ranks before `late`: "rank 0" or "ranks 0-1".
std::string waiting_ranks(int late) {
  return late == 1 ? "rank 0" : "ranks " + rank_list([&] {
                                  std::vector<int> r;
                                  for (int i = 0; i < late; ++i) r.push_back(i);
                                  return r;
                                }());
}

// A registry, its recorder of 'world (nccl)' over every rank, and the monitor that answers from
// it; all_reduce #1 completed on every rank.
struct Job {
  std::shared_ptr<FlightRegistry> registry;
  std::shared_ptr<FlightRecorder> rec;
  std::shared_ptr<JobMonitor> monitor;
  Job() {
    const Place place;
    const auto dir = std::filesystem::temp_directory_path() /
                     ("quintet_watchdog_laggard_" + std::to_string(::getpid()));
    registry = std::make_shared<FlightRegistry>(place.rank, place.size, dir.string(), 16);
    std::vector<int> members(static_cast<std::size_t>(place.size));
    for (int i = 0; i < place.size; ++i) members[static_cast<std::size_t>(i)] = i;
    rec = std::make_shared<FlightRecorder>("world (nccl)", place.rank, members, 16);
    registry->add(rec);
    monitor = std::make_shared<JobMonitor>(MPI_COMM_WORLD, registry);
    rec->enqueued(1, "all_reduce", DType::f32, 4096, -1);
    rec->completed(1, true);
  }
};

bool is_stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
}

}  // namespace

TEST_CASE("the watchdog's expiry names the rank that never issued the operation",
          "[collectives][reliability]") {
  const Place place;
  const int n = place.size, r = place.rank;
  if (n < 2) return;
  const int late = n - 1;
  Job job;
  MPI_Barrier(MPI_COMM_WORLD);
  if (r != late) {
    const Expiry e = expire_all_reduce_2(job.rec, progress_channel(job.monitor));
    INFO(e.message);
    CHECK(e.message.find("all_reduce #2 on communicator 'world' (nccl, rank " + std::to_string(r) +
                         " of " + std::to_string(n) +
                         ", cuda:0) did not complete within 1 s of being issued") == 0);
    CHECK(e.message.find(": rank " + std::to_string(late) +
                         " never reached all_reduce #2 on 'world (nccl)' (it has issued up to #1 "
                         "there; it waits for no operation) (" +
                         waiting_ranks(late) + " waited 1 s); the watchdog aborts") !=
          std::string::npos);
    // The deadline, a period, and the answers of ranks that are alive (a poll each).
    CHECK(e.after_s >= 1.0);
    CHECK(e.after_s < 1.0 + 0.1 + 1.5);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the late rank's monitor answers meanwhile
}

TEST_CASE("a stopped rank is named as stopped or dead, within the exchange's bound",
          "[collectives][reliability]") {
  const Place place;
  const int n = place.size, r = place.rank;
  if (n < 2) return;
  const int late = n - 1;
  pid_t late_pid = ::getpid();
  MPI_Bcast(&late_pid, sizeof late_pid, MPI_BYTE, late, MPI_COMM_WORLD);
  MPI_Comm waiting = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r == late ? MPI_UNDEFINED : 0, r, &waiting);
  Job job;
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == late) {
    ::raise(SIGSTOP);  // until rank 0 continues it, once every other rank has its message
  } else {
    const auto t0 = Clock::now();
    while (!is_stopped(late_pid)) {
      REQUIRE(Clock::now() - t0 < 30s);
      std::this_thread::sleep_for(1ms);
    }
    const Expiry e = expire_all_reduce_2(job.rec, progress_channel(job.monitor));
    INFO(e.message);
    CHECK(e.message.find(": rank " + std::to_string(late) +
                         " has not completed all_reduce #2 on 'world (nccl)' and does not answer: "
                         "it is stopped or dead (" +
                         waiting_ranks(late) + " waited 1 s); the watchdog aborts") !=
          std::string::npos);
    // The exchange waited its whole bound for the stopped rank, and no longer.
    const double answer_wait_s = std::chrono::duration<double>(kLaggardAnswerWait).count();
    CHECK(e.after_s >= 1.0 + answer_wait_s);
    CHECK(e.after_s < 1.0 + 0.1 + answer_wait_s + 1.5);
    MPI_Barrier(waiting);
    if (r == 0) CHECK(::kill(late_pid, SIGCONT) == 0);
    MPI_Comm_free(&waiting);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
