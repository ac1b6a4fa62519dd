// A start-up check that every rank of a communicator runs with the same configuration
// (collectives/consistency.cpp). Ranks started with different settings (mpirun's MPMD form, a
// stale script on one node) otherwise hang in a collective, crash, or silently train diverging
// replicas.
//
//   check_same_on_all_ranks(world.comm(), {{"hidden", "1024"}, {"lr", "3e-4"}, ...}, "my_trainer");
//
// Collective over comm (run it before anything else that communicates, and before any check that
// could fail on one rank only). Two all-gathers: a 64-bit hash per field, then, only when they
// differ, the first differing field's value on every rank. Communicates through comm's device.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "quintet/collectives/communicator.hpp"

namespace quintet {

// Throws InvalidArgument on every rank of comm, naming `what`, the first field whose value is
// not the same on all ranks, and each rank's value (up to 200 characters), when the ranks
// disagree; or when they pass different numbers of fields, or other field names.
void check_same_on_all_ranks(Communicator& comm,
                             const std::vector<std::pair<std::string, std::string>>& fields,
                             const std::string& what);

}  // namespace quintet
