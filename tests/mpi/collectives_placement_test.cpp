// Placement under mpirun (--cpu-affinity, core/topology.hpp): with auto, the threads Quintet starts
// (the world communicator's progress thread and the job monitor from init, the data loader's
// workers, a background task started as the checkpoint writer is, by std::async) run on the rank's
// placed CPUs, read back from /proc/self/task/<tid>/status; with none, on the CPUs the launcher
// gave. The ranks' placements do not overlap when they can be kept apart.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <mpi.h>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/cpu_set.hpp"
#include "quintet/data/loader.hpp"
#include "quintet/data/shard_writer.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

std::set<int> task_ids() {
  std::set<int> ids;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    ids.insert(std::stoi(e.path().filename().string()));
  }
  return ids;
}

// A thread's CPUs as the kernel lists them.
CpuSet allowed_cpus(int tid) {
  std::ifstream status(fmt::format("/proc/self/task/{}/status", tid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      return CpuSet::parse(line.substr(line.find_first_not_of(" \t", 18)));
    }
  }
  return CpuSet();  // the thread has ended
}

std::string dataset_path(int rank) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("quintet_topology_{}_{}.qts", ::getpid(), rank))
                               .string();
  std::vector<std::uint32_t> tokens(4096);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = rng() % 1000;
  data::write_quintet_shard(path, tokens.data(), static_cast<std::int64_t>(tokens.size()));
  return path;
}

// Runs a World with affinity and checks every thread started since it began; returns the rank's
// placed CPUs. The calling thread's CPUs are restored afterwards.
CpuSet check_threads(CpuAffinity affinity) {
  const CpuSet given = calling_thread_cpus();
  const std::set<int> before = task_ids();
  CpuSet placed;
  {
    RuntimeConfig config = RuntimeConfig::from_env();
    config.device = DevicePreference::cpu;
    config.timeout_s = 60;
    config.cpu_affinity = affinity;
    World world = init(config);
    REQUIRE(static_cast<int>(world.topology().size()) == world.size());
    placed = world.topology()[static_cast<std::size_t>(world.rank())].placed_cpus;
    INFO(world.topology_report().text());
    CHECK(calling_thread_cpus() == placed);
    CHECK(given.contains(placed));
    if (affinity == CpuAffinity::none) CHECK(placed == given);

    const std::string path = dataset_path(world.rank());
    data::LoaderConfig lc;
    lc.seq_len = 16;
    lc.batch_size = 2;
    lc.threads = 3;
    data::DataLoader loader(data::TokenDataset::open(path), lc);
    (void)loader.next();
    // Started as Checkpointer::save_async starts its writer.
    std::promise<void> release;
    std::shared_future<void> go = release.get_future().share();
    auto writer = std::async(std::launch::async, [go] {
      go.wait();
      return calling_thread_cpus();
    });

    int checked = 0;
    for (int tid : task_ids()) {
      if (before.count(tid) != 0) continue;
      const CpuSet cpus = allowed_cpus(tid);
      if (cpus.empty()) continue;
      INFO("thread " << tid << ": cpus " << cpus.str() << ", placed " << placed.str());
      CHECK(cpus == placed);
      ++checked;
    }
    // Three workers and the writer; with more than one rank, the world communicator's progress
    // thread and the job monitor too.
    CHECK(checked >= 4 + (world.size() > 1 ? 2 : 0));
    release.set_value();
    CHECK(writer.get() == placed);
    world.cpu_comm().barrier().wait();
    std::filesystem::remove(path);
  }
  bind_calling_thread(given);
  return placed;
}

}  // namespace

TEST_CASE("--cpu-affinity none: Quintet's threads keep the CPUs the launcher gave") {
  check_threads(CpuAffinity::none);
}

TEST_CASE("--cpu-affinity auto: Quintet's threads run on the rank's placed CPUs") {
  const CpuSet placed = check_threads(CpuAffinity::automatic);
  // The ranks of this host are kept apart whenever there are CPUs enough (the tests run with
  // --bind-to none: every rank is given the same CPUs).
  int size = 1, local = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local);
  const int n = online_cpus().cpus().back() + 1;
  std::vector<int> mine(static_cast<std::size_t>(n), 0), total(mine.size(), 0);
  for (int c : placed.cpus()) mine[static_cast<std::size_t>(c)] = 1;
  MPI_Allreduce(mine.data(), total.data(), n, MPI_INT, MPI_SUM, node);
  MPI_Comm_free(&node);
  if (local <= calling_thread_cpus().size()) {
    CHECK(*std::max_element(total.begin(), total.end()) == 1);
  }
}
