// read_rank_topology: this rank's facts, through hwloc when the build has it.
#include <unistd.h>

#include <climits>

#include "quintet/core/config.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/topology.hpp"
#if QUINTET_HAS_HWLOC
#include <hwloc.h>
#endif

namespace quintet {

namespace {

std::string this_host() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name)) != 0) return "localhost";
  name[HOST_NAME_MAX] = '\0';
  return name;
}

#if QUINTET_HAS_HWLOC

// hwloc's bitmaps of CPUs are indexed by the OS's CPU numbers, as CpuSet is.
CpuSet to_cpu_set(hwloc_const_bitmap_t bitmap) {
  std::vector<int> cpus;
  if (bitmap == nullptr || hwloc_bitmap_weight(bitmap) < 0) return CpuSet();  // infinite: none
  for (int c = hwloc_bitmap_first(bitmap); c >= 0; c = hwloc_bitmap_next(bitmap, c)) {
    cpus.push_back(c);
  }
  return CpuSet(std::move(cpus));
}

// Owns a loaded hwloc topology.
class HwlocTopology {
 public:
  HwlocTopology() { hwloc_topology_init(&topology_); }
  ~HwlocTopology() { hwloc_topology_destroy(topology_); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  hwloc_topology_t get() const { return topology_; }

 private:
  hwloc_topology_t topology_ = nullptr;
};

std::string hwloc_version() {
  const unsigned v = hwloc_get_api_version();
  return fmt::format("hwloc (API {}.{})", v >> 16, (v >> 8) & 0xff);
}

// Fills the hwloc facts of f; returns false (with f.source saying why) when the machine cannot be
// read.
bool read_with_hwloc(RankTopology& f, const TopologySource& source) {
  HwlocTopology topology;
  hwloc_topology_t t = topology.get();
  if (!source.xml.empty()) {
    QUINTET_CHECK(hwloc_topology_set_xmlbuffer(t, source.xml.data(),
                                               static_cast<int>(source.xml.size() + 1)) == 0,
                  "read_rank_topology: hwloc cannot use the XML topology given ({} bytes)",
                  source.xml.size());
  }
  // PCI devices (GPUs) and their OS devices (network interfaces, InfiniBand ports).
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(t) != 0) {
    QUINTET_CHECK(source.xml.empty(),
                  "read_rank_topology: hwloc cannot load the XML topology given; is it hwloc "
                  "2 XML (lstopo --of xml)?");
    f.source = "no topology: hwloc could not read this machine";
    return false;
  }
  f.source = hwloc_version();
  f.host_cpus = to_cpu_set(hwloc_topology_get_topology_cpuset(t));
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) {
    f.numa_nodes.push_back({static_cast<int>(n->os_index), to_cpu_set(n->cpuset)});
  }
  for (hwloc_obj_t c = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_CORE, nullptr); c != nullptr;
       c = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_CORE, c)) {
    f.cores.push_back(to_cpu_set(c->cpuset));
  }
  // What "near" means for the network devices: the GPU's locality, else the rank's own CPUs.
  CpuSet near = f.start_cpus;
  if (!f.gpu_pci_bus_id.empty()) {
    hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(t, f.gpu_pci_bus_id.c_str());
    if (pci == nullptr) {
      f.source += fmt::format(" (GPU {} not among its PCI devices)", f.gpu_pci_bus_id);
    } else {
      hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(t, pci);
      f.gpu_cpus = to_cpu_set(local->cpuset);
      if (local->nodeset != nullptr && !hwloc_bitmap_iszero(local->nodeset)) {
        f.gpu_numa_node = hwloc_bitmap_first(local->nodeset);
      }
      near = f.gpu_cpus;
    }
  }
  for (hwloc_obj_t d = hwloc_get_next_osdev(t, nullptr); d != nullptr;
       d = hwloc_get_next_osdev(t, d)) {
    const auto type = d->attr->osdev.type;
    if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(t, d);
    if (local != nullptr && d->name != nullptr && to_cpu_set(local->cpuset).intersects(near)) {
      f.nics.emplace_back(d->name);
    }
  }
  return true;
}

#endif  // QUINTET_HAS_HWLOC

}  // namespace

RankTopology read_rank_topology(int rank, int local_rank, const Device& device,
                                const TopologySource& source) {
  RankTopology f;
  f.rank = rank;
  f.local_rank = local_rank;
  f.host = source.host.empty() ? this_host() : source.host;
  f.device = device.str();
  f.start_cpus = source.start_cpus_given ? source.start_cpus : calling_thread_cpus();
  f.placed_cpus = f.start_cpus;
  if (device.is_cuda()) {
    f.gpu_pci_bus_id = source.gpu_pci_bus_id.empty() ? pci_bus_id(device) : source.gpu_pci_bus_id;
  }
#if QUINTET_HAS_HWLOC
  f.has_topology = read_with_hwloc(f, source);
#else
  QUINTET_CHECK(source.xml.empty(),
                "read_rank_topology: an XML topology was given, but this Quintet was built without "
                "hwloc (QUINTET_WITH_HWLOC; install libhwloc-dev)");
  f.source = "no topology: built without hwloc";
#endif
  if (!f.has_topology) f.host_cpus = online_cpus();
  return f;
}

}  // namespace quintet
