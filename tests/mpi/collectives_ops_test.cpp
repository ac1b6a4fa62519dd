// Every Communicator operation x every dtype x sizes 0, 1, odd and ~1 MiB on the MPI world
// communicator, and again with MPI calls split into small chunks (the path of counts > INT_MAX).
#include <mpi.h>

#include "collectives_suite.hpp"
#include "quintet/collectives/mpi.hpp"

using namespace quintet;
using namespace quintet::test;

TEST_CASE("every operation on the world communicator matches the reference") {
  World world = cpu_world();
  Communicator& c = world.comm();
  REQUIRE(c.size() == world.size());
  REQUIRE(c.backend() == (world.size() == 1 ? Backend::self : Backend::mpi));
  run_suite(c, 1000);
}

TEST_CASE("operations split into chunks of a few elements match the reference") {
  // max_chunk_elements = 7: every count above 7 takes the split path used for counts > INT_MAX.
  auto c = make_mpi_communicator(MPI_COMM_WORLD, "chunked", MpiOptions{60.0, 7});
  run_suite(*c, 5000, {0, 1, 7, 8, 61});
}
