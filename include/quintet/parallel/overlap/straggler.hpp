// Stragglers: which rank arrived last at the collectives of a traced window, from the trace
// recorder's events (quintet/core/trace.hpp) of every rank.
//
// A rank's arrival at a collective is when its side of the operation could begin: on the CPU the
// host clock at issue (TraceEvent::issue_us), on the GPU the operation's start on the comm stream
// (start_us: the caller's stream has reached it and the comm stream is free). Times are made
// comparable across ranks by each rank's clock_sync_us, the host clock read just after a common
// barrier. For each communicator of the mesh (one per axis; each group compared on its own), the
// collectives every rank of the group has in its trace are matched by their sequence number, and
// the rank with the latest arrival is counted; point-to-point transfers are not compared.
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/trace.hpp"
#include "quintet/parallel/mesh.hpp"

namespace quintet::overlap {

struct StragglerReport {
  std::vector<std::int64_t> last_at;  // per world rank: the collectives it arrived last at
  std::int64_t collectives = 0;       // collectives compared (each once, whatever its group size)
  // The rank that arrived last most often (the lowest such rank), or -1 when none was compared.
  int straggler() const;
};

// Collective over world (every rank of the mesh calls it, with its own events); the same report
// on every rank. stream orders the small exchanges on a GPU.
StragglerReport find_stragglers(const Mesh& mesh, Communicator& world,
                                const std::vector<trace::TraceEvent>& events, double clock_sync_us,
                                const Stream& stream);

}  // namespace quintet::overlap
