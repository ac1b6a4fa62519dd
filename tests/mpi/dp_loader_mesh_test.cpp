// The loader configured from the mesh (quintet/parallel/data_parallel/loader_for_mesh.hpp) under
// mpirun: every rank of one data-parallel replica (its tp and pp ranks) gets the same batches from
// a real DataLoader, and different replicas get different ones; coordinates set by hand that
// disagree with the mesh are refused; check_same_batch finds tp ranks that hold different tokens.
#include <string>
#include <vector>

#include "quintet/data/synthetic.hpp"
#include "quintet/parallel/data_parallel/loader_for_mesh.hpp"
#include "tp_support.hpp"  // cpu_world

using namespace quintet;
using tp_test::cpu_world;

namespace {

// The token ids of this rank's first batches, and every rank's gathered by global rank.
std::vector<std::vector<std::int32_t>> gathered_batches(Communicator& world,
                                                        const data::TokenDataset& dataset,
                                                        const data::LoaderConfig& config) {
  data::DataLoader loader(dataset, config);
  std::vector<std::int32_t> mine;
  for (int n = 0; n < 3; ++n) {
    const std::vector<std::int32_t> t = loader.next(Stream()).tokens.to_vector<std::int32_t>();
    mine.insert(mine.end(), t.begin(), t.end());
  }
  const auto n = static_cast<std::int64_t>(mine.size());
  Tensor all = Tensor::empty({world.size() * n}, DType::i32);
  world.all_gather(Tensor::from_vector(mine, {n}), all).wait();
  const std::vector<std::int32_t> flat = all.to_vector<std::int32_t>();
  std::vector<std::vector<std::int32_t>> out;
  for (int r = 0; r < world.size(); ++r) {
    out.emplace_back(flat.begin() + r * n, flat.begin() + (r + 1) * n);
  }
  return out;
}

}  // namespace

TEST_CASE("dp: a loader configured from the mesh feeds one replica the same batches", "[dp]") {
  World world = cpu_world();
  const int n = world.size();
  // One dataset for every rank (made once, by whichever rank gets there first).
  const auto made = data::ensure_synthetic_dataset("dp_loader_mesh_data", {}, 1, 1 << 14, 1 << 12);
  const data::TokenDataset dataset = data::TokenDataset::open(made.train.front());
  std::vector<ParallelConfig> layouts = {ParallelConfig{}};  // dp = n
  if (n % 2 == 0) {
    layouts.push_back(ParallelConfig{.tp = 2});
    layouts.push_back(ParallelConfig{.pp = 2});
  }
  if (n == 4) layouts.push_back(ParallelConfig{.tp = 2, .pp = 2});
  for (const ParallelConfig& pc : layouts) {
    const Mesh mesh(Layout(pc, n), world.comm());
    INFO("tp " << pc.tp << " pp " << pc.pp << " dp " << mesh.size(Axis::dp));
    data::LoaderConfig base;
    base.seq_len = 16;
    base.batch_size = 2;
    base.threads = 2;
    base.seed = 5;
    const data::LoaderConfig c = data_parallel::loader_config_for(mesh, base);
    CHECK(c.dp_rank == mesh.rank(Axis::dp));
    CHECK(c.dp_size == mesh.size(Axis::dp));
    const auto batches = gathered_batches(world.comm(), dataset, c);
    // Which replica each global rank belongs to, from every rank's dp coordinate.
    Tensor replica = Tensor::empty({n}, DType::i32);
    world.comm()
        .all_gather(Tensor::from_vector(std::vector<std::int32_t>{c.dp_rank}, {1}), replica)
        .wait();
    const std::vector<std::int32_t> dp_of = replica.to_vector<std::int32_t>();
    for (int a = 0; a < n; ++a) {
      for (int b = a + 1; b < n; ++b) {
        INFO("ranks " << a << " and " << b << ", replicas " << dp_of[a] << " and " << dp_of[b]);
        CHECK((batches[a] == batches[b]) == (dp_of[a] == dp_of[b]));
      }
    }
  }
}

TEST_CASE("dp: data-parallel coordinates set by hand against the mesh are refused", "[dp]") {
  World world = cpu_world();
  const int n = world.size();
  if (n < 2) return;  // one rank: every coordinate is the mesh's
  const Mesh mesh(Layout(ParallelConfig{}, n), world.comm());
  data::LoaderConfig wrong;
  wrong.dp_rank = (mesh.rank(Axis::dp) + 1) % n;  // another replica's
  wrong.dp_size = n;
  REQUIRE_THROWS_QUINTET(data_parallel::loader_config_for(mesh, wrong), InvalidArgument,
                         "but this rank is rank " + std::to_string(mesh.rank(Axis::dp)));
  data::LoaderConfig same;
  same.dp_rank = mesh.rank(Axis::dp);
  same.dp_size = n;
  CHECK(data_parallel::loader_config_for(mesh, same).dp_rank == mesh.rank(Axis::dp));
}

TEST_CASE("dp: check_same_batch finds a replica whose ranks read different tokens", "[dp]") {
  World world = cpu_world();
  const int n = world.size();
  if (n % 2 != 0) return;  // needs tp = 2
  const Mesh mesh(Layout(ParallelConfig{.tp = 2}, n), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  std::vector<std::int32_t> ids(12);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(3 * i + 1);
  data_parallel::check_same_batch(tp,
                                  Tensor::from_vector(ids, {2, 6}));  // the same on both: no error
  // Tensor-parallel rank 1 of every replica reads another batch (a tp rank passed as dp rank).
  std::vector<std::int32_t> other = ids;
  if (tp.rank() == 1) other[5] += 1;
  REQUIRE_THROWS_QUINTET(data_parallel::check_same_batch(tp, Tensor::from_vector(other, {2, 6})),
                         InvalidArgument, "rank 1 holds other tokens than rank 0");
  // Another shape is another batch, even over the same bytes' prefix.
  REQUIRE_THROWS_QUINTET(
      data_parallel::check_same_batch(
          tp, Tensor::from_vector(ids, tp.rank() == 0 ? Shape{2, 6} : Shape{3, 4})),
      InvalidArgument, "other tokens");
}
