// The pure parts of core/topology.hpp: placement, the report and the exchange format.
#include "quintet/core/topology.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include "quintet/core/error.hpp"

namespace quintet {

CpuAffinity parse_cpu_affinity(std::string_view name) {
  if (name == "auto") return CpuAffinity::automatic;
  if (name == "none") return CpuAffinity::none;
  QUINTET_THROW(InvalidArgument, "unknown CPU affinity '{}': expected auto or none", name);
}

std::string_view cpu_affinity_name(CpuAffinity affinity) {
  return affinity == CpuAffinity::automatic ? "auto" : "none";
}

std::vector<int> RankTopology::numa_nodes_of(const CpuSet& cpus) const {
  std::vector<int> out;
  for (const NumaNode& n : numa_nodes) {
    if (n.cpus.intersects(cpus)) out.push_back(n.index);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// Share i of n of cpus: whole cores (as the host's cores cut them) while there are at least n,
// else single CPUs; all of cpus when they are fewer than n.
CpuSet share_of(const CpuSet& cpus, const std::vector<CpuSet>& host_cores, int i, int n) {
  std::vector<CpuSet> units;
  for (const CpuSet& core : host_cores) {
    CpuSet mine = core.intersection(cpus);
    if (!mine.empty()) units.push_back(std::move(mine));
  }
  // CPUs no known core holds (no topology) are cores of their own.
  for (int c : cpus.cpus()) {
    const bool held =
        std::any_of(units.begin(), units.end(), [c](const CpuSet& u) { return u.contains(c); });
    if (!held) units.push_back(CpuSet({c}));
  }
  std::sort(units.begin(), units.end(),
            [](const CpuSet& a, const CpuSet& b) { return a.cpus().front() < b.cpus().front(); });
  if (static_cast<int>(units.size()) < n) {
    units.clear();
    for (int c : cpus.cpus()) units.push_back(CpuSet({c}));
  }
  const int u = static_cast<int>(units.size());
  if (u < n) return cpus;
  std::vector<int> out;
  for (int k = i * u / n; k < (i + 1) * u / n; ++k) {
    out.insert(out.end(), units[k].cpus().begin(), units[k].cpus().end());
  }
  return CpuSet(std::move(out));
}

std::string join(const std::vector<int>& xs) {
  std::string out;
  for (int x : xs) out += fmt::format("{}{}", out.empty() ? "" : ",", x);
  return out;
}

std::string join(const std::vector<std::string>& xs, std::string_view sep) {
  std::string out;
  for (const std::string& x : xs) {
    if (!out.empty()) out += sep;
    out += x;
  }
  return out;
}

}  // namespace

std::vector<CpuSet> plan_placement(const std::vector<RankTopology>& ranks, CpuAffinity affinity) {
  std::vector<CpuSet> placed(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankTopology& r = ranks[i];
    placed[i] = r.start_cpus;
    if (affinity == CpuAffinity::automatic && !r.gpu_cpus.empty()) {
      CpuSet near = r.gpu_cpus.intersection(r.start_cpus);
      if (!near.empty()) placed[i] = std::move(near);
    }
  }
  if (affinity == CpuAffinity::none) return placed;
  // Ranks of one host left with the same CPUs share them out.
  std::map<std::pair<std::string, std::vector<int>>, std::vector<std::size_t>> sharing;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    sharing[{ranks[i].host, placed[i].cpus()}].push_back(i);
  }
  for (auto& [key, members] : sharing) {
    if (members.size() < 2) continue;
    std::sort(members.begin(), members.end(), [&](std::size_t a, std::size_t b) {
      return ranks[a].local_rank < ranks[b].local_rank;
    });
    const CpuSet cpus = placed[members.front()];
    const int n = static_cast<int>(members.size());
    for (int k = 0; k < n; ++k) {
      placed[members[k]] = share_of(cpus, ranks[members[k]].cores, k, n);
    }
  }
  return placed;
}

std::string TopologyReport::text() const {
  std::string out;
  for (const std::string& l : lines) out += fmt::format("{}\n", l);
  if (warnings.empty()) return out += "warnings: none\n";
  out += "warnings:\n";
  for (const std::string& w : warnings) out += fmt::format("  {}\n", w);
  return out;
}

TopologyReport topology_report(const std::vector<RankTopology>& ranks, CpuAffinity affinity) {
  TopologyReport report;
  std::vector<const RankTopology*> sorted;
  for (const RankTopology& r : ranks) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(),
            [](const RankTopology* a, const RankTopology* b) { return a->rank < b->rank; });
  std::vector<std::string> hosts;  // in the order of their first rank
  for (const RankTopology* r : sorted) {
    if (std::find(hosts.begin(), hosts.end(), r->host) == hosts.end()) hosts.push_back(r->host);
  }
  std::set<std::string> sources;
  for (const RankTopology* r : sorted) sources.insert(r->source);
  report.lines.push_back(
      fmt::format("topology: {} rank{} on {} host{}, cpu affinity {}, {}", sorted.size(),
                  sorted.size() == 1 ? "" : "s", hosts.size(), hosts.size() == 1 ? "" : "s",
                  cpu_affinity_name(affinity),
                  join(std::vector<std::string>(sources.begin(), sources.end()), "; ")));
  for (const std::string& host : hosts) {
    std::vector<const RankTopology*> on;
    for (const RankTopology* r : sorted) {
      if (r->host == host) on.push_back(r);
    }
    const RankTopology& first = *on.front();
    std::string numa;
    for (const NumaNode& n : first.numa_nodes) {
      numa += fmt::format("{}NUMA {}: {}", numa.empty() ? "" : ", ", n.index, n.cpus.str());
    }
    report.lines.push_back(fmt::format(
        "host {}: cpus {} ({} cores){}{}", host, first.host_cpus.str(),
        first.cores.empty() ? first.host_cpus.size() : static_cast<int>(first.cores.size()),
        numa.empty() ? "" : ", ", numa));
    // Its GPUs, by PCI bus id, with their NUMA node and ranks.
    std::map<std::string, std::vector<const RankTopology*>> gpus;
    for (const RankTopology* r : on) {
      if (!r->gpu_pci_bus_id.empty()) gpus[r->gpu_pci_bus_id].push_back(r);
    }
    for (const auto& [bus, users] : gpus) {
      std::vector<int> ids;
      for (const RankTopology* r : users) ids.push_back(r->rank);
      const int node = users.front()->gpu_numa_node;
      report.lines.push_back(
          fmt::format("  gpu {} ({}): NUMA {}, cpus {}, rank{} {}", bus, users.front()->device,
                      node >= 0 ? fmt::format("{}", node) : "?",
                      users.front()->gpu_cpus.empty() ? "?" : users.front()->gpu_cpus.str(),
                      ids.size() == 1 ? "" : "s", join(ids)));
    }
    for (const RankTopology* r : on) {
      const std::vector<int> nodes = r->numa_nodes_of(r->placed_cpus);
      report.lines.push_back(fmt::format("  rank {:<3} local {:<2} {:<7} cpus {} (NUMA {}){}{}",
                                         r->rank, r->local_rank, r->device, r->placed_cpus.str(),
                                         nodes.empty() ? "?" : join(nodes),
                                         r->nics.empty() ? "" : ", nics ", join(r->nics, " ")));
    }
  }

  // Warnings. Ranks sharing CPUs: identical placements first (one line for the group), then
  // partial overlaps, pair by pair.
  for (const std::string& host : hosts) {
    std::vector<const RankTopology*> on;
    for (const RankTopology* r : sorted) {
      if (r->host == host && r->placed_cpus != r->host_cpus) on.push_back(r);
    }
    std::map<std::vector<int>, std::vector<int>> same;
    for (const RankTopology* r : on) same[r->placed_cpus.cpus()].push_back(r->rank);
    for (const auto& [cpus, ids] : same) {
      if (ids.size() > 1) {
        report.warnings.push_back(fmt::format("ranks {} on {} are bound to the same cpus {}",
                                              join(ids), host, CpuSet(cpus).str()));
      }
    }
    for (std::size_t a = 0; a < on.size(); ++a) {
      for (std::size_t b = a + 1; b < on.size(); ++b) {
        const CpuSet both = on[a]->placed_cpus.intersection(on[b]->placed_cpus);
        if (both.empty() || on[a]->placed_cpus == on[b]->placed_cpus) continue;
        report.warnings.push_back(fmt::format("ranks {} and {} on {} share cpus {}", on[a]->rank,
                                              on[b]->rank, host, both.str()));
      }
    }
  }
  for (const RankTopology* r : sorted) {
    const std::vector<int> nodes = r->numa_nodes_of(r->placed_cpus);
    if (r->gpu_numa_node >= 0 && !nodes.empty() &&
        std::find(nodes.begin(), nodes.end(), r->gpu_numa_node) == nodes.end()) {
      report.warnings.push_back(fmt::format(
          "rank {}: its GPU {} ({}) is on NUMA node {} but its cpus {} are on NUMA node{} {}{}",
          r->rank, r->device, r->gpu_pci_bus_id, r->gpu_numa_node, r->placed_cpus.str(),
          nodes.size() == 1 ? "" : "s", join(nodes),
          affinity == CpuAffinity::none && r->start_cpus.intersects(r->gpu_cpus)
              ? " (--cpu-affinity auto would place them next to it)"
              : ""));
    }
    if (r->loader_threads > r->placed_cpus.size()) {
      report.warnings.push_back(fmt::format("rank {}: {} loader threads on {} cpus ({})", r->rank,
                                            r->loader_threads, r->placed_cpus.size(),
                                            r->placed_cpus.str()));
    }
  }
  return report;
}

// The exchange format: one "key value" line per field; lists of CPU sets are separated by ';'.
std::string encode_rank_topology(const RankTopology& f) {
  std::string out;
  auto put = [&out](std::string_view key, const std::string& value) {
    out += fmt::format("{} {}\n", key, value);
  };
  put("rank", fmt::format("{}", f.rank));
  put("local_rank", fmt::format("{}", f.local_rank));
  put("host", f.host);
  put("device", f.device);
  put("source", f.source);
  put("has_topology", f.has_topology ? "1" : "0");
  put("host_cpus", f.host_cpus.str());
  put("start_cpus", f.start_cpus.str());
  for (const NumaNode& n : f.numa_nodes) put("numa", fmt::format("{} {}", n.index, n.cpus.str()));
  std::string cores;
  for (const CpuSet& c : f.cores) {
    if (!cores.empty()) cores += ';';
    cores += c.str();
  }
  put("cores", cores);
  put("gpu_pci_bus_id", f.gpu_pci_bus_id);
  put("gpu_numa_node", fmt::format("{}", f.gpu_numa_node));
  put("gpu_cpus", f.gpu_cpus.str());
  put("nics", join(f.nics, " "));
  put("placed_cpus", f.placed_cpus.str());
  put("loader_threads", fmt::format("{}", f.loader_threads));
  return out;
}

RankTopology decode_rank_topology(std::string_view text) {
  RankTopology f;
  auto integer = [&](std::string_view v) {
    int x = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    QUINTET_CHECK(ec == std::errc() && ptr == v.data() + v.size(),
                  "decode_rank_topology: expected an integer, got '{}'", v);
    return x;
  };
  auto split = [](std::string_view v, char sep) {
    std::vector<std::string_view> parts;
    while (!v.empty()) {
      const auto at = v.find(sep);
      if (at != 0) parts.push_back(v.substr(0, at));
      if (at == std::string_view::npos) break;
      v.remove_prefix(at + 1);
    }
    return parts;
  };
  std::set<std::string_view> seen;
  for (std::string_view line : split(text, '\n')) {
    const auto space = line.find(' ');
    QUINTET_CHECK(space != std::string_view::npos,
                  "decode_rank_topology: expected 'key value', got '{}'", line);
    const std::string_view key = line.substr(0, space), v = line.substr(space + 1);
    seen.insert(key);
    if (key == "rank") {
      f.rank = integer(v);
    } else if (key == "local_rank") {
      f.local_rank = integer(v);
    } else if (key == "host") {
      f.host = v;
    } else if (key == "device") {
      f.device = v;
    } else if (key == "source") {
      f.source = v;
    } else if (key == "has_topology") {
      f.has_topology = v == "1";
    } else if (key == "host_cpus") {
      f.host_cpus = CpuSet::parse(v);
    } else if (key == "start_cpus") {
      f.start_cpus = CpuSet::parse(v);
    } else if (key == "numa") {
      const auto sp = v.find(' ');
      f.numa_nodes.push_back(
          {integer(v.substr(0, sp)),
           CpuSet::parse(sp == std::string_view::npos ? std::string_view() : v.substr(sp + 1))});
    } else if (key == "cores") {
      for (std::string_view c : split(v, ';')) f.cores.push_back(CpuSet::parse(c));
    } else if (key == "gpu_pci_bus_id") {
      f.gpu_pci_bus_id = v;
    } else if (key == "gpu_numa_node") {
      f.gpu_numa_node = integer(v);
    } else if (key == "gpu_cpus") {
      f.gpu_cpus = CpuSet::parse(v);
    } else if (key == "nics") {
      for (std::string_view n : split(v, ' ')) f.nics.emplace_back(n);
    } else if (key == "placed_cpus") {
      f.placed_cpus = CpuSet::parse(v);
    } else if (key == "loader_threads") {
      f.loader_threads = integer(v);
    } else {
      QUINTET_THROW(InvalidArgument, "decode_rank_topology: unknown key '{}'", key);
    }
  }
  for (std::string_view key : {"rank", "host", "start_cpus", "placed_cpus"}) {
    QUINTET_CHECK(seen.count(key) == 1, "decode_rank_topology: the text has no '{}' line", key);
  }
  return f;
}

}  // namespace quintet
