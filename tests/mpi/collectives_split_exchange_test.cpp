// SplitExchange (issue #44): the members of a split, gathered over MPI for an NCCL split made
// without them, are MPI_Comm_split's own groups in its order for several colorings; a rank that
// never takes part is a Timeout within the bound, after which the exchange refuses to run again.
#include <mpi.h>

#include <chrono>
#include <numeric>
#include <vector>

#include "collectives/split_exchange.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::detail;

namespace {

// The members MPI_Comm_split gives this rank: its group's ranks of MPI_COMM_WORLD, in order.
std::vector<int> mpi_members(int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &sub);
  if (sub == MPI_COMM_NULL) return {};
  int n = 0;
  MPI_Comm_size(sub, &n);
  MPI_Group group, world;
  MPI_Comm_group(sub, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<std::size_t>(n)), out(ranks.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  MPI_Group_translate_ranks(group, n, ranks.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  MPI_Comm_free(&sub);
  return out;
}

}  // namespace

TEST_CASE("the members are MPI_Comm_split's groups, in its order") {
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  SplitExchange exchange(MPI_COMM_WORLD);
  CHECK(exchange.size() == n);
  struct Coloring {
    const char* what;
    int color, key;
  };
  const Coloring colorings[] = {
      {"one group, by rank", 0, me},
      {"one group, reversed", 0, n - me},
      {"parity, equal keys (then by rank)", me % 2, 0},
      {"rank 0 in none, the rest reversed", me == 0 ? -1 : 5, -me},
      {"pairs", me / 2, me % 2 == 0 ? 1 : 0},
  };
  for (const Coloring& c : colorings) {
    INFO(c.what);
    const std::vector<int> got = exchange.members(c.color, c.key, 30, c.what);
    CHECK(got == mpi_members(c.color, c.key));
  }
}

TEST_CASE("a rank that does not take part is a Timeout, and the exchange is then refused") {
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) return;
  SplitExchange exchange(MPI_COMM_WORLD);
  if (me == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE_THROWS_QUINTET(exchange.members(0, 0, 0.5, "split into 'x'"), Timeout,
                           "split into 'x': the exchange of the split's members");
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK((took >= 0.5 && took < 10));
    REQUIRE_THROWS_QUINTET(exchange.members(0, 0, 0.5, "split into 'y'"), Aborted,
                           "timed out before");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The others take part late, so that rank 0's pending gather completes.
  if (me != 0) CHECK(exchange.members(0, me, 30, "late").size() == static_cast<std::size_t>(n));
  MPI_Barrier(MPI_COMM_WORLD);
}
