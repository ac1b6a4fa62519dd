// 07_pp_bench: pipeline schedules run for real on pp ranks and measured against the simulator.
//
// One rank per pipeline stage (pp = the job's size; tp = dp = 1). For each schedule it builds the
// library GPT cut into pp * vpp chunks (vpp 2 for interleaved and zb-v) and runs pipeline steps of
// --microbatches microbatches through the executor with its timeline on: --warmup steps, then
// --rounds rounds of --steps steps of each schedule in turn (so that a drift of the machine's
// speed reaches every schedule alike). The schedules are planned (make_schedule's costs: ZB-H1's
// and ZB-V's orders, every receive's place) at the costs that --warmup steps of 1F1B and ZB-H1
// measure first, as a user would after profiling (--plan-default: at the default costs). It
// reports, per schedule:
//   step_ms              median over the measured steps of the pipeline part of a step (forward,
//                        backward and transfers, the slowest rank; all ranks start it together
//                        after a barrier; the optimizer, the same for every schedule, is left out)
//   measured bubble      median over steps of 1 - sum(busy) / (pp * step), busy = a rank's time in
//                        F, B, I, W (the executor's timeline)
//   predicted bubble     the simulator on this schedule with each action's measured mean
//                        duration over the measured steps and the measured p2p latency (a
//                        ping-pong of one activation between ranks 0 and 1); "stage": with the
//                        mean of each action kind per stage (F, B, or I and W) instead;
//                        "uniform": with the means over stages
//   replayed bubble      median over steps of the simulator replaying that step's measured
//                        duration of every action: what the model leaves out of the executor
//   peak in flight       per rank, measured (executor) and simulated
//   peak activation MiB  per rank: the most CPU memory allocated during a step above what was
//                        allocated before it (parameters and gradients are allocated before)
// and the step-time ratios of each schedule to 1F1B. CPU only (one thread per rank: give each
// rank its own core). --json FILE writes everything as one object.
//
//   mpirun -np 4 07_pp_bench --device cpu --layers 8 --microbatches 8 --json pp.json
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/allocator.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/model/gpt.hpp"
#include "quintet/parallel/pipeline/executor.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"

namespace {

using quintet::Axis;
using quintet::Tensor;
namespace pl = quintet::pipeline;

struct BenchConfig {
  std::int64_t layers = 8, hidden = 256, heads = 8, vocab = 256, seq_len = 128, micro_batch = 2;
  int microbatches = 8;
  int steps = 2, rounds = 4, warmup = 2;  // per schedule: warmup, then rounds x steps measured
  std::string schedules = "gpipe,1f1b,interleaved,zb-h1,zb-v";
  std::string json;
  bool plan_measured = true;  // plan the schedules at costs measured first (else the defaults)
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Element-wise sum (or max) over the world of a vector of doubles.
std::vector<double> reduce(quintet::Communicator& world, std::vector<double> v,
                           quintet::ReduceOp op) {
  Tensor t = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
  world.all_reduce(t, op).wait();
  return t.to_vector<double>();
}

// One microbatch's tokens and targets: a fixed pseudo-random pattern (timing does not depend on
// the values).
pl::MicrobatchData microbatch(const BenchConfig& c, int m) {
  std::vector<std::int64_t> ids, targets;
  for (std::int64_t i = 0; i < c.micro_batch * c.seq_len; ++i) {
    ids.push_back((7 * m + 5 * i + 3) % c.vocab);
    targets.push_back((11 * m + 3 * i + 1) % c.vocab);
  }
  return {Tensor::from_vector(ids, {c.micro_batch, c.seq_len}),
          Tensor::from_vector(targets, {c.micro_batch, c.seq_len})};
}

// Half a round trip of one activation between pipeline ranks 0 and 1: the p2p latency the
// simulator is given. Median of 20 after 5 warm-ups.
double p2p_latency_ms(quintet::Communicator& pp, const quintet::Shape& shape) {
  if (pp.size() < 2) return 0.0;
  Tensor buf = Tensor::zeros(shape, quintet::DType::f32);
  std::vector<double> half_trips;
  for (int i = 0; i < 25; ++i) {
    pp.barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    if (pp.rank() == 0) {
      pp.p2p({quintet::P2POp::send(buf, 1)}).wait();
      pp.p2p({quintet::P2POp::recv(buf, 1)}).wait();
    } else if (pp.rank() == 1) {
      pp.p2p({quintet::P2POp::recv(buf, 0)}).wait();
      pp.p2p({quintet::P2POp::send(buf, 0)}).wait();
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 5) half_trips.push_back(ms / 2);
  }
  std::vector<double> mine{pp.rank() == 0 ? median(half_trips) : 0.0};
  return reduce(pp, mine, quintet::ReduceOp::sum)[0];
}

int kind_index(pl::ActionKind k) {
  switch (k) {
    case pl::ActionKind::forward:
      return 0;
    case pl::ActionKind::backward:
      return 1;
    case pl::ActionKind::input_grad:
      return 2;
    default:
      return 3;  // weight_grad
  }
}

// One schedule's model chunks, executor and measurements, kept across the rounds.
struct Bench {
  std::string name;
  pl::Schedule schedule;
  int vpp = 1;
  std::vector<std::unique_ptr<quintet::model::GptChunk>> chunks;
  std::vector<std::unique_ptr<quintet::nn::ParameterStore>> stores;
  std::unique_ptr<pl::PipelineExecutor> executor;
  std::vector<double> step_ms, bubble, replay_bubble, peak_mib;
  std::vector<double> sums, counts;  // [stage * 4 + kind]: measured time and count of actions
  // Every rank's compute actions in list order: their durations summed over the measured steps.
  std::vector<std::vector<double>> action_sums;
};

std::unique_ptr<Bench> make_bench(const BenchConfig& c, const std::string& name,
                                  quintet::Mesh& mesh, const pl::ActionCosts& plan) {
  quintet::Communicator& pp = mesh.comm(Axis::pp);
  auto b = std::make_unique<Bench>();
  b->name = name;
  const pl::ScheduleKind kind = pl::parse_schedule_kind(name);
  b->vpp = kind == pl::ScheduleKind::interleaved || kind == pl::ScheduleKind::zb_v ? 2 : 1;
  b->schedule = pl::make_schedule(kind, pp.size(), b->vpp, c.microbatches, plan);
  quintet::model::GptConfig model;
  model.layers = c.layers;
  model.hidden = c.hidden;
  model.heads = c.heads;
  model.ffn_hidden = 4 * c.hidden;
  model.vocab = c.vocab;
  model.seq_len = c.seq_len;
  const auto specs = quintet::model::split_into_chunks(model, pp.size() * b->vpp);
  std::vector<pl::StageModule> stages;
  for (int s : b->schedule.stages_of(pp.rank())) {
    b->chunks.push_back(quintet::model::build_gpt_chunk(model, {&mesh.comm(Axis::tp)}, specs[s]));
    b->stores.push_back(std::make_unique<quintet::nn::ParameterStore>(
        *b->chunks.back(), quintet::DType::f32, quintet::Stream(), 1234));
    stages.push_back({s, b->chunks.back().get(), nullptr});
  }
  b->executor = std::make_unique<pl::PipelineExecutor>(
      b->schedule, pp, stages,
      pl::ExecutorConfig{{c.micro_batch, c.seq_len, c.hidden}, quintet::DType::f32, true});
  const std::size_t n = static_cast<std::size_t>(b->schedule.num_stages()) * 4;
  b->sums.assign(n, 0.0);
  b->counts.assign(n, 0.0);
  return b;
}

// steps pipeline steps of one schedule; measured unless warmup.
void run_steps(const BenchConfig& c, Bench& b, quintet::Communicator& pp, double p2p_ms, int steps,
               bool warmup) {
  const quintet::Stream stream;
  const int n = pp.size(), rank = pp.rank();
  for (int step = 0; step < steps; ++step) {
    for (auto& st : b.stores) st->zero_grad(stream);
    pp.barrier().wait();
    quintet::cpu_reset_peak();
    const std::size_t before = quintet::cpu_allocator_stats().current_bytes;
    b.executor->run([&](int m) { return microbatch(c, m); }, 1.0f / c.microbatches, stream);
    const double peak = static_cast<double>(quintet::cpu_allocator_stats().peak_bytes - before);
    if (warmup) continue;
    const pl::ExecutorStats& stats = b.executor->last_step_stats();
    const double slowest = reduce(pp, {stats.step_ms}, quintet::ReduceOp::max)[0];
    const double busy = reduce(pp, {stats.busy_ms}, quintet::ReduceOp::sum)[0];
    b.step_ms.push_back(slowest);
    b.bubble.push_back(1.0 - busy / (n * slowest));
    b.peak_mib.push_back(peak / (1 << 20));
    // Every rank's measured durations, to replay this step on the simulator.
    std::vector<std::size_t> first(static_cast<std::size_t>(n) + 1, 0);
    for (int r = 0; r < n; ++r) {
      std::size_t k = 0;
      for (const pl::Action& a : b.schedule.actions[static_cast<std::size_t>(r)]) {
        k += pl::is_compute(a.kind) ? 1 : 0;
      }
      first[r + 1] = first[r] + k;
    }
    std::vector<double> flat(first.back(), 0.0);
    for (std::size_t k = 0; k < stats.timeline.size(); ++k) {
      const pl::TimedAction& t = stats.timeline[k];
      flat[first[rank] + k] = t.end - t.start;
      const std::size_t i =
          static_cast<std::size_t>(t.action.stage) * 4 + kind_index(t.action.kind);
      b.sums[i] += t.end - t.start;
      b.counts[i] += 1;
    }
    flat = reduce(pp, flat, quintet::ReduceOp::sum);
    std::vector<std::vector<double>> durations(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      durations[r].assign(flat.begin() + static_cast<std::ptrdiff_t>(first[r]),
                          flat.begin() + static_cast<std::ptrdiff_t>(first[r + 1]));
    }
    b.replay_bubble.push_back(pl::simulate(b.schedule, durations, p2p_ms).bubble_fraction);
    if (b.action_sums.empty()) {
      for (const auto& d : durations) b.action_sums.emplace_back(d.size(), 0.0);
    }
    for (int r = 0; r < n; ++r) {
      for (std::size_t k = 0; k < durations[r].size(); ++k) b.action_sums[r][k] += durations[r][k];
    }
  }
}

// The measured mean cost of each action kind per stage (F, B, or I + W and W), over every rank
// and measured step.
std::vector<pl::ActionCosts> measured_costs(const Bench& b, quintet::Communicator& pp,
                                            double p2p_ms) {
  const int n = b.schedule.num_stages();
  const std::vector<double> sums = reduce(pp, b.sums, quintet::ReduceOp::sum);
  const std::vector<double> counts = reduce(pp, b.counts, quintet::ReduceOp::sum);
  auto mean = [&](int stage, int k) {
    const std::size_t i = static_cast<std::size_t>(stage) * 4 + k;
    return counts[i] > 0 ? sums[i] / counts[i] : 0.0;
  };
  std::vector<pl::ActionCosts> per_stage(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s) {
    pl::ActionCosts& a = per_stage[static_cast<std::size_t>(s)];
    a.forward = mean(s, 0);
    const bool split = counts[static_cast<std::size_t>(s) * 4 + 2] > 0;
    a.weight_grad = split ? mean(s, 3) : 0.0;
    a.backward = split ? mean(s, 2) + mean(s, 3) : mean(s, 1);
    a.p2p = p2p_ms;
  }
  return per_stage;
}

// Their means over the stages.
pl::ActionCosts mean_over_stages(const std::vector<pl::ActionCosts>& per_stage) {
  pl::ActionCosts u{0, 0, 0, per_stage.front().p2p};
  const double n = static_cast<double>(per_stage.size());
  for (const pl::ActionCosts& a : per_stage) {
    u.forward += a.forward / n;
    u.backward += a.backward / n;
    u.weight_grad += a.weight_grad / n;
  }
  return u;
}

nlohmann::json report(Bench& b, quintet::Communicator& pp, double p2p_ms) {
  const int n = b.schedule.num_stages(), rank = pp.rank();
  // The measured mean costs per stage, and their means over stages (the uniform model).
  const std::vector<pl::ActionCosts> per_stage = measured_costs(b, pp, p2p_ms);
  const pl::ActionCosts uniform = mean_over_stages(per_stage);
  const pl::Simulation sim = pl::simulate(b.schedule, std::span<const pl::ActionCosts>(per_stage));
  const pl::Simulation sim_uniform = pl::simulate(b.schedule, uniform);
  // Each action's own mean duration over the measured steps (the same actions every step).
  std::vector<std::vector<double>> action_means = b.action_sums;
  for (auto& d : action_means) {
    for (double& x : d) x /= static_cast<double>(b.step_ms.size());
  }
  const pl::Simulation sim_actions = pl::simulate(b.schedule, action_means, p2p_ms);

  // Per-rank figures to every rank.
  std::vector<double> in_flight(static_cast<std::size_t>(pp.size()), 0.0), mem(in_flight);
  in_flight[static_cast<std::size_t>(rank)] = b.executor->last_step_stats().peak_in_flight;
  mem[static_cast<std::size_t>(rank)] = median(b.peak_mib);
  in_flight = reduce(pp, in_flight, quintet::ReduceOp::sum);
  mem = reduce(pp, mem, quintet::ReduceOp::sum);

  nlohmann::json out;
  out["schedule"] = b.name;
  out["vpp"] = b.vpp;
  out["steps"] = b.step_ms.size();
  out["step_ms"] = median(b.step_ms);
  out["bubble_measured"] = median(b.bubble);
  out["bubble_predicted"] = sim_actions.bubble_fraction;
  out["bubble_predicted_stage_costs"] = sim.bubble_fraction;
  out["bubble_predicted_uniform_costs"] = sim_uniform.bubble_fraction;
  out["bubble_replayed"] = median(b.replay_bubble);
  out["predicted_step_ms"] = sim_actions.makespan;
  out["peak_in_flight_measured"] = in_flight;
  out["peak_in_flight_simulated"] = sim.peak_in_flight;
  out["peak_activation_mib"] = mem;
  nlohmann::json costs = nlohmann::json::array();
  for (int s = 0; s < n; ++s) {
    const pl::ActionCosts& a = per_stage[static_cast<std::size_t>(s)];
    costs.push_back({{"stage", s}, {"F", a.forward}, {"B", a.backward}, {"W", a.weight_grad}});
  }
  out["costs_ms"] = costs;
  return out;
}

int run(const BenchConfig& c, quintet::World& world) {
  QUINTET_CHECK(world.device().is_cpu(), "07_pp_bench runs on CPU ranks; pass --device cpu");
  QUINTET_CHECK(c.steps >= 1 && c.rounds >= 1 && c.warmup >= 0 && c.microbatches >= 1,
                "--steps {} --rounds {} (>= 1) --warmup {} (>= 0) --microbatches {} (>= 1)",
                c.steps, c.rounds, c.warmup, c.microbatches);
  quintet::ParallelConfig layout;
  layout.pp = world.size();
  quintet::Mesh mesh(quintet::Layout(layout, world.size()), world.comm());
  std::vector<std::string> names;
  std::stringstream list(c.schedules);
  for (std::string s; std::getline(list, s, ',');) {
    pl::parse_schedule_kind(s);  // an unknown name fails before anything runs
    names.push_back(s);
  }
  quintet::Communicator& pp = mesh.comm(Axis::pp);  // tp = dp = 1: the pipeline is the world
  const double p2p_ms = p2p_latency_ms(pp, {c.micro_batch, c.seq_len, c.hidden});
  // The plan costs: what --warmup steps of 1F1B (F, B) and ZB-H1 (W) measure, per action kind
  // averaged over the stages, so that zb-h1 and zb-v (and every schedule's receive placement) are
  // planned for this machine, as a user would plan them after profiling.
  pl::ActionCosts plan;
  if (c.plan_measured) {
    auto one = make_bench(c, "1f1b", mesh, plan);
    auto zb = make_bench(c, "zb-h1", mesh, plan);
    run_steps(c, *one, pp, p2p_ms, std::max(c.warmup, 1), false);
    run_steps(c, *zb, pp, p2p_ms, std::max(c.warmup, 1), false);
    const pl::ActionCosts a = mean_over_stages(measured_costs(*one, pp, p2p_ms));
    const pl::ActionCosts w = mean_over_stages(measured_costs(*zb, pp, p2p_ms));
    plan = {a.forward, a.backward, std::min(w.weight_grad, a.backward), p2p_ms};
  }
  std::vector<std::unique_ptr<Bench>> benches;
  for (const std::string& name : names) benches.push_back(make_bench(c, name, mesh, plan));
  // Rounds of a few steps of each schedule in turn, so that a drift of the machine's speed
  // reaches every schedule alike.
  for (auto& b : benches) run_steps(c, *b, pp, p2p_ms, c.warmup, true);
  for (int round = 0; round < c.rounds; ++round) {
    for (auto& b : benches) run_steps(c, *b, pp, p2p_ms, c.steps, false);
  }
  nlohmann::json results = nlohmann::json::array();
  for (auto& b : benches) results.push_back(report(*b, pp, p2p_ms));
  if (world.rank() != 0) return 0;

  double base = 0.0;
  for (const auto& r : results) {
    if (r["schedule"] == "1f1b") base = r["step_ms"];
  }
  std::printf(
      "pp %d, %lld layers, hidden %lld, seq %lld, micro-batch %lld, %d microbatches, "
      "p2p %.3f ms; medians of %d steps\n",
      world.size(), static_cast<long long>(c.layers), static_cast<long long>(c.hidden),
      static_cast<long long>(c.seq_len), static_cast<long long>(c.micro_batch), c.microbatches,
      p2p_ms, c.steps * c.rounds);
  std::printf("planned at F %.1f ms, B %.1f ms, W %.1f ms%s\n", plan.forward, plan.backward,
              plan.weight_grad, c.plan_measured ? " (measured first)" : " (defaults)");
  std::printf("%-12s %9s %7s %8s %9s %9s %9s %9s  %s\n", "schedule", "step ms", "/1f1b", "bubble",
              "predicted", "(stage)", "(uniform)", "replayed", "peak activation MiB per rank");
  for (auto& r : results) {
    if (base > 0) r["step_ratio_to_1f1b"] = r["step_ms"].get<double>() / base;
    std::string mem;
    for (double m : r["peak_activation_mib"]) mem += fmt::format("{:.1f} ", m);
    const std::string ratio =
        base > 0 ? fmt::format("{:.3f}", r["step_ratio_to_1f1b"].get<double>()) : "-";
    std::printf("%-12s %9.1f %7s %8.4f %9.4f %9.4f %9.4f %9.4f  %s\n",
                r["schedule"].get<std::string>().c_str(), r["step_ms"].get<double>(), ratio.c_str(),
                r["bubble_measured"].get<double>(), r["bubble_predicted"].get<double>(),
                r["bubble_predicted_stage_costs"].get<double>(),
                r["bubble_predicted_uniform_costs"].get<double>(),
                r["bubble_replayed"].get<double>(), mem.c_str());
  }
  if (!c.json.empty()) {
    nlohmann::json all{
        {"pp", world.size()},
        {"layers", c.layers},
        {"hidden", c.hidden},
        {"seq_len", c.seq_len},
        {"micro_batch", c.micro_batch},
        {"microbatches", c.microbatches},
        {"steps", c.steps * c.rounds},
        {"p2p_ms", p2p_ms},
        {"plan_costs_ms", {{"F", plan.forward}, {"B", plan.backward}, {"W", plan.weight_grad}}},
        {"results", results}};
    std::ofstream(c.json) << all.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const quintet::RuntimeConfig runtime = quintet::RuntimeConfig::from_args(argc, argv);
    BenchConfig c;
    CLI::App app{"Pipeline schedules on real ranks, measured against the simulator"};
    app.add_option("--layers", c.layers)->capture_default_str();
    app.add_option("--hidden", c.hidden)->capture_default_str();
    app.add_option("--heads", c.heads)->capture_default_str();
    app.add_option("--vocab", c.vocab)->capture_default_str();
    app.add_option("--seq-len", c.seq_len)->capture_default_str();
    app.add_option("--micro-batch", c.micro_batch, "sequences per microbatch")
        ->capture_default_str();
    app.add_option("--microbatches", c.microbatches, "microbatches per step")
        ->capture_default_str();
    app.add_option("--steps", c.steps, "measured steps per schedule per round")
        ->capture_default_str();
    app.add_option("--rounds", c.rounds, "rounds over the schedules")->capture_default_str();
    app.add_option("--warmup", c.warmup, "steps run first and not measured")->capture_default_str();
    app.add_option("--schedules", c.schedules, "comma-separated list")->capture_default_str();
    app.add_option("--json", c.json, "write the results to this file");
    app.add_flag("!--plan-default", c.plan_measured,
                 "plan the schedules at the default costs (B = 2F, W = F), not measured ones");
    std::string runtime_flag;
    app.add_option("--device", runtime_flag, "cpu (read by the runtime)");
    std::vector<const char*> args;
    for (const std::string& a : runtime.remaining_args) args.push_back(a.c_str());
    try {
      app.parse(static_cast<int>(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    quintet::World world = quintet::init(runtime);
    return run(c, world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "07_pp_bench: %s\n", e.what());
    return 2;
  }
}
