// Checkpoints under mpirun: every rank saves its own tensors, a load restores them bitwise; an
// interrupted save (a partial directory, a checkpoint that `latest` does not name) is never
// read; a corrupt shard, a missing or mismatched tensor and a different world size are errors
// on every rank (never a hang).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"
#include "support/catch.hpp"

using namespace quintet;
namespace fs = std::filesystem;

namespace {

World cpu_world() {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;
  config.timeout_s = 60;
  return init(config);
}

// A directory every rank agrees on, fresh for each test case.
std::string shared_dir(Communicator& comm, const std::string& name) {
  const std::string dir =
      (fs::temp_directory_path() / ("quintet_ckpt_" + name + "_" + std::to_string(comm.size())))
          .string();
  if (comm.rank() == 0) fs::remove_all(dir);
  comm.barrier().synchronize();
  return dir;
}

// This rank's tensors, different for every rank and seed.
std::vector<checkpoint::NamedTensor> make_state(int rank, std::uint64_t seed) {
  return {{"weights", Tensor::randn({3 + rank, 5}, seed + rank)},
          {"moments", Tensor::randn({7}, seed + 100 + rank, DType::f64)},
          {"bf16_values", Tensor::randn({4, 3}, seed + 200 + rank).to(DType::bf16)},
          {"step", Tensor::from_vector<std::int64_t>({42 + rank}, {1})}};
}

std::vector<checkpoint::NamedTensor> zeros_like(const std::vector<checkpoint::NamedTensor>& state) {
  std::vector<checkpoint::NamedTensor> out;
  for (const auto& t : state) {
    out.push_back({t.name, Tensor::zeros(t.tensor.shape(), t.tensor.dtype())});
  }
  return out;
}

void require_equal(const std::vector<checkpoint::NamedTensor>& a,
                   const std::vector<checkpoint::NamedTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].name);
    REQUIRE(a[i].tensor.nbytes() == b[i].tensor.nbytes());
    REQUIRE(std::memcmp(a[i].tensor.data_ptr(), b[i].tensor.data_ptr(), a[i].tensor.nbytes()) == 0);
  }
}

}  // namespace

TEST_CASE("checkpoint: save then load restores every rank's tensors bitwise") {
  World world = cpu_world();
  Communicator& comm = world.comm();
  const std::string dir = shared_dir(comm, "roundtrip");
  REQUIRE_FALSE(checkpoint::latest_checkpoint(dir).has_value());

  const auto first = make_state(comm.rank(), 1);
  checkpoint::save_checkpoint(dir, 10, first, R"({"note": "first"})", comm);
  const auto second = make_state(comm.rank(), 2);
  checkpoint::save_checkpoint(dir, 20, second, R"({"note": "second"})", comm);

  const auto info = checkpoint::latest_checkpoint(dir);
  REQUIRE(info.has_value());
  CHECK(info->step == 20);
  CHECK(info->world_size == comm.size());
  CHECK(info->user_json == R"({"note":"second"})");
  auto restored = zeros_like(second);
  checkpoint::load_checkpoint(*info, restored, comm);
  require_equal(second, restored);
  comm.barrier().synchronize();
}

TEST_CASE("checkpoint: metadata that is not JSON is refused before any communication") {
  World world = cpu_world();
  Communicator& comm = world.comm();
  const std::string dir = shared_dir(comm, "bad_metadata");
  // Only rank 0 calls: were the check after a collective, this would hang instead of throwing.
  if (comm.rank() == 0) {
    REQUIRE_THROWS_QUINTET(
        checkpoint::save_checkpoint(dir, 1, make_state(0, 1), "{\"note\": ", comm), InvalidArgument,
        "the metadata is not a JSON value");
  }
  comm.barrier().synchronize();
  checkpoint::save_checkpoint(dir, 2, make_state(comm.rank(), 1), "{}", comm);
  // A checkpoint.json damaged on disk is an error naming the file, not a misread field.
  if (comm.rank() == 0) {
    std::ofstream(fs::path(dir) / "step_000002" / "checkpoint.json") << "{\"step\": 2, ";
  }
  comm.barrier().synchronize();
  REQUIRE_THROWS_QUINTET(checkpoint::latest_checkpoint(dir), System,
                         "step_000002/checkpoint.json is not valid JSON");
  comm.barrier().synchronize();
}

TEST_CASE("checkpoint: prune_checkpoints keeps the newest and the one latest names") {
  World world = cpu_world();
  Communicator& comm = world.comm();
  const std::string dir = shared_dir(comm, "prune");
  for (std::int64_t step : {2, 4, 6, 8}) {
    checkpoint::save_checkpoint(
        dir, step, make_state(comm.rank(), static_cast<std::uint64_t>(step)), "{}", comm);
  }
  if (comm.rank() == 0) {
    // A partial save and a foreign file are left alone.
    fs::create_directories(fs::path(dir) / ".partial-step_000010");
    std::ofstream(fs::path(dir) / "notes.txt") << "mine";
    CHECK(checkpoint::prune_checkpoints(dir, 2) ==
          std::vector<std::string>{"step_000002", "step_000004"});
    CHECK_FALSE(fs::exists(fs::path(dir) / "step_000004"));
    CHECK(fs::exists(fs::path(dir) / "step_000006"));
    CHECK(fs::exists(fs::path(dir) / ".partial-step_000010"));
    CHECK(fs::exists(fs::path(dir) / "notes.txt"));
    // `latest` names an older checkpoint than the newest (a re-save of an earlier step): kept.
    std::ofstream(fs::path(dir) / "latest") << "step_000006\n";
    CHECK(checkpoint::prune_checkpoints(dir, 1).empty());  // 8 is the newest, 6 is latest
    CHECK(fs::exists(fs::path(dir) / "step_000006"));
    CHECK(checkpoint::prune_checkpoints(dir, 3).empty());
    REQUIRE_THROWS_QUINTET(checkpoint::prune_checkpoints(dir, 0), InvalidArgument, "keep_last = 0");
  }
  comm.barrier().synchronize();
  REQUIRE(checkpoint::latest_checkpoint(dir).has_value());
  auto restored = zeros_like(make_state(comm.rank(), 6));
  checkpoint::load_checkpoint(*checkpoint::latest_checkpoint(dir), restored, comm);
  require_equal(make_state(comm.rank(), 6), restored);
  comm.barrier().synchronize();
}

TEST_CASE("checkpoint: an interrupted save is never loaded; the previous one is") {
  World world = cpu_world();
  Communicator& comm = world.comm();
  const std::string dir = shared_dir(comm, "interrupted");
  const auto good = make_state(comm.rank(), 3);
  checkpoint::save_checkpoint(dir, 5, good, "{}", comm);
  // What a save killed midway leaves: a partial directory with some shards, and even a complete
  // looking step directory that `latest` was never moved to.
  if (comm.rank() == 0) {
    fs::create_directories(fs::path(dir) / ".partial-step_000010");
    std::ofstream(fs::path(dir) / ".partial-step_000010" / "rank_00000.qckpt") << "half";
    fs::create_directories(fs::path(dir) / "step_000009");
    std::ofstream(fs::path(dir) / "step_000009" / "checkpoint.json") << "{\"step\": 9}";
  }
  comm.barrier().synchronize();
  const auto info = checkpoint::latest_checkpoint(dir);
  REQUIRE(info.has_value());
  CHECK(info->step == 5);
  auto restored = zeros_like(good);
  checkpoint::load_checkpoint(*info, restored, comm);
  require_equal(good, restored);
  // A new save of step 10 replaces the leftovers.
  checkpoint::save_checkpoint(dir, 10, make_state(comm.rank(), 4), "{}", comm);
  CHECK(checkpoint::latest_checkpoint(dir)->step == 10);
  CHECK_FALSE(fs::exists(fs::path(dir) / ".partial-step_000010"));
  comm.barrier().synchronize();
}

TEST_CASE("checkpoint: bad shards and mismatched tensors fail on every rank") {
  World world = cpu_world();
  Communicator& comm = world.comm();
  const std::string dir = shared_dir(comm, "bad");
  const auto state = make_state(comm.rank(), 5);
  checkpoint::save_checkpoint(dir, 1, state, "{}", comm);
  const auto info = *checkpoint::latest_checkpoint(dir);

  SECTION("a tensor the shard does not hold") {
    auto wanted = zeros_like(state);
    wanted.push_back({"absent", Tensor::zeros({2})});
    REQUIRE_THROWS_QUINTET(checkpoint::load_checkpoint(info, wanted, comm), InvalidArgument,
                           "no tensor named absent");
  }
  SECTION("a shape that differs") {
    auto wanted = zeros_like(state);
    wanted[0].tensor = Tensor::zeros({1, 1});
    REQUIRE_THROWS_QUINTET(checkpoint::load_checkpoint(info, wanted, comm), InvalidArgument,
                           "tensor weights was saved as f32");
  }
  SECTION("one rank's shard is corrupt: it reports the checksum, the others its failure") {
    const int victim = comm.size() - 1;
    if (comm.rank() == victim) {
      const fs::path shard = fs::path(info.path) / fmt::format("rank_{:05d}.qckpt", victim);
      std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(40);
      f.put('\x7f');
    }
    comm.barrier().synchronize();
    auto wanted = zeros_like(state);
    if (comm.rank() == victim) {
      REQUIRE_THROWS_QUINTET(checkpoint::load_checkpoint(info, wanted, comm), System, "is corrupt");
    } else {
      REQUIRE_THROWS_QUINTET(checkpoint::load_checkpoint(info, wanted, comm), Remote,
                             "1 rank(s) failed");
    }
  }
  SECTION("another world size") {
    checkpoint::CheckpointInfo other = info;
    other.world_size = comm.size() + 1;
    REQUIRE_THROWS_QUINTET(checkpoint::load_checkpoint(other, zeros_like(state), comm),
                           InvalidArgument, "saved by");
  }
  SECTION("bad arguments before any communication") {
    REQUIRE_THROWS_QUINTET(checkpoint::save_checkpoint(dir, -1, state, "{}", comm), InvalidArgument,
                           "step = -1");
    auto dup = state;
    dup.push_back(state[0]);
    REQUIRE_THROWS_QUINTET(checkpoint::save_checkpoint(dir, 2, dup, "{}", comm), InvalidArgument,
                           "two tensors are named weights");
  }
  comm.barrier().synchronize();
}
