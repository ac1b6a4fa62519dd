// The data loader's configuration for one rank of a mesh
// (parallel/data_parallel/loader_for_mesh.cpp): its data-parallel replica is the mesh's, so the
// loader cannot be pointed at the wrong coordinates.
//
// Every rank of one replica (its tp, pp, cp and ep ranks, which hold parts of one model copy)
// must read the same batches, and the replicas must read different ones: the sampler's dp_rank and
// dp_size are the mesh's Axis::dp coordinates (context-parallel ranks read the same sequences and
// each keep their part of them).
#pragma once

#include "quintet/collectives/communicator.hpp"
#include "quintet/data/loader.hpp"
#include "quintet/parallel/mesh.hpp"

namespace quintet::data_parallel {

// config with dp_rank = mesh.rank(Axis::dp) and dp_size = mesh.size(Axis::dp). Throws
// InvalidArgument when config already holds other data-parallel coordinates (set by hand: a tp
// rank passed as the dp rank, say), naming both.
data::LoaderConfig loader_config_for(const Mesh& mesh, data::LoaderConfig config);

// A debug check (a trainer's --check-batches) that the ranks of group, which must read the same
// data (the tp ranks of one replica's stage), hold the same tokens: a 64-bit checksum of the
// tensor's bytes, all-gathered over group. Throws InvalidArgument on every rank of group when two
// differ, naming the ranks (of group) and their checksums. Collective over group, on stream (on
// the group's device); synchronises stream (the checksum is taken on the host).
void check_same_batch(Communicator& group, const Tensor& tokens, const Stream& stream = Stream());

}  // namespace quintet::data_parallel
