// Communicators over MPI (CPU tensors) and for groups of one rank, for programs that manage MPI
// themselves. Most programs get theirs from quintet::init() (bootstrap.hpp) instead. Implemented by
// collectives/mpi/mpi_communicator.cpp and collectives/self/self_communicator.cpp.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>

#include "quintet/collectives/communicator.hpp"

namespace quintet {

namespace detail {
class JobMonitor;
class FlightRegistry;
}  // namespace detail

struct MpiOptions {
  // The deadline of every Work::wait/synchronize (a Timeout error past it), and how long
  // destruction waits for queued operations before leaving the progress thread behind (a peer
  // that never arrives must not hang the program).
  double timeout_s = 300.0;
  // Largest number of elements passed to one MPI call: larger operations are split into pieces of
  // at most this many (MPI counts are int). Lower it only to test the split paths.
  std::int64_t max_chunk_elements = INT_MAX;
  // How long the progress thread, woken from idle by a new operation, leaves it for its caller to
  // run (by waiting for it) before starting it itself, in microseconds; 0 starts it at once.
  double idle_start_delay_us = 50.0;
  // The job's failure channel, through which another rank's failure makes this communicator's
  // waits throw ErrorCode::Remote. quintet::init sets it on the world communicators (their splits
  // inherit it); null for communicators made directly.
  std::shared_ptr<detail::JobMonitor> monitor;
  // The flight recorder: each communicator keeps its last operations (RuntimeConfig::flight_size,
  // docs/reliability.md). With a registry (quintet::init sets one; splits inherit it) they are
  // dumped together and its capacity wins; without one, flight_size operations are kept for the
  // timeout messages only.
  std::shared_ptr<detail::FlightRegistry> flight;
  std::size_t flight_size = 2048;
};

// A communicator over the ranks of comm (MPI_Comm_dup'ed: comm stays the caller's). Collective
// over comm. MPI must be initialised with MPI_THREAD_MULTIPLE (throws InvalidArgument otherwise).
// Moves CPU tensors; each communicator owns one progress thread running its operations in order.
// A comm of one rank gives the Self backend.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& name,
                                                    const MpiOptions& options = {});

// A one-rank communicator moving tensors of device: every operation is a local copy on the
// caller's stream (none when in == out); Work completes at once.
std::unique_ptr<Communicator> make_self_communicator(const Device& device, const std::string& name);

// The MPI datatype the MPI backend moves one element of dtype as (bf16, f16 and u16 travel as
// MPI_UINT16_T, so counts stay in elements), for programs that issue MPI calls on Quintet tensors.
MPI_Datatype mpi_datatype(DType dtype);
// The MPI op the MPI backend reduces dtype with (avg maps to the sum: divide afterwards). For bf16
// and f16, which MPI lacks, user-defined ops that reduce through float and round once per step
// (as a GPU would), created on first use and freed by MPI_Finalize. Needs an initialised MPI.
MPI_Op mpi_op(DType dtype, ReduceOp op);

}  // namespace quintet
