// check_same_on_all_ranks under mpirun (quintet/collectives/consistency.hpp): the same settings
// pass; a value that differs on one rank is refused on every rank, naming the field and each
// rank's value; a different set of fields is refused; too many fields are refused before any
// communication.
#include <string>
#include <vector>

#include "quintet/collectives/consistency.hpp"
#include "quintet/core/error.hpp"
#include "tp_support.hpp"  // cpu_world

using namespace quintet;
using tp_test::cpu_world;

TEST_CASE("collectives: every rank with the same settings, or a clear error on all of them",
          "[collectives]") {
  World world = cpu_world();
  Communicator& comm = world.comm();
  const int n = comm.size(), r = comm.rank();
  std::vector<std::pair<std::string, std::string>> same = {
      {"--hidden", "64"}, {"--lr", "0.001"}, {"--data", "a,b"}};
  check_same_on_all_ranks(comm, same, "test");  // no throw

  if (n > 1) {
    // The last rank was started with another --lr.
    auto lr = same;
    if (r == n - 1) lr[1].second = "0.002";
    std::string want = "different values of --lr (";
    for (int k = 0; k < n; ++k) {
      want += (k ? ", rank " : "rank ") + std::to_string(k) + ": \"" +
              (k == n - 1 ? "0.002" : "0.001") + "\"";
    }
    REQUIRE_THROWS_QUINTET(check_same_on_all_ranks(comm, lr, "test"), InvalidArgument, want);
    // Another set of fields on rank 0.
    auto fewer = same;
    if (r == 0) fewer.pop_back();
    REQUIRE_THROWS_QUINTET(check_same_on_all_ranks(comm, fewer, "test"), InvalidArgument,
                           "another set of settings");
  }
  std::vector<std::pair<std::string, std::string>> many(300, {"--x", "1"});
  REQUIRE_THROWS_QUINTET(check_same_on_all_ranks(comm, many, "test"), InvalidArgument,
                         "at most 254 fields");
  comm.barrier().wait();  // every rank is here: no collective was left half done
}
