// Placement at start-up: quintet::init's step that reads this rank's topology, exchanges it with
// every rank and binds the calling thread (core/topology.hpp; docs/topology.md).
#pragma once

#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/topology.hpp"

namespace quintet::detail {

class TcpStoreClient;

// Every rank's facts, indexed by rank, with placed_cpus planned for config.cpu_affinity; with
// automatic, the calling thread is bound to this rank's placed_cpus, so every thread it starts
// afterwards runs there. Collective over the job: MPI_Allgatherv on MPI_COMM_WORLD under MPI, the
// TCP store (store, not null then) for the env launcher of more than one rank.
std::vector<RankTopology> place_this_rank(const LaunchInfo& info, const Device& device,
                                          const RuntimeConfig& config, TcpStoreClient* store);

}  // namespace quintet::detail
