// 03_loader_bench: how fast the DataLoader delivers batches, against the loop a user would write
// first (fseek + fread of each window on the training thread), in the same run.
//
//   03_loader_bench                              built-in dataset (made in --data-dir if absent)
//   03_loader_bench --data 'shards/*.bin'        llm.c shards, Megatron .bin/.idx, Quintet .qts
//   03_loader_bench --device cuda:0 --gpu-step-ms 10
//                                                a 10 ms GPU kernel per step: the share of the
//                                                step spent waiting in next() and the GPU's idle
//   03_loader_bench --json                       one JSON object per result line
//   03_loader_bench --cpu-affinity none          leave the OS to place the threads (default: auto,
//                                                or QUINTET_CPU_AFFINITY), as a trainer's rank
//
// With --cpu-affinity auto the program places itself as quintet::init places a rank of one
// (docs/topology.md): on a GPU, the CPUs local to it among those it was given; the loader's
// threads, started afterwards, inherit them. The header (and each JSON row) names the CPUs.
//
// Tokens/s counts input tokens delivered (batch x seq_len per step). Each loader measurement's
// first batch (untimed, in the warm-up) is checked against the naive reader: the same windows as
// the naive loop's first batch, and the same tokens and targets as the naive reader reads for
// them ("batches_match"; a mismatch fails the run with status 1 after its row). A file that
// cannot be read prints the error (file, byte offset, expected and found) and exits with status 1.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "naive_reader.hpp"
#include "quintet/core/cpu_set.hpp"
#include "quintet/core/device.hpp"
#include "quintet/core/runtime_config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/core/topology.hpp"
#include "quintet/data/loader.hpp"
#include "quintet/data/synthetic.hpp"
#if QUINTET_BENCH_GPU_SPIN
#include "gpu_spin.hpp"
#endif

using namespace quintet;
using namespace quintet::data;

namespace {

struct Options {
  std::string data;
  std::string data_dir = "data/synthetic";
  std::int64_t synthetic_tokens = std::int64_t{1} << 23;
  std::int64_t seq_len = 1024;
  std::int64_t batch = 8;
  std::string threads = "1,2,4,8";
  int steps = 200;
  std::string device = "cpu";
  double gpu_step_ms = 0.0;
  std::uint64_t seed = 1;
  std::string cpu_affinity;  // "": the runtime's setting (QUINTET_CPU_AFFINITY, else auto)
  bool json = false;
};

struct Result {
  std::string mode;  // "naive" or "loader"
  int threads = 0;
  double seconds = 0;
  double wait_seconds = -1;  // loader: time blocked in next()
  double gpu_idle = -1;      // with --gpu-step-ms: share of GPU time not spent in step kernels
  std::optional<bool> batches_match;  // loader: its first batch is the naive reader's
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int> parse_threads(const std::string& s) {
  std::vector<int> out;
  std::size_t at = 0;
  while (at < s.size()) {
    std::size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    const int t = std::stoi(s.substr(at, comma - at));
    QUINTET_CHECK(t >= 1, "--threads: {} must be >= 1", t);
    out.push_back(t);
    at = comma + 1;
  }
  QUINTET_CHECK(!out.empty(), "--threads: give one or more counts, e.g. 1,2,4,8");
  return out;
}

// Runs `steps` steps of step(s) (after a short warm-up of the same steps) and, on a GPU with a
// step kernel, measures the GPU's idle share between the first and the last kernel.
template <class Step>
Result timed(const Options& o, const Device& dev, const Stream& compute, Step&& step) {
  Result r;
  const int warmup = std::min(5, o.steps);
  for (int s = 0; s < warmup; ++s) step(s, false);
  compute.synchronize();
  std::optional<Event> first, last;
  const bool gpu_steps = dev.is_cuda() && o.gpu_step_ms > 0;
  if (gpu_steps) first.emplace(dev, true), last.emplace(dev, true);
  const double t0 = now_s();
  for (int s = 0; s < o.steps; ++s) {
    step(warmup + s, gpu_steps);
    if (gpu_steps && s == 0) first->record(compute);  // after the first step's kernel is queued
  }
  if (gpu_steps) last->record(compute);
  compute.synchronize();
  r.seconds = now_s() - t0;
  if (gpu_steps && o.steps > 1) {
    const double busy = (o.steps - 1) * o.gpu_step_ms;
    r.gpu_idle = std::max(0.0, 1.0 - busy / static_cast<double>(last->elapsed_ms(*first)));
  }
  return r;
}

// Whether the loader's batch b, the first of a run, is what the naive loop reads first: the same
// windows, and the same tokens and targets as reader reads for them. compute: b's consumer.
bool same_as_naive(const Batch& b, const Sampler& sampler, NaiveReader& reader,
                   const Stream& compute) {
  const std::vector<SampleRef> first = sampler.batch(0);
  const bool same_windows =
      std::equal(first.begin(), first.end(), b.samples.begin(), b.samples.end(),
                 [](const SampleRef& x, const SampleRef& y) { return x.window == y.window; });
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b.tokens.numel()));
  std::vector<std::int32_t> targets(tokens.size());
  reader.read_batch(b.samples, tokens.data(), targets.data());
  compute.synchronize();  // b's copy, where it is on a GPU
  return same_windows && b.tokens.to_vector<std::int32_t>() == tokens &&
         b.targets.to_vector<std::int32_t>() == targets;
}

// Places the calling thread, before the loader starts its threads, as quintet::init places a job's
// only rank (collectives/topology_exchange.cpp); returns the CPUs it runs on.
CpuSet place(CpuAffinity affinity, const Device& dev) {
  const RankTopology mine = read_rank_topology(0, 0, dev);
  const CpuSet placed = plan_placement({mine}, affinity)[0];
  if (affinity == CpuAffinity::automatic && placed != mine.start_cpus) bind_calling_thread(placed);
  return calling_thread_cpus();
}

// Measures and reports; false when a loader's first batch was not the naive reader's.
bool run(const Options& o) {
  const CpuAffinity affinity = o.cpu_affinity.empty() ? RuntimeConfig::from_env().cpu_affinity
                                                      : parse_cpu_affinity(o.cpu_affinity);
  const CpuSet given = calling_thread_cpus();
  std::string spec = o.data;
  if (spec.empty()) {
    const SyntheticDataset s =
        ensure_synthetic_dataset(o.data_dir, SyntheticConfig{}, 4, o.synthetic_tokens,
                                 std::max<std::int64_t>(2, o.synthetic_tokens / 8));
    spec = o.data_dir + "/train_*.qts";
  }
  const TokenDataset dataset = TokenDataset::open(spec);
  const Windows windows(dataset, o.seq_len);
  const Device dev = Device::parse(o.device);
  check_device(dev);
  QUINTET_CHECK(dev.is_cpu() || cuda_available(), "--device {}: no CUDA GPU is visible", dev.str());
#if !QUINTET_BENCH_GPU_SPIN
  QUINTET_CHECK(o.gpu_step_ms <= 0, "--gpu-step-ms needs a CUDA build");
#endif
  const CpuSet cpus = place(affinity, dev);
  const std::vector<int> thread_counts = parse_threads(o.threads);
  const double tokens_per_step = static_cast<double>(o.batch * o.seq_len);
  const Stream compute = dev.is_cuda() ? Stream::create(dev) : Stream();
  const std::optional<double> floor = entropy_floor_nats(dataset);

  if (!o.json) {
    fmt::print("data {} ({} files, {} tokens, {} windows of {}+1, first format {}{})\n", spec,
               dataset.files().size(), dataset.num_tokens(), windows.count(), o.seq_len,
               format_name(dataset.files()[0].format()),
               floor ? fmt::format(", entropy floor {:.4f} nats/token", *floor) : "");
    fmt::print("batch {} x {} tokens, {} steps, device {}{}\n", o.batch, o.seq_len, o.steps,
               dev.str(), o.gpu_step_ms > 0 ? fmt::format(", GPU step {} ms", o.gpu_step_ms) : "");
    fmt::print("cpus {} (given {}, cpu affinity {})\n\n", cpus.str(), given.str(),
               cpu_affinity_name(affinity));
    fmt::print("{:<8} {:>7} {:>14} {:>9} {:>10} {:>9}\n", "mode", "threads", "tokens/s", "x naive",
               "wait in", "GPU idle");
    fmt::print("{:<8} {:>7} {:>14} {:>9} {:>10} {:>9}\n", "", "", "", "", "next()", "");
  }
  SamplerConfig sc;
  sc.seed = o.seed;
  sc.batch_size = o.batch;
  const Sampler sampler(windows.count(), sc);
  double naive_rate = 0;
  auto report = [&](const Result& r) {
    const double rate = tokens_per_step * o.steps / r.seconds;
    if (r.mode == "naive") naive_rate = rate;
    const double wait = r.wait_seconds >= 0 ? r.wait_seconds / r.seconds : -1;
    if (o.json) {
      nlohmann::json j = {{"mode", r.mode},
                          {"threads", r.threads},
                          {"device", dev.str()},
                          {"seq_len", o.seq_len},
                          {"batch", o.batch},
                          {"steps", o.steps},
                          {"gpu_step_ms", o.gpu_step_ms},
                          {"cpus", cpus.str()},
                          {"cpu_affinity", cpu_affinity_name(affinity)},
                          {"tokens_per_s", rate},
                          {"speedup_vs_naive", rate / naive_rate}};
      if (wait >= 0) j["wait_fraction"] = wait;
      if (r.batches_match) j["batches_match"] = *r.batches_match;
      if (r.gpu_idle >= 0) j["gpu_idle_fraction"] = r.gpu_idle;
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{:<8} {:>7} {:>14.4g} {:>8.2f}x {:>10} {:>9}{}\n", r.mode, r.threads, rate,
                 rate / naive_rate, wait >= 0 ? fmt::format("{:.2f}%", 100 * wait) : "-",
                 r.gpu_idle >= 0 ? fmt::format("{:.2f}%", 100 * r.gpu_idle) : "-",
                 r.batches_match.value_or(true) ? "" : "  WRONG BATCHES (not the naive reader's)");
    }
    std::fflush(stdout);
  };

  // The naive loop: read the batch synchronously; on a GPU, copy it from pageable memory (which
  // waits for the stream) and run the step.
  {
    NaiveReader naive(windows);
    std::vector<std::int32_t> tok(static_cast<std::size_t>(o.batch * o.seq_len)), tgt(tok.size());
    const Shape shape{o.batch, o.seq_len};
    Tensor dtok, dtgt;
    if (dev.is_cuda()) {
      dtok = Tensor::empty(shape, DType::i32, dev, compute);
      dtgt = Tensor::empty(shape, DType::i32, dev, compute);
    }
    Result r = timed(o, dev, compute, [&](int s, bool gpu_step) {
      naive.read_batch(sampler.batch(static_cast<std::uint64_t>(s)), tok.data(), tgt.data());
      if (dev.is_cuda()) {
        dtok.copy_(Tensor::from_blob(tok.data(), shape, DType::i32, Device::cpu()), compute);
        dtgt.copy_(Tensor::from_blob(tgt.data(), shape, DType::i32, Device::cpu()), compute);
#if QUINTET_BENCH_GPU_SPIN
        if (gpu_step) gpu_spin(o.gpu_step_ms, dtok.data<std::int32_t>(), compute.handle());
#endif
      }
      (void)gpu_step;
    });
    r.mode = "naive";
    r.threads = 1;
    report(r);
  }

  NaiveReader reference(windows);  // reads the loader's first batches again, to compare
  bool all_match = true;
  for (int threads : thread_counts) {
    LoaderConfig c;
    c.seq_len = o.seq_len;
    c.batch_size = o.batch;
    c.threads = threads;
    c.device = dev;
    c.seed = sc.seed;
    DataLoader loader(dataset, c);
    // The host runs at most two steps ahead of the GPU, as a trainer that reads its loss would.
    std::vector<Event> step_done;
    if (dev.is_cuda()) step_done.emplace_back(dev), step_done.emplace_back(dev);
    double wait_before = 0;
    bool match = false;
    Result r = timed(o, dev, compute, [&](int s, bool gpu_step) {
      if (s == std::min(5, o.steps)) wait_before = loader.stats().wait_seconds;  // after warm-up
      if (dev.is_cuda() && s >= 2) step_done[s % 2].synchronize();
      const Batch b = loader.next(compute);
      b.wait(compute);
      if (s == 0) match = same_as_naive(b, sampler, reference, compute);  // warm-up: untimed
#if QUINTET_BENCH_GPU_SPIN
      if (gpu_step) gpu_spin(o.gpu_step_ms, b.tokens.data<std::int32_t>(), compute.handle());
#endif
      (void)gpu_step;
      if (dev.is_cuda()) step_done[s % 2].record(compute);
    });
    r.mode = "loader";
    r.threads = threads;
    r.wait_seconds = loader.stats().wait_seconds - wait_before;
    r.batches_match = match;
    report(r);
    all_match = all_match && match;
  }
  return all_match;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"03_loader_bench: DataLoader tokens/s against a naive fread loop"};
  app.add_option("--data", o.data,
                 "token files: path or glob, comma-separated (llm.c .bin, Megatron .bin/.idx or "
                 "prefix, Quintet .qts); default: the built-in dataset");
  app.add_option("--data-dir", o.data_dir, "where the built-in dataset is made when absent");
  app.add_option("--synthetic-tokens", o.synthetic_tokens,
                 "tokens per training shard of the built-in dataset (4 shards)");
  app.add_option("--seq-len", o.seq_len, "tokens per sample");
  app.add_option("--batch", o.batch, "samples per batch");
  app.add_option("--threads", o.threads, "loader thread counts to measure, comma-separated");
  app.add_option("--steps", o.steps, "timed steps per measurement")->check(CLI::PositiveNumber);
  app.add_option("--device", o.device, "cpu or cuda:N: where batches are delivered");
  app.add_option("--gpu-step-ms", o.gpu_step_ms, "a GPU kernel of this many ms per step");
  app.add_option("--seed", o.seed, "sampler seed");
  app.add_option("--cpu-affinity", o.cpu_affinity,
                 "auto|none: where the threads run (default QUINTET_CPU_AFFINITY, else auto)");
  app.add_flag("--json", o.json, "one JSON object per result line");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!run(o)) {
      std::fprintf(stderr,
                   "03_loader_bench: the loader's batches are not what the naive reader "
                   "reads for the same samples\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "03_loader_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
