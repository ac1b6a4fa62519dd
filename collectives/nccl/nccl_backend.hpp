// The NCCL backend's entry points, called by bootstrap (private header; built only with NCCL).
//
// Bootstrap makes one unique id on rank 0 (nccl_make_unique_id), sends its bytes to every rank
// by MPI or the TCP store, and each rank then calls nccl_create_communicator with the same bytes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/laggard.hpp"
#include "quintet/collectives/communicator.hpp"

namespace quintet::detail {

class FlightRegistry;
class SplitExchange;

// What an NCCL communicator does beyond moving data. Its splits inherit all but split_exchange;
// their world ranks are those of their members when the split names them (Communicator::split
// with members) or split_exchange finds them, else none.
struct NcclOptions {
  // Bounds initialisation, splits and every wait, and is the watchdog's deadline: an operation
  // not completed timeout_s after it was issued, while no thread waits for it, makes the watchdog
  // dump the flight recorder, abort the communicator and end the process (nccl_communicator.hpp).
  double timeout_s = 300.0;
  // This process's flight recorders (may be null): dumped by the watchdog. With world_ranks (the
  // world rank of each rank of the communicator, size() entries) the communicator records its
  // operations there too, as '<name> (nccl)' (apart from an MPI communicator of the same name and
  // ranks); so do its splits made with members (the Mesh's axes), not those made without.
  std::shared_ptr<FlightRegistry> flight;
  std::vector<int> world_ranks;
  // With world_ranks: an MPI communicator of the same ranks in the same order (split_exchange.hpp)
  // over which a split made without members gathers them, before any NCCL call, so that it records
  // too. quintet::init gives the NCCL world one under mpirun. Not inherited by splits.
  std::shared_ptr<SplitExchange> split_exchange;
  // Ends the process (or the job) after the watchdog has printed its message, dumped and aborted.
  // Default: flush stdout and stderr, then std::_Exit(1). quintet::init passes the job monitor's
  // (it tells the other ranks, then MPI_Abort ends the job).
  std::function<void(const std::string& message)> end_process;
  // With world_ranks: the out-of-band channel over which a rank whose operation timed out (the
  // watchdog's expiry, or a wait's Timeout) asks the other ranks how far they got, to name the one
  // that is behind in its message ("rank 3 never reached all_reduce #12 on 'dp (nccl)' ...",
  // laggard.hpp). quintet::init passes the job monitor's under mpirun; without a query the message
  // says only what may have happened.
  ProgressChannel progress;
};

// The bytes of a fresh ncclUniqueId (NCCL_UNIQUE_ID_BYTES of them). Call on one rank only.
std::vector<char> nccl_make_unique_id();

// Creates this rank's NCCL communicator of `size` ranks on `device` (a CUDA device) from the
// bytes of nccl_make_unique_id. Collective over the `size` ranks; initialisation is non-blocking
// and bounded by timeout_s seconds: a rank that never arrives makes the others throw Timeout
// (naming the rank and size) instead of hanging. `name` is used in messages ("world").
std::unique_ptr<Communicator> nccl_create_communicator(const std::vector<char>& unique_id, int rank,
                                                       int size, const Device& device,
                                                       double timeout_s, const std::string& name);
// The same with options (timeout_s among them). Throws InvalidArgument, before any communication,
// when options.world_ranks is neither empty nor of `size` entries.
std::unique_ptr<Communicator> nccl_create_communicator(const std::vector<char>& unique_id, int rank,
                                                       int size, const Device& device,
                                                       const NcclOptions& options,
                                                       const std::string& name);

}  // namespace quintet::detail
