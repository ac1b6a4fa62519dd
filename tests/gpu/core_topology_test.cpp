// The GPU's place in the machine (core/topology.hpp): its PCI bus id from the CUDA runtime, its
// NUMA node and local CPUs from hwloc, checked against what Linux says of the same PCI device
// (/sys/bus/pci/devices/<id>/numa_node and local_cpulist); and the report of this rank.
#include <fstream>
#include <regex>
#include <string>

#include "quintet/core/config.hpp"
#include "quintet/core/topology.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

// A line of a sysfs file of the GPU's PCI device; "" when it cannot be read.
std::string pci_sysfs(const std::string& bus_id, const std::string& file) {
  // CUDA writes an 8-digit PCI domain ("00000000:17:00.0"), sysfs a 4-digit one.
  const std::string id = bus_id.substr(bus_id.size() - 12);
  std::ifstream in("/sys/bus/pci/devices/0000" + id.substr(4) + "/" + file);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

TEST_CASE("the GPU's PCI bus id, NUMA node and local CPUs are found") {
  const Device gpu = Device::cuda(0);
  const std::string bus = pci_bus_id(gpu);
  INFO("PCI bus id " << bus);
  CHECK(std::regex_match(bus, std::regex("[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-9a-f]")));
  const RankTopology r = read_rank_topology(0, 0, gpu);
  INFO(encode_rank_topology(r));
  CHECK(r.gpu_pci_bus_id == bus);
#if QUINTET_HAS_HWLOC
  CHECK(r.has_topology);
  CHECK(r.source.find("not among its PCI devices") == std::string::npos);
  CHECK(r.gpu_numa_node >= 0);
  CHECK(!r.gpu_cpus.empty());
  CHECK(r.host_cpus.contains(r.gpu_cpus));
  const std::string node = pci_sysfs(bus, "numa_node");
  if (!node.empty() && node != "-1") CHECK(r.gpu_numa_node == std::stoi(node));
  const std::string local = pci_sysfs(bus, "local_cpulist");
  if (!local.empty()) CHECK(CpuSet::parse(local).contains(r.gpu_cpus));
#else
  CHECK(r.source == "no topology: built without hwloc");
#endif
  RankTopology placed = r;
  placed.placed_cpus = plan_placement({r}, CpuAffinity::automatic)[0];
  const TopologyReport report = topology_report({placed}, CpuAffinity::automatic);
  INFO(report.text());
  REQUIRE(report.lines.size() == 4);
  CHECK(report.lines[2].rfind(fmt::format("  gpu {} (cuda:0): NUMA ", bus), 0) == 0);
  CHECK(report.lines[3].rfind("  rank 0   local 0  cuda:0  cpus ", 0) == 0);
  // Placed by auto, the rank's CPUs are on its GPU's NUMA node.
  for (const std::string& w : report.warnings) CHECK(w.find("NUMA node") == std::string::npos);
}
