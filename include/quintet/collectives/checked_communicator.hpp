// The collective-consistency debug mode (--check-collectives / QUINTET_CHECK_COLLECTIVES=1): a
// Communicator that, before each operation reaches the backend, exchanges a fingerprint of it
// with the other ranks, so that ranks issuing different collectives fail at once with an error
// naming both, instead of hanging or corrupting memory inside NCCL or MPI.
//
//   quintet::World world = quintet::init(argc, argv);   // with --check-collectives
//   world.comm().all_reduce(t);   // every rank's fingerprint compared before MPI/NCCL is called
//
// quintet::init wraps the world communicators when RuntimeConfig::check_collectives is set (their
// splits, hence the mesh's axes, are checked too); programs that make their own communicators wrap
// them with make_checked_communicator.
//
// What is compared. A fingerprint is (op, dtype, count, reduce op, root, sequence number):
//   - Collectives (all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all,
//     all_to_all_v, barrier, split): every rank sends its fingerprint to every other rank and
//     compares the ones it receives with its own; the sequence number counts the collectives of
//     the communicator from 0. Counts are per rank (all_gather: the input; reduce_scatter: the
//     output); for all_to_all_v, what rank i sends to rank j must be what j expects from i.
//   - Point-to-point (send, recv, p2p): each send carries its fingerprint to the peer, whose
//     receive compares it with its own (dtype, count) before receiving the data. A send does not
//     wait; a receive waits for its sender's fingerprint.
//   Fingerprints from one rank to another arrive in the order it issued them, so a rank that
//   issues a send where its peer expects a collective (or the reverse) is a mismatch too.
//
// What happens:
//   - A mismatch: quintet::Error InvalidArgument, thrown by the operation's call on every rank
//     that sees it (every rank, for a collective), naming the communicator, the sequence number,
//     this rank and its fingerprint, the other rank and its fingerprint. Nothing of the operation
//     was sent: the communicator stays usable.
//   - A rank that does not arrive within options.timeout_s (it skipped the operation, or is
//     stopped): ErrorCode::Timeout, "rank k never reached seq s on '<name>'", naming what this
//     rank issued. The communicator is then broken: later operations throw Aborted.
//   - Another rank of the job fails meanwhile (options.monitor): ErrorCode::Remote at once.
// Inputs are validated (as the backends do) before the exchange, so a rank with a bad tensor
// fails alone with its own message and the others report that it never reached the operation.
//
// Cost: every operation becomes a synchronisation point at issue (the host waits until the
// other ranks have issued it too; on the GPU, before the NCCL call is enqueued), plus 2 (size-1)
// small MPI messages per rank per collective over a duplicated MPI communicator (the side
// channel, on which nothing else travels). examples/01_collective_bench --check-overhead
// measures it. Off (the default), nothing is wrapped and nothing is paid.
//
// Ownership and threads: the checked communicator owns the inner one; Works, results and errors
// are the inner communicator's. Not thread-safe (as Communicator): issue from one thread at a time.
#pragma once

#include <mpi.h>

#include <memory>

#include "quintet/collectives/communicator.hpp"

namespace quintet {

namespace detail {
class JobMonitor;
}  // namespace detail

struct CollectiveCheckOptions {
  // How long an operation waits for the other ranks' fingerprints, in seconds (quintet::init
  // passes RuntimeConfig::timeout_s).
  double timeout_s = 300.0;
  // The job's failure channel: another rank's failure ends a wait with ErrorCode::Remote (null:
  // none). quintet::init sets it.
  std::shared_ptr<detail::JobMonitor> monitor;
};

// inner, with every operation checked as above. ranks is an MPI communicator of the same ranks
// in the same order (rank r of ranks is rank r of inner; for a world communicator,
// MPI_COMM_WORLD); it is duplicated for the side channel and stays the caller's. Collective over
// ranks. A group of one rank is returned unwrapped (nothing to compare). Splits of the result are
// checked too. Throws InvalidArgument when ranks and inner differ in size or rank, or MPI is not
// initialised with MPI_THREAD_MULTIPLE.
std::unique_ptr<Communicator> make_checked_communicator(std::unique_ptr<Communicator> inner,
                                                        MPI_Comm ranks,
                                                        const CollectiveCheckOptions& options = {});

// True when comm is a communicator made by make_checked_communicator (or split from one).
bool checks_collectives(const Communicator& comm);

// How many operations the checked communicators of this process have compared with their peers
// and found matching, since it started: each collective once, each receive once (a send is
// compared at its receiver). The evidence that the check ran: a program with it on reports this
// (examples/04_gpt_train's "checked_operations"); 0 when nothing is checked.
std::int64_t checked_operations();

}  // namespace quintet
