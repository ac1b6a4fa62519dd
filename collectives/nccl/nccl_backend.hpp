// The NCCL backend's entry points, called by bootstrap (private header; built only with NCCL).
//
// Bootstrap makes one unique id on rank 0 (nccl_make_unique_id), sends its bytes to every rank
// by MPI or the TCP store, and each rank then calls nccl_create_communicator with the same bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "quintet/collectives/communicator.hpp"

namespace quintet::detail {

// The bytes of a fresh ncclUniqueId (NCCL_UNIQUE_ID_BYTES of them). Call on one rank only.
std::vector<char> nccl_make_unique_id();

// Creates this rank's NCCL communicator of `size` ranks on `device` (a CUDA device) from the
// bytes of nccl_make_unique_id. Collective over the `size` ranks; initialisation is non-blocking
// and bounded by timeout_s seconds: a rank that never arrives makes the others throw Timeout
// (naming the rank and size) instead of hanging. `name` is used in messages ("world").
std::unique_ptr<Communicator> nccl_create_communicator(const std::vector<char>& unique_id, int rank,
                                                       int size, const Device& device,
                                                       double timeout_s, const std::string& name);

}  // namespace quintet::detail
