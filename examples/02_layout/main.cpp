// 02_layout: prints the rank groups Quintet (and Megatron-Core) build for a 5-D parallel config.
//
//   02_layout --world 16 --tp 2 --pp 2 --ep 2          a table of every axis's groups and ranks
//   02_layout --world 16 --tp 2 --pp 2 --ep 2 --json   one JSON object with every group
//   mpirun -np 8 02_layout --topology [--loader-threads 4] [--cpu-affinity auto|none]
//                                                    this job's machines: per host its NUMA nodes,
//                                                    GPUs and ranks, each rank's CPUs, and the
//                                                    warnings (docs/topology.md)
//
// For the layout nothing is launched: a Layout is a pure function of the config and the world
// size. An invalid config prints the validation message and exits with status 1. --topology starts
// the job (quintet::init, which places each rank) and rank 0 prints the report; with --json, one
// JSON object with its lines and warnings.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/error.hpp"
#include "quintet/parallel/layout.hpp"

namespace {

std::string format_group(const std::vector<int>& group) {
  std::string out = "[";
  for (std::size_t i = 0; i < group.size(); ++i) out += fmt::format("{}{}", i ? "," : "", group[i]);
  return out + "]";
}

void print_table(const quintet::Layout& layout) {
  const quintet::ParallelConfig& c = layout.config();
  const int edp = layout.group_size(quintet::Axis::edp);
  fmt::print("world {}: tp {}, cp {}, ep {}, etp {}, dp {}, edp {}, pp {}, vpp {}, order {}\n\n",
             layout.world(), c.tp, c.cp, c.ep, c.etp, c.dp, edp, c.pp, c.vpp, c.order);
  // One line per axis; long lists wrap under the first group.
  constexpr int kWidth = 100, kIndent = 28;
  fmt::print("{:<10} {:>7} {:>6}   {}\n", "axis", "groups", "size", "ranks of each group");
  for (quintet::Axis axis : quintet::kAllAxes) {
    const auto& groups = layout.groups(axis);
    std::string line = fmt::format("{:<10} {:>7} {:>6}   ", quintet::axis_name(axis), groups.size(),
                                   layout.group_size(axis));
    int column = kIndent;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string text = format_group(groups[g]);
      if (g > 0 && column + 1 + static_cast<int>(text.size()) > kWidth) {
        line += "\n" + std::string(kIndent, ' ');
        column = kIndent;
      } else if (g > 0) {
        line += " ";
        ++column;
      }
      line += text;
      column += static_cast<int>(text.size());
    }
    fmt::print("{}\n", line);
  }
  fmt::print("\n{:>5} {:>4} {:>4} {:>4} {:>4} {:>4} {:>4} {:>4}   {}\n", "rank", "tp", "cp", "dp",
             "pp", "ep", "etp", "edp", "embedding");
  for (int r = 0; r < layout.world(); ++r) {
    const quintet::Coordinates x = layout.coordinates(r);
    const bool emb = layout.contains(quintet::Axis::embedding, r);
    fmt::print("{:>5} {:>4} {:>4} {:>4} {:>4} {:>4} {:>4} {:>4}   {}\n", r, x.tp, x.cp, x.dp, x.pp,
               x.ep, x.etp, x.edp, emb ? "yes" : "no");
  }
}

void print_json(const quintet::Layout& layout) {
  const quintet::ParallelConfig& c = layout.config();
  nlohmann::ordered_json out;
  out["world"] = layout.world();
  out["config"] = {{"tp", c.tp},   {"cp", c.cp},   {"ep", c.ep},
                   {"etp", c.etp}, {"dp", c.dp},   {"edp", layout.group_size(quintet::Axis::edp)},
                   {"pp", c.pp},   {"vpp", c.vpp}, {"order", c.order}};
  nlohmann::ordered_json groups = nlohmann::ordered_json::object();
  for (quintet::Axis axis : quintet::kAllAxes) {
    groups[std::string(quintet::axis_name(axis))] = layout.groups(axis);
  }
  out["groups"] = std::move(groups);
  std::printf("%s\n", out.dump().c_str());
}

// The topology report of this job, printed by rank 0.
int print_topology(const quintet::RuntimeConfig& runtime, int loader_threads, bool json) {
  quintet::World world = quintet::init(runtime);
  try {
    const quintet::TopologyReport report = world.topology_report(loader_threads);
    if (world.rank() == 0) {
      if (json) {
        nlohmann::ordered_json out;
        out["lines"] = report.lines;
        out["warnings"] = report.warnings;
        std::printf("%s\n", out.dump().c_str());
      } else {
        std::printf("%s", report.text().c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "02_layout: %s\n", e.what());
    world.fail(e, 1);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The runtime's flags (--cpu-affinity, --device, ...) first; the rest are this program's.
  quintet::RuntimeConfig runtime;
  try {
    runtime = quintet::RuntimeConfig::from_args(argc, argv);
  } catch (const quintet::Error& e) {
    std::fprintf(stderr, "02_layout: %s\n", e.what());
    return 1;
  }
  CLI::App app{"Prints the rank groups of a 5-D parallel layout (Megatron-Core placement)."};
  int world = 0;
  bool json = false;
  bool topology = false;
  int loader_threads = 0;
  quintet::ParallelConfig config;
  app.add_option("--world", world, "number of ranks (the layout; not with --topology)");
  app.add_flag("--topology", topology,
               "print this job's topology report instead (run it under mpirun for a job)");
  app.add_option("--loader-threads", loader_threads,
                 "with --topology: the data loader's threads per rank, checked against its cpus")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tp", config.tp, "tensor parallel size")->capture_default_str();
  app.add_option("--pp", config.pp, "pipeline parallel size (stages)")->capture_default_str();
  app.add_option("--cp", config.cp, "context parallel size")->capture_default_str();
  app.add_option("--ep", config.ep, "expert parallel size")->capture_default_str();
  app.add_option("--etp", config.etp, "expert tensor parallel size (0: same as tp)")
      ->capture_default_str();
  app.add_option("--dp", config.dp, "data parallel size (0: world / (tp*cp*pp))")
      ->capture_default_str();
  app.add_option("--vpp", config.vpp, "model chunks per pipeline rank")->capture_default_str();
  app.add_option("--order", config.order, "dimension order, first fastest")->capture_default_str();
  app.add_flag("--json", json, "print one JSON object instead of the table");
  std::vector<const char*> args;
  for (const std::string& a : runtime.remaining_args) args.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (topology) {
    if (world != 0) {
      std::fprintf(stderr, "02_layout: --topology reports the job it runs in: drop --world\n");
      return 1;
    }
    try {
      return print_topology(runtime, loader_threads, json);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "02_layout: %s\n", e.what());
      return 1;
    }
  }
  if (world <= 0) {
    std::fprintf(stderr, "02_layout: --world is required (or --topology)\n");
    return 1;
  }

  try {
    const quintet::Layout layout(config, world);
    if (json) {
      print_json(layout);
    } else {
      print_table(layout);
    }
  } catch (const quintet::Error& e) {
    std::fprintf(stderr, "02_layout: invalid parallel config: %s\n", e.what());
    return 1;
  }
  return 0;
}
