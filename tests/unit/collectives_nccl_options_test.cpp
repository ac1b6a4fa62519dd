// The NCCL backend's options are checked before any communication, on any machine (no GPU is
// touched): world ranks that do not give one per rank are refused, naming both counts.
#include <nccl.h>

#include <vector>

#include "collectives/nccl/nccl_backend.hpp"
#include "support/catch.hpp"

using namespace quintet;

TEST_CASE("world ranks that are not one per rank are refused before NCCL is called") {
  const std::vector<char> id(NCCL_UNIQUE_ID_BYTES, 0);
  detail::NcclOptions options;
  options.timeout_s = 1;
  options.world_ranks = {0};
  REQUIRE_THROWS_QUINTET(detail::nccl_create_communicator(id, 0, 2, Device::cuda(0), options, "dp"),
                         InvalidArgument, "1 world ranks given for its 2 ranks");
  options.world_ranks = {0, 1, 2};
  REQUIRE_THROWS_QUINTET(detail::nccl_create_communicator(id, 1, 2, Device::cuda(0), options, "dp"),
                         InvalidArgument, "3 world ranks given for its 2 ranks");
  // Given right, the next check (a CPU device here) is the one that refuses.
  options.world_ranks = {4, 6};
  REQUIRE_THROWS_QUINTET(detail::nccl_create_communicator(id, 1, 2, Device::cpu(), options, "dp"),
                         InvalidArgument, "not a GPU");
}
