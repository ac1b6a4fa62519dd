// The machine's topology as one rank sees it, where the rank's threads are placed, and the
// one-screen report of a job's placement (docs/topology.md).
//
// At start-up (quintet::init, collectives/bootstrap.hpp) every rank reads its facts
// (read_rank_topology: its host, the CPUs it was given, the NUMA nodes, its GPU's PCI bus id, NUMA
// node and local CPUs, the network devices near it), the ranks exchange them, plan_placement picks
// each rank's CPUs from all of them, and topology_report says what came out. The planning and the
// report are pure functions of the facts, so they are tested with made-up ones; read_rank_topology
// can read a made-up machine from hwloc XML.
//
// hwloc is optional at build time (QUINTET_WITH_HWLOC). Without it a rank knows its host and the
// CPUs it was given, not its NUMA nodes nor its GPU's: RankTopology::source says
// "no topology: built without hwloc", and placement splits the given CPUs alone.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "quintet/core/cpu_set.hpp"
#include "quintet/core/device.hpp"

namespace quintet {

// --cpu-affinity (RuntimeConfig): automatic binds a rank's threads to the CPUs local to its GPU
// (CPU ranks: the CPUs it was given, or its share of the host's); none leaves the OS in charge.
enum class CpuAffinity { automatic, none };
// "auto" or "none"; throws InvalidArgument otherwise.
CpuAffinity parse_cpu_affinity(std::string_view name);
std::string_view cpu_affinity_name(CpuAffinity affinity);

struct NumaNode {
  int index = 0;  // the OS's number (numactl's)
  CpuSet cpus;
};

// What one rank knows of its machine. Filled by read_rank_topology, then by the exchange
// (placed_cpus) and by the program (loader_threads).
struct RankTopology {
  int rank = 0;
  int local_rank = 0;  // among the ranks of its host
  std::string host;
  std::string device = "cpu";  // Device::str()
  // How the facts were read: "hwloc (API 2.8)", or why there are none: "no topology: built without
  // hwloc", "no topology: hwloc could not read this machine (...)".
  std::string source;
  bool has_topology = false;  // numa_nodes, cores and the GPU's locality are known
  CpuSet host_cpus;           // the CPUs online on the host
  CpuSet start_cpus;          // the CPUs the process was allowed at start (the launcher's binding)
  std::vector<NumaNode> numa_nodes;  // of the host
  std::vector<CpuSet> cores;         // the host's physical cores, each its hardware threads
  std::string gpu_pci_bus_id;        // "0000:17:00.0"; "" on CPU ranks
  int gpu_numa_node = -1;            // -1: a CPU rank, or not known
  CpuSet gpu_cpus;                   // the CPUs local to the GPU; empty: not known
  std::vector<std::string> nics;     // network devices near the GPU (CPU ranks: near start_cpus)
  CpuSet placed_cpus;                // where the rank's threads run (plan_placement)
  int loader_threads = 0;            // the data loader's worker threads; 0: not known

  // The NUMA nodes holding any of cpus (ascending); empty without a topology.
  std::vector<int> numa_nodes_of(const CpuSet& cpus) const;
};

// Where read_rank_topology reads from: this machine by default; tests give made-up values.
struct TopologySource {
  std::string xml;   // an hwloc XML topology to read instead of this machine's
  std::string host;  // "": gethostname()
  bool start_cpus_given = false;
  CpuSet start_cpus;           // when given: instead of the calling thread's CPUs
  std::string gpu_pci_bus_id;  // "": ask the CUDA runtime (pci_bus_id) for a GPU device
};

// This rank's facts (placed_cpus is start_cpus until plan_placement). Throws InvalidArgument for
// XML that hwloc cannot read, or XML given to a build without hwloc; a machine hwloc cannot read
// is not an error (source says why, has_topology is false).
RankTopology read_rank_topology(int rank, int local_rank, const Device& device,
                                const TopologySource& source = {});

// Each rank's CPUs (indexed like ranks, which holds every rank of the job, any order).
// none: start_cpus. automatic: the CPUs local to the rank's GPU among its start_cpus (its
// start_cpus when they have none of them, or the GPU's are unknown; CPU ranks: start_cpus); ranks
// of one host given the same CPUs share them out in local-rank order, whole cores first (CPUs when
// there are fewer cores than ranks; left shared when there are fewer CPUs than ranks).
//
//   host of 8 CPUs (cores {0,4} {1,5} {2,6} {3,7}), two CPU ranks started on all of them
//   -> local rank 0: 0-1,4-5; local rank 1: 2-3,6-7
std::vector<CpuSet> plan_placement(const std::vector<RankTopology>& ranks, CpuAffinity affinity);

// The report: per host its CPUs and NUMA nodes, its GPUs with their NUMA nodes and ranks, one line
// per rank (device, GPU NUMA node, CPUs and their NUMA nodes, NICs), then the warnings that matter:
// ranks sharing CPUs (unless both run on the whole host), a GPU on another NUMA node than all of
// its rank's CPUs, more loader threads than the rank's CPUs. About one screen for 8 ranks a host.
struct TopologyReport {
  std::vector<std::string> lines;
  std::vector<std::string> warnings;
  std::string text() const;  // the lines, then "warnings:" and the warnings (or "warnings: none")
};
TopologyReport topology_report(const std::vector<RankTopology>& ranks, CpuAffinity affinity);

// The facts as text and back, for the exchange between ranks. decode throws InvalidArgument on
// text encode did not write.
std::string encode_rank_topology(const RankTopology& facts);
RankTopology decode_rank_topology(std::string_view text);

}  // namespace quintet
