// Launch detection from launcher variables, init() of a single rank, and the Self backend.
#include "quintet/collectives/bootstrap.hpp"
#include "quintet/collectives/mpi.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {
RuntimeConfig config_with(std::map<std::string, std::string> env) {
  return RuntimeConfig::from(env, {"prog"});
}
}  // namespace

TEST_CASE("detect_launch reads OpenMPI, PMI, SLURM and torchrun-style variables") {
  LaunchInfo none = detect_launch(config_with({}));
  CHECK(none.launcher == Launcher::single);
  CHECK(none.size == 1);

  LaunchInfo ompi = detect_launch(config_with({{"OMPI_COMM_WORLD_RANK", "5"},
                                               {"OMPI_COMM_WORLD_SIZE", "8"},
                                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  CHECK(ompi.launcher == Launcher::mpi);
  CHECK(ompi.rank == 5);
  CHECK(ompi.size == 8);
  CHECK(ompi.local_rank == 1);
  CHECK(ompi.local_size == 4);

  LaunchInfo slurm = detect_launch(
      config_with({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}}));
  CHECK(slurm.launcher == Launcher::mpi);
  CHECK(slurm.rank == 3);
  CHECK(slurm.size == 16);
  CHECK(slurm.local_rank == 3);

  CHECK(detect_launch(config_with({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}})).rank == 2);

  LaunchInfo env = detect_launch(config_with({{"RANK", "3"},
                                              {"WORLD_SIZE", "4"},
                                              {"LOCAL_RANK", "1"},
                                              {"MASTER_ADDR", "node7"},
                                              {"MASTER_PORT", "29500"}}));
  CHECK(env.launcher == Launcher::env);
  CHECK(env.rank == 3);
  CHECK(env.size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.master_addr == "node7");
  CHECK(env.master_port == 29500);
  // An MPI launcher wins over RANK/WORLD_SIZE.
  CHECK(detect_launch(config_with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"PMIX_RANK", "0"}}))
            .launcher == Launcher::mpi);
}

TEST_CASE("detect_launch rejects malformed or incomplete launcher variables") {
  REQUIRE_THROWS_QUINTET(detect_launch(config_with({{"RANK", "1"}})), InvalidArgument,
                         "RANK is set but WORLD_SIZE is not");
  REQUIRE_THROWS_QUINTET(detect_launch(config_with({{"RANK", "x"}, {"WORLD_SIZE", "2"}})),
                         InvalidArgument, "RANK='x': expected an integer >= 0");
  REQUIRE_THROWS_QUINTET(detect_launch(config_with({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
                         InvalidArgument, "RANK=2 is not below WORLD_SIZE=2");
  REQUIRE_THROWS_QUINTET(detect_launch(config_with({{"RANK", "0"}, {"WORLD_SIZE", "2"}})),
                         InvalidArgument, "MASTER_ADDR or MASTER_PORT is missing");
  REQUIRE_THROWS_QUINTET(
      detect_launch(config_with(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})),
      InvalidArgument, "MASTER_PORT=70000");
}

TEST_CASE("init without a launcher gives one rank with Self communicators") {
  World world = init(config_with({{"QUINTET_DEVICE", "cpu"}}));
  CHECK(world.launcher() == Launcher::single);
  CHECK(world.rank() == 0);
  CHECK(world.size() == 1);
  CHECK(world.device() == Device::cpu());
  CHECK(world.comm().backend() == Backend::self);
  CHECK(&world.comm() == &world.cpu_comm());
  // Every op on one rank is the identity; in place makes no copy, out of place copies.
  Tensor x = Tensor::arange(6, DType::f32), y = Tensor::zeros({6}, DType::f32);
  world.comm().all_reduce(x, y, ReduceOp::sum).wait();
  CHECK(y.to_vector<float>() == x.to_vector<float>());
  Tensor g = Tensor::zeros({6}, DType::f32);
  world.comm().all_gather(x, g).wait();
  CHECK(g.to_vector<float>() == x.to_vector<float>());
  Work w = world.comm().all_reduce(x, ReduceOp::avg);
  CHECK(w.is_completed());
  w.wait_for(std::chrono::milliseconds(1));
  auto sub = world.comm().split(0, 0, "sub");
  REQUIRE(sub);
  CHECK(sub->name() == "sub");
  CHECK(world.comm().split(-1, 0, "none") == nullptr);
}

TEST_CASE("init refuses a CPU run launched with RANK/WORLD_SIZE") {
  REQUIRE_THROWS_QUINTET(init(config_with({{"RANK", "0"},
                                           {"WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "127.0.0.1"},
                                           {"MASTER_PORT", "29999"},
                                           {"QUINTET_DEVICE", "cpu"}})),
                         InvalidArgument, "only supports GPU runs over NCCL");
}
