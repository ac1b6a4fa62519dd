// The sampler across real ranks: each rank computes its own samples; gathered on every rank,
// one epoch's samples are every window exactly once, and a resume at another data-parallel size
// reads the rest of the epoch exactly once.
#include <mpi.h>

#include <vector>

#include "support/catch.hpp"

#include "quintet/data/sampler.hpp"

using namespace quintet::data;

namespace {

// Every rank's windows of epoch 0 (among `steps` steps from start), gathered on all ranks.
std::vector<std::uint64_t> gather_epoch0(std::uint64_t W, std::int64_t B, SamplerState start,
                                         std::uint64_t steps, int rank, int size) {
  SamplerConfig c;
  c.seed = 31337;
  c.batch_size = B;
  c.dp_rank = rank;
  c.dp_size = size;
  c.start = start;
  const Sampler s(W, c);
  std::vector<std::uint64_t> mine;
  for (std::uint64_t n = 0; n < steps; ++n) {
    for (const SampleRef& r : s.batch(n)) {
      if (r.epoch == 0) mine.push_back(r.window);
    }
  }
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int i = 0; i < size; ++i) {
    displs[static_cast<std::size_t>(i)] = total;
    total += counts[static_cast<std::size_t>(i)];
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(total));
  MPI_Allgatherv(mine.data(), count, MPI_UINT64_T, all.data(), counts.data(), displs.data(),
                 MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

}  // namespace

TEST_CASE("one epoch over all ranks reads every window exactly once") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (std::uint64_t W : {1000, 1021}) {
    const std::int64_t B = 7;
    const std::uint64_t steps = W / (B * size) + 1;
    const auto all = gather_epoch0(W, B, {}, steps, rank, size);
    std::vector<int> seen(W, 0);
    for (std::uint64_t w : all) ++seen[w];
    for (std::uint64_t w = 0; w < W; ++w) REQUIRE(seen[w] == 1);
  }
}

TEST_CASE("resuming at another data-parallel size covers the rest of the epoch exactly once") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::uint64_t W = 999;
  const std::int64_t B = 5;
  // Phase 1 as if run on 2 ranks for 37 steps (computed on every rank, no communication).
  SamplerConfig c;
  c.seed = 31337;
  c.batch_size = B;
  c.dp_size = 2;
  std::vector<int> seen(W, 0);
  for (int r = 0; r < 2; ++r) {
    c.dp_rank = r;
    const Sampler s(W, c);
    for (std::uint64_t n = 0; n < 37; ++n) {
      for (const SampleRef& ref : s.batch(n)) ++seen[ref.window];
    }
  }
  const SamplerState state = Sampler(W, c).state_after(37);
  REQUIRE(state.sample_index == 370);
  // Phase 2 on this run's ranks.
  const std::uint64_t steps = (W - 370) / (B * size) + 1;
  for (std::uint64_t w : gather_epoch0(W, B, state, steps, rank, size)) ++seen[w];
  for (std::uint64_t w = 0; w < W; ++w) REQUIRE(seen[w] == 1);
}
