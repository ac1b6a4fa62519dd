#include "collectives/topology_exchange.hpp"

#include <mpi.h>

#include <string>

#include "collectives/tcp_store.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

std::vector<std::string> allgather_mpi(const std::string& mine, int size) {
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(lengths.size());
  QUINTET_MPI_CHECK(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD));
  int total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  QUINTET_MPI_CHECK(MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                                   offsets.data(), MPI_CHAR, MPI_COMM_WORLD));
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r)
    out.push_back(all.substr(offsets[r], lengths[r]));
  return out;
}

std::vector<std::string> allgather_store(const std::string& mine, int rank, int size,
                                         TcpStoreClient& store) {
  const auto key = [](int r) { return fmt::format("quintet/world/topology/{}", r); };
  store.set(key(rank), std::vector<char>(mine.begin(), mine.end()));
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) {
    const std::vector<char> v = store.get(key(r));
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

}  // namespace

std::vector<RankTopology> place_this_rank(const LaunchInfo& info, const Device& device,
                                          const RuntimeConfig& config, TcpStoreClient* store) {
  const RankTopology mine = read_rank_topology(info.rank, info.local_rank, device);
  std::vector<RankTopology> all;
  if (info.size == 1) {
    all.push_back(mine);
  } else {
    const std::string text = encode_rank_topology(mine);
    std::vector<std::string> texts;
    if (info.launcher == Launcher::mpi) {
      texts = allgather_mpi(text, info.size);
    } else {
      QUINTET_CHECK(store != nullptr, "place_this_rank: {} ranks without MPI need the TCP store",
                    info.size);
      texts = allgather_store(text, info.rank, info.size, *store);
    }
    for (const std::string& t : texts) all.push_back(decode_rank_topology(t));
  }
  const std::vector<CpuSet> placed = plan_placement(all, config.cpu_affinity);
  for (std::size_t r = 0; r < all.size(); ++r) all[r].placed_cpus = placed[r];
  CpuSet& here = all[static_cast<std::size_t>(info.rank)].placed_cpus;
  if (config.cpu_affinity == CpuAffinity::automatic && here != mine.start_cpus) {
    // Not an error: the other ranks are already on their way to the next collective, and the
    // job runs as well (if slower) where the OS puts it.
    try {
      bind_calling_thread(here);
    } catch (const Error& e) {
      log::warn("quintet::init: cpu affinity auto: {}; this rank's threads stay on cpus {}",
                e.what(), mine.start_cpus.str());
      here = mine.start_cpus;
    }
  }
  log::debug("quintet::init: cpus {} (given {}, cpu affinity {})", here.str(),
             mine.start_cpus.str(), cpu_affinity_name(config.cpu_affinity));
  return all;
}

}  // namespace quintet::detail
