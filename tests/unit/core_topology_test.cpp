// Topology and placement (core/cpu_set.hpp, core/topology.hpp): CPU lists, the placement plan and
// the report's warnings on made-up facts, a made-up two-NUMA machine read from hwloc XML, and the
// report of this machine.
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/core/config.hpp"
#include "quintet/core/cpu_set.hpp"
#include "quintet/core/runtime_config.hpp"
#include "quintet/core/topology.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

bool has_line(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& l : lines) {
    if (l.find(part) != std::string::npos) return true;
  }
  return false;
}

// A host of 8 CPUs in 4 cores ({0,4} {1,5} {2,6} {3,7}) and 2 NUMA nodes (cores 0-1, cores 2-3),
// one GPU on each node.
RankTopology made_up_rank(int rank, int local_rank, const std::string& host = "h0") {
  RankTopology r;
  r.rank = rank;
  r.local_rank = local_rank;
  r.host = host;
  r.source = "made up";
  r.has_topology = true;
  r.host_cpus = CpuSet::parse("0-7");
  r.start_cpus = r.host_cpus;
  r.placed_cpus = r.start_cpus;
  r.numa_nodes = {{0, CpuSet::parse("0-1,4-5")}, {1, CpuSet::parse("2-3,6-7")}};
  r.cores = {CpuSet({0, 4}), CpuSet({1, 5}), CpuSet({2, 6}), CpuSet({3, 7})};
  return r;
}

void on_gpu(RankTopology& r, int node) {
  r.device = fmt::format("cuda:{}", node);
  r.gpu_pci_bus_id = fmt::format("0000:{}7:00.0", node + 1);
  r.gpu_numa_node = node;
  r.gpu_cpus = r.numa_nodes[static_cast<std::size_t>(node)].cpus;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("CpuSet: CPU lists parse, print and compare") {
  const CpuSet s = CpuSet::parse("8,0-3,2,10-11");
  CHECK(s.cpus() == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(s.str() == "0-3,8,10-11");
  CHECK(CpuSet::parse(s.str()) == s);
  CHECK(CpuSet::parse("").empty());
  CHECK(CpuSet::parse("5\n").cpus() == std::vector<int>{5});
  CHECK(s.contains(CpuSet::parse("1-2,10")));
  CHECK_FALSE(s.contains(CpuSet::parse("1-4")));
  CHECK(s.intersection(CpuSet::parse("3-9")).str() == "3,8");
  CHECK_FALSE(s.intersects(CpuSet::parse("4-7")));
  REQUIRE_THROWS_QUINTET(CpuSet::parse("1-"), InvalidArgument, "'1-'");
  REQUIRE_THROWS_QUINTET(CpuSet::parse("3-1"), InvalidArgument, "backwards");
  REQUIRE_THROWS_QUINTET(CpuSet::parse("0,,2"), InvalidArgument, "'0,,2'");
  REQUIRE_THROWS_QUINTET(CpuSet::parse("x"), InvalidArgument, "CPU list");
  REQUIRE_THROWS_QUINTET(CpuSet({-1}), InvalidArgument, "negative");
  REQUIRE_THROWS_QUINTET(bind_calling_thread(CpuSet()), InvalidArgument, "no CPU");
  // The calling thread's CPUs are the kernel's own list of them.
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      CHECK(CpuSet::parse(line.substr(line.find_first_not_of(" \t", 18))) == calling_thread_cpus());
    }
  }
  CHECK(online_cpus().contains(calling_thread_cpus()));
}

TEST_CASE("--cpu-affinity: auto by default, none, and nothing else") {
  CHECK(RuntimeConfig::from({}, {"p"}).cpu_affinity == CpuAffinity::automatic);
  CHECK(RuntimeConfig::from({}, {"p", "--cpu-affinity", "none"}).cpu_affinity == CpuAffinity::none);
  CHECK(RuntimeConfig::from({{"QUINTET_CPU_AFFINITY", "none"}}, {"p", "--cpu-affinity=auto"})
            .cpu_affinity == CpuAffinity::automatic);
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({}, {"p", "--cpu-affinity", "numa"}), InvalidArgument,
                         "--cpu-affinity: expected auto or none, got 'numa'");
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({{"QUINTET_CPU_AFFINITY", "yes"}}, {"p"}),
                         InvalidArgument, "QUINTET_CPU_AFFINITY");
  CHECK_FALSE(RuntimeConfig::from({}, {"p"}).log_level_given);
  CHECK(RuntimeConfig::from({}, {"p", "--log-level", "info"}).log_level_given);
}

TEST_CASE("plan_placement: CPU ranks share their host by whole cores; none keeps what was given") {
  std::vector<RankTopology> ranks = {made_up_rank(0, 0), made_up_rank(1, 1)};
  const std::vector<CpuSet> placed = plan_placement(ranks, CpuAffinity::automatic);
  CHECK(placed[0].str() == "0-1,4-5");
  CHECK(placed[1].str() == "2-3,6-7");
  const std::vector<CpuSet> kept = plan_placement(ranks, CpuAffinity::none);
  CHECK(kept[0] == ranks[0].start_cpus);
  CHECK(kept[1] == ranks[1].start_cpus);

  // Three ranks over 4 cores: 1, 1 and 2 cores; eight ranks over 4 cores: one CPU each; more
  // ranks than CPUs: left sharing them all.
  std::vector<RankTopology> three = {made_up_rank(0, 0), made_up_rank(1, 1), made_up_rank(2, 2)};
  const std::vector<CpuSet> p3 = plan_placement(three, CpuAffinity::automatic);
  CHECK(p3[0].str() == "0,4");
  CHECK(p3[1].str() == "1,5");
  CHECK(p3[2].str() == "2-3,6-7");
  std::vector<RankTopology> eight, nine;
  for (int i = 0; i < 9; ++i) {
    if (i < 8) eight.push_back(made_up_rank(i, i));
    nine.push_back(made_up_rank(i, i));
  }
  const std::vector<CpuSet> p8 = plan_placement(eight, CpuAffinity::automatic);
  for (int i = 0; i < 8; ++i) CHECK(p8[static_cast<std::size_t>(i)].cpus() == std::vector<int>{i});
  for (const CpuSet& p : plan_placement(nine, CpuAffinity::automatic)) CHECK(p.str() == "0-7");

  // Ranks the launcher bound apart keep their CPUs; ranks on other hosts do not share.
  std::vector<RankTopology> bound = {made_up_rank(0, 0), made_up_rank(1, 1),
                                     made_up_rank(2, 0, "h1")};
  bound[0].start_cpus = CpuSet::parse("0,4");
  bound[1].start_cpus = CpuSet::parse("1,5");
  const std::vector<CpuSet> pb = plan_placement(bound, CpuAffinity::automatic);
  CHECK(pb[0].str() == "0,4");
  CHECK(pb[1].str() == "1,5");
  CHECK(pb[2].str() == "0-7");
}

TEST_CASE("plan_placement: GPU ranks go next to their GPU, sharing its NUMA node's cores") {
  // Ranks 0 and 2 on the GPUs of node 0 (listed out of order), rank 1 on node 1's.
  std::vector<RankTopology> ranks = {made_up_rank(2, 2), made_up_rank(0, 0), made_up_rank(1, 1)};
  on_gpu(ranks[0], 0);
  on_gpu(ranks[1], 0);
  on_gpu(ranks[2], 1);
  ranks[0].gpu_pci_bus_id = "0000:19:00.0";  // another GPU on node 0
  const std::vector<CpuSet> placed = plan_placement(ranks, CpuAffinity::automatic);
  CHECK(placed[1].str() == "0,4");  // rank 0: local rank 0 of node 0's two ranks
  CHECK(placed[0].str() == "1,5");  // rank 2
  CHECK(placed[2].str() == "2-3,6-7");
  // A rank given none of its GPU's CPUs keeps its own.
  ranks[2].start_cpus = CpuSet::parse("0-1");
  CHECK(plan_placement(ranks, CpuAffinity::automatic)[2].str() == "0-1");
}

TEST_CASE("topology_report: structure and warnings on made-up facts") {
  std::vector<RankTopology> ranks = {made_up_rank(0, 0), made_up_rank(1, 1)};
  on_gpu(ranks[0], 0);
  on_gpu(ranks[1], 1);
  ranks[1].nics = {"ib0", "mlx5_0"};
  // The launcher bound both ranks to node 0's cores: one shares, one is far from its GPU.
  for (RankTopology& r : ranks) r.placed_cpus = r.start_cpus = CpuSet::parse("0-1,4-5");
  ranks[0].loader_threads = 6;
  TopologyReport bad = topology_report(ranks, CpuAffinity::none);
  INFO(bad.text());
  REQUIRE(bad.lines.size() == 6);
  CHECK(bad.lines[0] == "topology: 2 ranks on 1 host, cpu affinity none, made up");
  CHECK(bad.lines[1] == "host h0: cpus 0-7 (4 cores), NUMA 0: 0-1,4-5, NUMA 1: 2-3,6-7");
  CHECK(bad.lines[2] == "  gpu 0000:17:00.0 (cuda:0): NUMA 0, cpus 0-1,4-5, rank 0");
  CHECK(bad.lines[3] == "  gpu 0000:27:00.0 (cuda:1): NUMA 1, cpus 2-3,6-7, rank 1");
  CHECK(bad.lines[4] == "  rank 0   local 0  cuda:0  cpus 0-1,4-5 (NUMA 0)");
  CHECK(bad.lines[5] == "  rank 1   local 1  cuda:1  cpus 0-1,4-5 (NUMA 0), nics ib0 mlx5_0");
  REQUIRE(bad.warnings.size() == 3);
  CHECK(bad.warnings[0] == "ranks 0,1 on h0 are bound to the same cpus 0-1,4-5");
  CHECK(bad.warnings[1] == "rank 0: 6 loader threads on 4 cpus (0-1,4-5)");
  CHECK(bad.warnings[2] ==
        "rank 1: its GPU cuda:1 (0000:27:00.0) is on NUMA node 1 but its cpus 0-1,4-5 are on "
        "NUMA node 0");
  CHECK(bad.text().find("warnings:\n  ranks 0,1") != std::string::npos);

  // Partly overlapping CPUs are named pair by pair.
  ranks[1].placed_cpus = CpuSet::parse("1-3");
  CHECK(has_line(topology_report(ranks, CpuAffinity::none).warnings,
                 "ranks 0 and 1 on h0 share cpus 1"));

  // Placed by auto from the whole host: no warning is left.
  for (RankTopology& r : ranks) r.start_cpus = r.host_cpus;
  ranks[0].loader_threads = 4;
  const std::vector<CpuSet> placed = plan_placement(ranks, CpuAffinity::automatic);
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i].placed_cpus = placed[i];
  const TopologyReport good = topology_report(ranks, CpuAffinity::automatic);
  INFO(good.text());
  CHECK(good.warnings.empty());
  CHECK(good.text().find("warnings: none") != std::string::npos);
  // Unbound ranks (every CPU of the host) are not "bound to the same cpus".
  for (RankTopology& r : ranks) r.placed_cpus = r.host_cpus;
  const TopologyReport unbound = topology_report(ranks, CpuAffinity::none);
  CHECK_FALSE(has_line(unbound.warnings, "same cpus"));
  CHECK_FALSE(has_line(unbound.warnings, "NUMA node"));  // they run on the GPU's node too
}

TEST_CASE("encode_rank_topology / decode_rank_topology round trip") {
  RankTopology r = made_up_rank(3, 1, "node-7");
  on_gpu(r, 1);
  r.nics = {"ib0", "eth1"};
  r.source = "hwloc 2.9.0 (GPU x not among its PCI devices)";
  r.placed_cpus = CpuSet::parse("2,6");
  r.loader_threads = 2;
  const RankTopology back = decode_rank_topology(encode_rank_topology(r));
  CHECK(encode_rank_topology(back) == encode_rank_topology(r));
  CHECK(back.nics == r.nics);
  CHECK(back.cores.size() == 4);
  CHECK(back.numa_nodes.size() == 2);
  CHECK(back.source == r.source);
  RankTopology cpu_rank;
  cpu_rank.host = "h";
  CHECK(encode_rank_topology(decode_rank_topology(encode_rank_topology(cpu_rank))) ==
        encode_rank_topology(cpu_rank));
  REQUIRE_THROWS_QUINTET(decode_rank_topology("rank x\n"), InvalidArgument, "integer");
  REQUIRE_THROWS_QUINTET(decode_rank_topology("colour blue\n"), InvalidArgument, "'colour'");
  REQUIRE_THROWS_QUINTET(decode_rank_topology("rank 1\n"), InvalidArgument, "'host'");
}

TEST_CASE("read_rank_topology: a made-up machine with its GPU on the other NUMA node (hwloc XML)") {
  TopologySource source;
  source.xml = read_file(QUINTET_TOPOLOGY_XML);
  REQUIRE(!source.xml.empty());
  source.host = "made-up";
  source.start_cpus_given = true;
  source.start_cpus = CpuSet::parse("0-1");  // the launcher bound the rank to node 0
  source.gpu_pci_bus_id = "0000:17:00.0";
#if QUINTET_HAS_HWLOC
  RankTopology r = read_rank_topology(0, 0, Device::cuda(0), source);
  INFO(encode_rank_topology(r));
  CHECK(r.has_topology);
  CHECK(r.source.rfind("hwloc (API 2.", 0) == 0);
  CHECK(r.host_cpus.str() == "0-3");
  REQUIRE(r.numa_nodes.size() == 2);
  CHECK(r.numa_nodes[1].index == 1);
  CHECK(r.numa_nodes[1].cpus.str() == "2-3");
  CHECK(r.cores.size() == 4);
  CHECK(r.gpu_numa_node == 1);
  CHECK(r.gpu_cpus.str() == "2-3");
  CHECK(r.nics == std::vector<std::string>{"ib0", "mlx5_0"});
  CHECK(r.placed_cpus.str() == "0-1");

  // As given (none), the GPU is far from the rank's CPUs, and two loader threads fill them.
  r.loader_threads = 3;
  const TopologyReport report = topology_report({r}, CpuAffinity::none);
  INFO(report.text());
  CHECK(has_line(report.warnings,
                 "rank 0: its GPU cuda:0 (0000:17:00.0) is on NUMA node 1 but "
                 "its cpus 0-1 are on NUMA node 0"));
  CHECK(has_line(report.warnings, "rank 0: 3 loader threads on 2 cpus (0-1)"));
  CHECK(has_line(report.lines, "gpu 0000:17:00.0 (cuda:0): NUMA 1, cpus 2-3, rank 0"));
  // Given the whole machine, auto puts the rank on node 1, and the NUMA warning goes.
  r.start_cpus = r.host_cpus;
  r.placed_cpus = plan_placement({r}, CpuAffinity::automatic)[0];
  CHECK(r.placed_cpus.str() == "2-3");
  CHECK_FALSE(has_line(topology_report({r}, CpuAffinity::automatic).warnings, "NUMA"));
  // A CPU rank's NICs are those near its own CPUs.
  source.start_cpus = CpuSet::parse("0-1");
  CHECK(read_rank_topology(0, 0, Device::cpu(), source).nics.empty());
  source.start_cpus = CpuSet::parse("3");
  CHECK(read_rank_topology(0, 0, Device::cpu(), source).nics.size() == 2);
  // A GPU hwloc does not list is named, not fatal.
  source.gpu_pci_bus_id = "0000:99:00.0";
  const RankTopology lost = read_rank_topology(0, 0, Device::cuda(0), source);
  CHECK(lost.gpu_numa_node == -1);
  CHECK(lost.source.find("GPU 0000:99:00.0 not among its PCI devices") != std::string::npos);
  source.xml = "<topology>";
  REQUIRE_THROWS_QUINTET(read_rank_topology(0, 0, Device::cpu(), source), InvalidArgument,
                         "XML topology");
#else
  REQUIRE_THROWS_QUINTET(read_rank_topology(0, 0, Device::cuda(0), source), InvalidArgument,
                         "built without hwloc");
#endif
}

TEST_CASE("topology_report: this machine, one CPU rank") {
  RankTopology r = read_rank_topology(0, 0, Device::cpu());
  INFO(encode_rank_topology(r));
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  CHECK(r.host == host);
  CHECK(r.start_cpus == calling_thread_cpus());
  CHECK(r.host_cpus.contains(r.start_cpus));
#if QUINTET_HAS_HWLOC
  CHECK(r.has_topology);
  REQUIRE(!r.numa_nodes.empty());
  std::vector<int> all;
  for (const NumaNode& n : r.numa_nodes)
    all.insert(all.end(), n.cpus.cpus().begin(), n.cpus.cpus().end());
  CHECK(CpuSet(all).contains(r.start_cpus));
#else
  CHECK(r.source == "no topology: built without hwloc");
#endif
  const TopologyReport report = topology_report({r}, CpuAffinity::automatic);
  INFO(report.text());
  REQUIRE(report.lines.size() == 3);
  CHECK(report.lines[0].rfind("topology: 1 rank on 1 host, cpu affinity auto, ", 0) == 0);
  CHECK(report.lines[1].rfind(fmt::format("host {}: cpus {} (", host, r.host_cpus.str()), 0) == 0);
  CHECK(report.lines[2].rfind(
            fmt::format("  rank 0   local 0  cpu     cpus {} (", r.start_cpus.str()), 0) == 0);
}
