// Failures become errors on the MPI backend (issue #21): a wait on a collective that one rank
// never joins is a Timeout naming the operation, its sequence number and the communicator, within
// the communicator's deadline; a failure published by one rank (JobMonitor) makes the other ranks'
// waits throw ErrorCode::Remote, "rank k failed: <its message>", within seconds, and their next
// operation fail without entering MPI. The late rank joins at the end, so nothing is left stuck.
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "collectives/mpi/job_monitor.hpp"
#include "collectives/mpi/mpi_communicator.hpp"
#include "quintet/collectives/mpi.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/tensor.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The operation is left to the communicator's thread (the caller waits only once the thread has
// begun running it), so the caller's wait sleeps and can end at its deadline: a caller that runs
// the MPI call itself cannot be interrupted, and there the watchdog ends the job instead
// (tests/reliability). Polls the thread's count, however long a loaded machine makes it wait.
void wait_until_the_thread_started(const Communicator& comm, std::uint64_t operations) {
  const auto* mpi = dynamic_cast<const detail::MpiCommunicator*>(&comm);
  REQUIRE(mpi != nullptr);
  while (mpi->started_by_thread() < operations) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

TEST_CASE("collectives: a wait on a collective one rank never joins is a Timeout",
          "[collectives][reliability]") {
  const int n = world_size(), r = world_rank();
  if (n < 2) return;
  MpiOptions options;
  options.timeout_s = 1.0;
  options.idle_start_delay_us = 0;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, "late", options);
  Tensor t = Tensor::full({4}, 1.0, DType::f32);
  const int late = 0;  // joins only after the others have timed out
  if (r != late) {
    Work work = comm->all_reduce(t);
    wait_until_the_thread_started(*comm, 1);
    const auto t0 = Clock::now();
    bool threw = false;
    try {
      work.synchronize();
    } catch (const Error& e) {
      threw = true;
      const std::string what = e.what();
      INFO(what);
      CHECK(e.code() == ErrorCode::Timeout);
      CHECK(what.find("all_reduce #0 (4 x f32) on communicator 'late'") != std::string::npos);
      CHECK(what.find("did not finish within 1 s") != std::string::npos);
    }
    const double waited = seconds_since(t0);
    CHECK(threw);
    // The deadline, counted from the wait's start (just after t0), and not ten times past it
    // (a deadline read in other units, or not watched while the wait sleeps).
    CHECK(waited >= options.timeout_s);
    CHECK(waited < 10 * options.timeout_s);
    // The communicator is poisoned: what comes next fails at once, naming the timeout.
    REQUIRE_THROWS_QUINTET(comm->barrier().synchronize(), Aborted, "timed out: all_reduce #0");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == late) {
    comm->all_reduce(t).synchronize();  // frees the others' operation
    CHECK(t.item({0}) == static_cast<double>(n));
    // (The others' barrier failed without a call to MPI: nothing to match.)
  }
  comm.reset();  // a broken communicator does not wait long for its thread
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("collectives: a failure published by one rank fails the others' waits with its name",
          "[collectives][reliability]") {
  const int n = world_size(), r = world_rank();
  if (n < 2) return;
  auto monitor = std::make_shared<detail::JobMonitor>(MPI_COMM_WORLD);
  MpiOptions options;
  options.timeout_s = 60.0;  // the failure, not the deadline, ends the waits below
  options.idle_start_delay_us = 0;
  options.monitor = monitor;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, "dp", options);
  Tensor t = Tensor::full({3}, 2.0, DType::f32);
  const int failing = n - 1;
  // A wait that the failure ends is over well before the deadline: within the failing rank's
  // wait for acknowledgements (which every wait below precedes), far less than the deadline.
  const double bound_s = std::chrono::duration<double>(detail::JobMonitor::kAckWait).count();
  REQUIRE(bound_s < options.timeout_s / 4);
  if (r != failing) {
    Work work = comm->all_reduce(t);
    wait_until_the_thread_started(*comm, 1);
    MPI_Barrier(MPI_COMM_WORLD);  // the failing rank publishes after this
    const auto t0 = Clock::now();
    const std::string want = "rank " + std::to_string(failing) + " failed: injected: bad token";
    REQUIRE_THROWS_QUINTET(work.synchronize(), Remote, want);
    CHECK(seconds_since(t0) < bound_s);
    CHECK(monitor->failed());
    CHECK(monitor->remote_error().find(want) != std::string::npos);
    // The next operation fails at once, without entering MPI (its peers may never come).
    const auto t1 = Clock::now();
    REQUIRE_THROWS_QUINTET(comm->barrier().synchronize(), Remote, want);
    CHECK(seconds_since(t1) < bound_s);
    monitor->acknowledge();  // printed: the failing rank may end the job
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    CHECK(monitor->publish("injected: bad token"));  // every other rank acknowledged in time
    CHECK(seconds_since(t0) < bound_s + 1.0);  // publish's own bound (kAckWait), and its sends
    CHECK_FALSE(monitor->failed());            // its own failure is not a remote one
    CHECK(monitor->failing());
    comm->all_reduce(t).synchronize();  // frees the others' operation
    CHECK(t.item({0}) == 2.0 * n);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  comm.reset();
  monitor.reset();
  MPI_Barrier(MPI_COMM_WORLD);
}
