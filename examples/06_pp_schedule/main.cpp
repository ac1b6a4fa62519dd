// 06_pp_schedule: makes (or loads) a pipeline schedule, simulates it and shows where the time goes.
//
//   06_pp_schedule --pp 4 --microbatches 8 --schedule 1f1b        the rank x time grid, the bubble
//   06_pp_schedule --pp 4 --microbatches 8 --schedule zb-h1 --json one JSON object
//   06_pp_schedule --file my.schedule --trace my.json              a hand-written schedule, and a
//                                                                  Chrome / Perfetto trace of it
//
// Nothing is launched: schedules are data and the simulator models the executor (schedule.hpp).
// Costs are per stage and microbatch in any unit: --cost-b is the full backward, --cost-w the
// weight-gradient part of it that split schedules (zb-h1, zb-v) run separately as W. An invalid
// combination or a schedule that would deadlock prints why and exits with status 1.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/parallel/pipeline/schedule.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"

namespace pipeline = quintet::pipeline;

namespace {

// One row per rank, one column per distinct compute start time, each compute as its code in the
// column where it starts; transfers are left out (they run beside the compute). Wide grids are cut
// into blocks of at most kWidth characters.
void print_grid(const pipeline::Simulation& sim) {
  constexpr std::size_t kWidth = 110;
  std::vector<double> times;
  std::size_t cell = 1;
  for (const auto& rank : sim.timeline) {
    for (const auto& t : rank) {
      if (!pipeline::is_compute(t.action.kind)) continue;
      times.push_back(t.start);
      cell = std::max(cell, t.action.str().size());
    }
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  for (double t : times) cell = std::max(cell, fmt::format("{:g}", t).size());
  cell += 1;
  std::map<double, std::size_t> column;
  for (std::size_t i = 0; i < times.size(); ++i) column[times[i]] = i;
  const int pp = static_cast<int>(sim.timeline.size());
  std::vector<std::vector<std::string>> grid(pp, std::vector<std::string>(times.size(), "."));
  for (int r = 0; r < pp; ++r) {
    for (const auto& t : sim.timeline[r]) {
      if (pipeline::is_compute(t.action.kind)) grid[r][column[t.start]] = t.action.str();
    }
  }
  const std::string label_time = "time";
  const std::size_t label = fmt::format("rank {}", pp - 1).size() + 1;
  const std::size_t per_block = std::max<std::size_t>(1, (kWidth - label) / cell);
  for (std::size_t first = 0; first < times.size(); first += per_block) {
    const std::size_t last = std::min(times.size(), first + per_block);
    std::string head = fmt::format("{:<{}}", label_time, label);
    for (std::size_t c = first; c < last; ++c)
      head += fmt::format("{:>{}}", fmt::format("{:g}", times[c]), cell);
    fmt::print("{}\n", head);
    for (int r = 0; r < pp; ++r) {
      std::string row = fmt::format("{:<{}}", fmt::format("rank {}", r), label);
      for (std::size_t c = first; c < last; ++c) row += fmt::format("{:>{}}", grid[r][c], cell);
      fmt::print("{}\n", row);
    }
    fmt::print("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Makes or loads a pipeline schedule, simulates it and prints its bubble."};
  int pp = 4, vpp = 1, microbatches = 8;
  std::string kind = "1f1b", file, trace;
  bool json = false;
  pipeline::ActionCosts costs;
  app.add_option("--pp", pp, "pipeline ranks")->capture_default_str();
  app.add_option("--vpp", vpp, "stages per rank (interleaved: >= 2; zb-v: 2)")
      ->capture_default_str();
  app.add_option("--microbatches", microbatches, "microbatches per step")->capture_default_str();
  app.add_option("--schedule", kind, "gpipe, 1f1b, interleaved, zb-h1 or zb-v")
      ->capture_default_str();
  app.add_option("--file", file, "load this schedule (text form) instead of generating one");
  app.add_option("--cost-f", costs.forward, "cost of one forward (F)")->capture_default_str();
  app.add_option("--cost-b", costs.backward, "cost of one full backward (B = I + W)")
      ->capture_default_str();
  app.add_option("--cost-w", costs.weight_grad, "cost of its weight-gradient part (W)")
      ->capture_default_str();
  app.add_option("--cost-p2p", costs.p2p, "latency of one batched transfer")->capture_default_str();
  app.add_flag("--json", json, "print one JSON object instead of the grid");
  app.add_option("--trace", trace, "write the simulated timeline as a Chrome trace to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    // validate() runs inside make_schedule() and load().
    const pipeline::Schedule schedule =
        file.empty() ? pipeline::make_schedule(pipeline::parse_schedule_kind(kind), pp, vpp,
                                               microbatches, costs)
                     : pipeline::Schedule::load(file);
    const pipeline::Simulation sim = pipeline::simulate(schedule, costs);
    if (!trace.empty()) {
      std::ofstream out(trace);
      out << pipeline::chrome_trace(sim);
      if (!out) QUINTET_THROW(System, "cannot write the trace file '{}'", trace);
    }
    if (json) {
      nlohmann::ordered_json out;
      out["schedule"] = schedule.name;
      out["pp"] = schedule.pp;
      out["vpp"] = schedule.vpp;
      out["microbatches"] = schedule.microbatches;
      out["costs"] = {{"forward", costs.forward},
                      {"backward", costs.backward},
                      {"weight_grad", costs.weight_grad},
                      {"p2p", costs.p2p}};
      out["deadlock"] = sim.deadlock;
      if (sim.deadlock) out["deadlock_report"] = sim.deadlock_report;
      out["makespan"] = sim.makespan;
      out["bubble_fraction"] = sim.bubble_fraction;
      out["peak_activations"] = sim.peak_in_flight;
      out["busy"] = sim.busy;
      std::printf("%s\n", out.dump().c_str());
    } else {
      fmt::print(
          "schedule {}: pp {}, vpp {}, {} microbatches; costs F {:g}, B {:g} (W {:g}), "
          "p2p {:g}\n\n",
          schedule.name, schedule.pp, schedule.vpp, schedule.microbatches, costs.forward,
          costs.backward, costs.weight_grad, costs.p2p);
      print_grid(sim);
      if (!sim.deadlock) {
        fmt::print("makespan {:g}, bubble fraction {:.4f}\n", sim.makespan, sim.bubble_fraction);
        std::string peaks;
        for (int p : sim.peak_in_flight) peaks += fmt::format(" {}", p);
        fmt::print("peak in-flight microbatches per rank:{}\n", peaks);
      }
    }
    if (sim.deadlock) {
      std::fprintf(stderr, "06_pp_schedule: the schedule deadlocks:\n%s",
                   sim.deadlock_report.c_str());
      return 1;
    }
  } catch (const quintet::Error& e) {
    std::fprintf(stderr, "06_pp_schedule: %s\n", e.what());
    return 1;
  }
  return 0;
}
