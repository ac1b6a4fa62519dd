// 01_collective_bench: Quintet's collectives against raw NCCL (GPU) or raw MPI (CPU), like
// nccl-tests, in one run.
//
//   mpirun -np 2 01_collective_bench --op all --device cuda
//   mpirun -np 4 01_collective_bench --op all_reduce --device cpu --max-bytes 64M --json
//   mpirun -np 4 01_collective_bench --op all_reduce --device cpu --max-bytes 64K --wait-each
//
// For each operation and size (from --min-bytes to --max-bytes, times --step-factor) it
//   1. runs the operation once through the Quintet communicator and checks the result against
//      the expected values on every rank (a wrong result fails the run with exit code 1);
//      after the timing below, it clears the output, runs it once more and checks it again:
//      "correct" reports that second check (false fails the run too, after its row);
//   2. times --iters back-to-back operations, --reps times, after --warmup untimed ones, through
//      Quintet and through raw NCCL/MPI calls on the same buffers, alternating the two's
//      repetitions and who goes first in each (ours, raw | raw, ours | ...): CUDA events on the
//      caller's stream on a GPU, a steady clock after a barrier on the CPU; a repetition counts as
//      long as its slowest rank;
//   3. prints, for both, the median repetition's time per operation, algorithm bandwidth
//      (bytes / time) and bus bandwidth (nccl-tests' factors), and raw/ours: the median over
//      repetitions of raw time / ours time within one repetition pair (1.0 = no overhead). A pair
//      runs back to back and so shares the machine's state (other load, clock speed), which a
//      ratio of the two medians, taken from different repetitions, does not.
// --check-overhead and --flight-overhead also time the operation, in the same repetitions, with
// and without the fingerprint check, or the flight recorder (CPU), and report that one's cost;
// --flight-control turns the recorder off on both sides of --flight-overhead (an A/A control: what
// the comparison itself shows, with the same communicators made and timed in the same order).
// Bytes are per rank as in nccl-tests (see bench_ops.hpp); bandwidths in GB/s (1e9 bytes/s).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench_ops.hpp"
#include "quintet/collectives/bootstrap.hpp"
#include "quintet/collectives/checked_communicator.hpp"
#include "quintet/collectives/mpi.hpp"
#include "quintet/core/error.hpp"
#if QUINTET_HAS_NCCL
#include <cuda_runtime.h>
#endif

using namespace bench;
using quintet::Communicator;
using quintet::Device;
using quintet::Stream;
using quintet::Work;

namespace {

struct Options {
  std::string op = "all";
  std::string min_bytes = "8";
  std::string max_bytes;  // default: 1G on a GPU, 64M on the CPU
  double step_factor = 2.0;
  int iters = 20;
  int warmup = 5;
  std::optional<int> reps;  // unset: 5 on a GPU (stable timings), 11 on the CPU (noisier)
  std::string dtype = "f32";
  bool json = false;
  bool wait_each = false;        // wait for every operation before issuing the next (latency)
  bool check_overhead = false;   // also time the op with --check-collectives' check on
  bool flight_overhead = false;  // also time the op without a flight recorder (MPI)
  bool flight_control = false;   // --flight-overhead with the recorder off on both sides
};

// Ours timed again through communicators of the same backend and algorithm, to measure what one
// feature costs: those in `with` have it on, those in `without` (none: ours itself) have it off;
// each side's time in a repetition is the mean over its communicators. The fingerprint check: a
// checked split of ours against ours. The flight recorder: duplicates of the world communicator
// that differ only in it, made and timed in the order on, off, off, on: the first of two
// otherwise equal duplicates is measurably slower at small sizes here, and ours (on which the
// timing's barriers run) faster than any. cost = with - without.
struct Variant {
  std::vector<std::unique_ptr<Communicator>> with, without;
  std::string time_key, cost_key, ratio_key, without_time_key;  // JSON keys ("": none)
  std::string header;                                           // its three text columns
  std::vector<Work> last_with, last_without;
  std::vector<std::size_t> with_at, without_at;  // their indices among the timed contenders
};

// "8", "64K", "1M", "1G" (binary multiples) -> bytes.
std::size_t parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  const std::string suffix = pos > 0 ? text.substr(pos) : "";
  std::size_t scale = 1;
  if (suffix == "K" || suffix == "k") scale = std::size_t{1} << 10;
  if (suffix == "M" || suffix == "m") scale = std::size_t{1} << 20;
  if (suffix == "G" || suffix == "g") scale = std::size_t{1} << 30;
  QUINTET_CHECK(pos > 0 && (suffix.empty() || scale > 1),
                "bad size '{}': expected a number of bytes with an optional K, M or G suffix "
                "(8, 64K, 1M, 1G)",
                text);
  return static_cast<std::size_t>(value) * scale;
}

std::vector<Op> parse_ops(const std::string& name, quintet::DType dtype) {
  std::vector<Op> ops;
  for (Op op : kAllOps) {
    if (name == "all" || op_name(op) == name) ops.push_back(op);
  }
  QUINTET_CHECK(!ops.empty(),
                "unknown --op '{}': expected all_reduce, all_gather, reduce_scatter, all_to_all, "
                "broadcast, sendrecv or all",
                name);
  if (dtype == quintet::DType::u16) {  // u16 cannot be reduced (NCCL has no such type)
    QUINTET_CHECK(name == "all" || !reduces(ops.front()),
                  "--op {} reduces, and dtype u16 cannot be reduced; use --dtype i32 or f16", name);
    std::erase_if(ops, reduces);
  }
  return ops;
}

// The slowest rank's value (every rank gets it).
double max_over_ranks(Communicator& comm, const Device& device, double value) {
  if (comm.size() == 1) return value;
  const quintet::Tensor t = quintet::Tensor::full({1}, value, quintet::DType::f64, device);
  comm.all_reduce(t, quintet::ReduceOp::max).synchronize();
  return t.item({0});
}

// One way of running the operation: `iters` issues then finish() make one timed repetition.
struct Timed {
  std::function<void()> issue;
  std::function<void()> finish;
};

// Seconds per operation of each contender in each of `reps` repetitions ([contender][rep]), timed
// on stream (GPU: CUDA events; CPU: steady clock after a barrier), slowest rank. The contenders'
// repetitions alternate after each one's warm-up, and so does who goes first in a repetition (ours,
// raw | raw, ours | ...), so that a slow spell of a shared machine, or whatever the one before
// leaves behind (caches, a woken thread), hits both alike instead of one of them.
std::vector<std::vector<double>> seconds_per_op(Communicator& comm, const Device& device,
                                                const Stream& stream, const Options& o,
                                                const std::vector<Timed>& contenders) {
  for (const Timed& c : contenders) {
    for (int i = 0; i < o.warmup; ++i) c.issue();
    c.finish();
  }
  stream.synchronize();
  std::vector<std::vector<double>> times(contenders.size());
  quintet::Event start(device, true), stop(device, true);
  for (int rep = 0; rep < *o.reps; ++rep) {
    for (std::size_t j = 0; j < contenders.size(); ++j) {
      const std::size_t k = rep % 2 == 0 ? j : contenders.size() - 1 - j;
      const Timed& c = contenders[k];
      double seconds = 0;
      if (device.is_cuda()) {
        start.record(stream);
        for (int i = 0; i < o.iters; ++i) c.issue();
        c.finish();
        stop.record(stream);
        stop.synchronize();
        seconds = stop.elapsed_ms(start) * 1e-3;
      } else {
        comm.barrier().wait();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < o.iters; ++i) c.issue();
        c.finish();
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      times[k].push_back(max_over_ranks(comm, device, seconds / o.iters));
    }
  }
  return times;
}

// The middle value (the upper one of the two middles for an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The raw baseline of this run: an NCCL communicator of its own (GPU), or a duplicate of
// MPI_COMM_WORLD (CPU under mpirun); none otherwise. Released before the World.
struct Baseline {
  std::string name = "none";
#if QUINTET_HAS_NCCL
  ncclComm_t nccl = nullptr;
#endif
  MPI_Comm mpi = MPI_COMM_NULL;

  Baseline(quintet::World& world) {
    const Device& device = world.device();
    if (device.is_cuda()) {
#if QUINTET_HAS_NCCL
      // The unique id travels over the Quintet communicator itself (works for every launcher).
      ncclUniqueId id;
      quintet::Tensor bytes = quintet::Tensor::empty(
          {static_cast<std::int64_t>(sizeof(id.internal))}, quintet::DType::u8);
      if (world.rank() == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId failed");
        std::copy(id.internal, id.internal + sizeof(id.internal),
                  static_cast<char*>(bytes.data_ptr()));
      }
      const quintet::Tensor on_device = bytes.to(device);
      world.comm().broadcast(on_device, 0).synchronize();
      const quintet::Tensor back = on_device.to(Device::cpu());
      std::copy_n(static_cast<const char*>(back.data_ptr()), sizeof(id.internal), id.internal);
      if (ncclCommInitRank(&nccl, world.size(), id, world.rank()) != ncclSuccess) {
        throw std::runtime_error("raw ncclCommInitRank failed");
      }
      name = "raw NCCL";
#endif
    } else {
      int initialized = 0, finalized = 0;
      MPI_Initialized(&initialized);
      MPI_Finalized(&finalized);
      int mpi_size = 0;
      if (initialized && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
      if (mpi_size == world.size()) {
        MPI_Comm_dup(MPI_COMM_WORLD, &mpi);
        name = "raw MPI";
      }
    }
  }
  ~Baseline() {
#if QUINTET_HAS_NCCL
    if (nccl != nullptr) ncclCommDestroy(nccl);
#endif
    if (mpi != MPI_COMM_NULL) MPI_Comm_free(&mpi);
  }
  Baseline(const Baseline&) = delete;
  Baseline& operator=(const Baseline&) = delete;
};

int run(quintet::World& world, Options o) {
  const Device device = world.device();
  const bool gpu = device.is_cuda();
  if (!o.reps) o.reps = gpu ? 5 : 11;
  const int me = world.rank(), n = world.size();
  Communicator& comm = world.comm();
  const quintet::DType dtype = quintet::parse_dtype(o.dtype);
  const std::vector<Op> ops = parse_ops(o.op, dtype);
  const std::size_t min_bytes = parse_bytes(o.min_bytes);
  const std::size_t max_bytes =
      parse_bytes(o.max_bytes.empty() ? (gpu ? "1G" : "64M") : o.max_bytes);
  QUINTET_CHECK(min_bytes >= 1 && min_bytes <= max_bytes,
                "--min-bytes {} and --max-bytes {}: expected 1 <= min <= max", min_bytes,
                max_bytes);
  QUINTET_CHECK(o.step_factor > 1.0, "--step-factor {} must be > 1", o.step_factor);
  QUINTET_CHECK(o.iters >= 1 && *o.reps >= 1 && o.warmup >= 0,
                "--iters {}, --reps {}, --warmup {}: expected iters >= 1, reps >= 1, warmup >= 0",
                o.iters, *o.reps, o.warmup);
  quintet::set_current_device(device);  // so no operation has to switch devices
  const Stream stream = gpu ? Stream::create(device) : Stream();
  Baseline baseline(world);
  std::vector<Variant> variants;
  // --check-overhead: the same operation through a checked communicator (a split of the world
  // communicator, so the same backend and algorithm), timed beside the unchecked one.
  if (o.check_overhead) {
    QUINTET_CHECK(!quintet::checks_collectives(comm),
                  "--check-overhead compares the check off and on in one run: leave "
                  "--check-collectives off");
    QUINTET_CHECK(world.has_cpu_comm(), "--check-overhead needs an MPI launch (mpirun)");
    quintet::CollectiveCheckOptions check;
    check.timeout_s = world.config().timeout_s;
    Variant v{{},
              {},
              "checked_time_us",
              "check_cost_us",
              "checked_ratio",
              "",
              "  checked_us  check_us checked/ours"};
    v.with.push_back(
        quintet::make_checked_communicator(comm.split(0, me, "checked"), MPI_COMM_WORLD, check));
    variants.push_back(std::move(v));
  }
  // --flight-overhead: the same operation through two duplicates of the world communicator, with
  // and without a flight recorder (the same MPI options otherwise).
  if (o.flight_overhead) {
    QUINTET_CHECK(!gpu && world.has_cpu_comm() && n > 1,
                  "--flight-overhead measures the MPI backend's flight recorder: run on the CPU "
                  "under mpirun with 2 ranks or more");
    QUINTET_CHECK(world.config().flight_size > 0,
                  "--flight-overhead compares the flight recorder on and off in one run: leave "
                  "--flight-size above 0");
    quintet::MpiOptions on;
    on.timeout_s = world.config().timeout_s;
    on.idle_start_delay_us = world.config().mpi_idle_start_us;
    on.flight_size = o.flight_control ? 0 : world.config().flight_size;
    quintet::MpiOptions off = on;
    off.flight_size = 0;
    Variant v{{},
              {},
              "recorded_time_us",
              "flight_cost_us",
              "flight_ratio",
              "unrecorded_time_us",
              "      rec_us flight_us    rec/unrec"};
    v.with.push_back(quintet::make_mpi_communicator(MPI_COMM_WORLD, "recorded", on));
    v.without.push_back(quintet::make_mpi_communicator(MPI_COMM_WORLD, "unrecorded", off));
    v.without.push_back(quintet::make_mpi_communicator(MPI_COMM_WORLD, "unrecorded2", off));
    v.with.push_back(quintet::make_mpi_communicator(MPI_COMM_WORLD, "recorded2", on));
    variants.push_back(std::move(v));
  }
  std::string variant_headers;
  for (const Variant& v : variants) variant_headers += v.header;

  if (me == 0 && !o.json) {
    std::printf(
        "# 01_collective_bench: %d ranks, %s, backend %s, dtype %s; %d iters x %d reps "
        "(medians; raw/ours: median of the repetitions' raw time / ours time, > 1 is ours faster), "
        "%d warmup; baseline %s\n",
        n, device.str().c_str(), std::string(quintet::backend_name(comm.backend())).c_str(),
        o.dtype.c_str(), o.iters, *o.reps, o.warmup, baseline.name.c_str());
    std::printf("%-15s %12s %12s %10s %10s %10s %12s %10s %9s %8s%s\n", "op", "bytes", "count",
                "time_us", "algbw", "busbw", "raw_time_us", "raw_busbw", "raw/ours", "correct",
                variant_headers.c_str());
  }
  bool all_correct = true;
  for (Op op : ops) {
    for (double size = static_cast<double>(min_bytes); size <= static_cast<double>(max_bytes);
         size *= o.step_factor) {
      const Buffers b = make_buffers(op, static_cast<std::size_t>(size), dtype, device, me, n);
      if (b.count == 0) continue;  // fewer elements than ranks
      // One run of ours, checked against the expected values on every rank; true when every
      // rank's result is right (a wrong one is printed by its rank, and named by rank 0).
      auto run_and_verify = [&](const char* when) {
        issue_ours(comm, op, b, stream).wait(stream);
        stream.synchronize();
        const std::string error = verify(op, b, me, n);
        if (!error.empty()) std::fprintf(stderr, "rank %d: %s\n", me, error.c_str());
        const bool right = max_over_ranks(comm, device, error.empty() ? 0.0 : 1.0) == 0;
        if (!right && me == 0) {
          std::fprintf(stderr,
                       "FAILED: %s of %zu bytes (%s) gave a wrong result %s; see the ranks' "
                       "messages above\n",
                       std::string(op_name(op)).c_str(), b.bytes(), o.dtype.c_str(), when);
        }
        return right;
      };
      // 1. Correctness of the first run, agreed by every rank before anything is timed.
      if (!run_and_verify("on its first run")) return 1;
      // 2. Timing: ours and the raw baseline on the same buffers, repetitions interleaved.
      Work last;
      std::vector<Timed> contenders = {{[&] {
                                          last = issue_ours(comm, op, b, stream);
                                          if (o.wait_each) last.wait(stream);
                                        },
                                        [&] { last.wait(stream); }}};
#if QUINTET_HAS_NCCL
      if (baseline.nccl != nullptr) {
        contenders.push_back(
            {[&] { issue_raw_nccl(baseline.nccl, op, b, stream.handle(), me, n); }, [] {}});
      }
#endif
      if (baseline.mpi != MPI_COMM_NULL && b.count <= INT_MAX) {
        contenders.push_back({[&] { run_raw_mpi(baseline.mpi, op, b, me, n); }, [] {}});
      }
      const std::size_t raw_at = contenders.size() > 1 ? 1 : 0;  // 0: no raw baseline
      auto add_contender = [&](Communicator& c, Work& last) {
        contenders.push_back({[&] {
                                last = issue_ours(c, op, b, stream);
                                if (o.wait_each) last.wait(stream);
                              },
                              [&] { last.wait(stream); }});
        return contenders.size() - 1;
      };
      for (Variant& v : variants) {
        v.last_with.resize(v.with.size());  // before the contenders hold references into them
        v.last_without.resize(v.without.size());
        v.with_at.clear();
        v.without_at.clear();
        // Timed in the order made: with[0], without..., with[1] (on, off, off, on).
        v.with_at.push_back(add_contender(*v.with[0], v.last_with[0]));
        for (std::size_t i = 0; i < v.without.size(); ++i) {
          v.without_at.push_back(add_contender(*v.without[i], v.last_without[i]));
        }
        for (std::size_t i = 1; i < v.with.size(); ++i) {
          v.with_at.push_back(add_contender(*v.with[i], v.last_with[i]));
        }
        if (v.without.empty()) v.without_at.push_back(0);  // ours
      }
      const std::vector<std::vector<double>> seconds =
          seconds_per_op(comm, device, stream, o, contenders);
      const double ours = median(seconds[0]);
      std::optional<double> raw, ratio;
      if (raw_at > 0) {
        raw = median(seconds[raw_at]);
        std::vector<double> pair_ratios;  // raw / ours of each repetition pair
        for (int rep = 0; rep < *o.reps; ++rep) {
          pair_ratios.push_back(seconds[raw_at][rep] / seconds[0][rep]);
        }
        ratio = median(pair_ratios);
      }
      // Each variant's feature cost per operation: medians over the repetitions of (with - without)
      // and of with / without, each taken within one repetition (the same machine state).
      struct VariantResult {
        double time_s, cost_s, ratio, without_s;
      };
      std::vector<VariantResult> variant_results;
      for (const Variant& v : variants) {
        auto mean_at = [&](const std::vector<std::size_t>& at, int rep) {
          double sum = 0;
          for (std::size_t k : at) sum += seconds[k][rep];
          return sum / static_cast<double>(at.size());
        };
        std::vector<double> withs, withouts, diffs, ratios;
        for (int rep = 0; rep < *o.reps; ++rep) {
          withs.push_back(mean_at(v.with_at, rep));
          withouts.push_back(mean_at(v.without_at, rep));
          diffs.push_back(withs.back() - withouts.back());
          ratios.push_back(withs.back() / withouts.back());
        }
        variant_results.push_back({median(withs), median(diffs), median(ratios), median(withouts)});
      }
      // The result once more, from a cleared output (broadcast: root 0 keeps its input), after
      // every timed run: what "correct" reports.
      if (op != Op::broadcast || me != 0) quintet::Tensor(b.out).fill_(0.0, stream);
      const bool correct = run_and_verify("after the timed runs");
      all_correct = all_correct && correct;
      // 3. Report.
      const double bytes = static_cast<double>(b.bytes());
      const double algbw = bytes / ours * 1e-9, busbw = algbw * bus_factor(op, n);
      std::optional<double> raw_busbw;
      if (raw) raw_busbw = bytes / *raw * 1e-9 * bus_factor(op, n);
      if (me != 0) continue;
      if (o.json) {
        nlohmann::json row = {
            {"op", op_name(op)},  {"bytes", b.bytes()},    {"dtype", o.dtype},
            {"ranks", n},         {"time_us", ours * 1e6}, {"algbw_gbs", algbw},
            {"busbw_gbs", busbw}, {"correct", correct},    {"device", device.str()}};
        row["raw_busbw_gbs"] = raw_busbw ? nlohmann::json(*raw_busbw) : nlohmann::json(nullptr);
        row["raw_time_us"] = raw ? nlohmann::json(*raw * 1e6) : nlohmann::json(nullptr);
        row["ratio"] = ratio ? nlohmann::json(*ratio) : nlohmann::json(nullptr);
        for (std::size_t i = 0; i < variants.size(); ++i) {
          row[variants[i].time_key] = variant_results[i].time_s * 1e6;
          row[variants[i].cost_key] = variant_results[i].cost_s * 1e6;
          row[variants[i].ratio_key] = variant_results[i].ratio;
          if (!variants[i].without_time_key.empty()) {
            row[variants[i].without_time_key] = variant_results[i].without_s * 1e6;
          }
        }
        std::printf("%s\n", row.dump().c_str());
      } else {
        const std::string raw_time = raw ? fmt::format("{:.2f}", *raw * 1e6) : "-";
        const std::string raw_bw = raw_busbw ? fmt::format("{:.2f}", *raw_busbw) : "-";
        const std::string ratio_text = ratio ? fmt::format("{:.3f}", *ratio) : "-";
        std::string variant_text;
        for (const VariantResult& r : variant_results) {
          variant_text +=
              fmt::format(" {:11.2f} {:9.2f} {:12.3f}", r.time_s * 1e6, r.cost_s * 1e6, r.ratio);
        }
        std::printf("%-15s %12zu %12lld %10.2f %10.2f %10.2f %12s %10s %9s %8s%s\n",
                    std::string(op_name(op)).c_str(), b.bytes(), static_cast<long long>(b.count),
                    ours * 1e6, algbw, busbw, raw_time.c_str(), raw_bw.c_str(), ratio_text.c_str(),
                    correct ? "yes" : "NO", variant_text.c_str());
      }
      std::fflush(stdout);
    }
  }
  return all_correct ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // --device, --timeout-s, ... are the runtime's (RuntimeConfig); the rest are the bench's.
    quintet::RuntimeConfig config = quintet::RuntimeConfig::from_args(argc, argv);
    Options o;
    CLI::App app{"Quintet collectives vs raw NCCL/MPI, like nccl-tests"};
    app.add_option("--op", o.op,
                   "all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|"
                   "sendrecv|all")
        ->capture_default_str();
    app.add_option("--min-bytes", o.min_bytes, "smallest size (K/M/G suffixes)")
        ->capture_default_str();
    app.add_option("--max-bytes", o.max_bytes, "largest size (default 1G on GPU, 64M on CPU)");
    app.add_option("--step-factor", o.step_factor, "size multiplier between rows")
        ->capture_default_str();
    app.add_option("--iters", o.iters, "operations per timed repetition")->capture_default_str();
    app.add_option("--warmup", o.warmup, "untimed operations before timing")->capture_default_str();
    app.add_option("--reps", o.reps,
                   "timed repetitions, each of ours and raw (medians are reported; default 5 on "
                   "a GPU, 11 on the CPU)");
    app.add_option("--dtype", o.dtype, "f32|f16|bf16|f64|i32|i64|u8|u16")->capture_default_str();
    std::string device_help;
    app.add_option("--device", device_help, "cpu|cuda (read by the runtime; or QUINTET_DEVICE)");
    app.add_flag("--json", o.json, "one JSON object per result line");
    app.add_flag("--wait-each", o.wait_each,
                 "wait for each of our operations before issuing the next, as a training step "
                 "that needs the result does (measures the per-operation overhead; raw calls "
                 "are blocking anyway on the CPU)");
    app.add_flag("--check-overhead", o.check_overhead,
                 "also time each operation through a communicator with --check-collectives' "
                 "fingerprint check on, and report its cost per operation (checked_us - time_us) "
                 "and checked/ours");
    app.add_flag("--flight-overhead", o.flight_overhead,
                 "also time each operation through two duplicates of the world communicator, with "
                 "and without a flight recorder (CPU, MPI), and report the recorder's cost per "
                 "operation (rec_us - unrecorded) and recorded/unrecorded");
    app.add_flag("--flight-control", o.flight_control,
                 "with --flight-overhead: the recorder off on both sides (an A/A control of the "
                 "comparison, whose ratio is what it shows with no recorder)");
    bool check_flag = false;
    app.add_flag("--check-collectives", check_flag,
                 "the debug mode on the world communicator (read by the runtime)");
    std::vector<const char*> args;
    for (const std::string& a : config.remaining_args) args.push_back(a.c_str());
    try {
      app.parse(static_cast<int>(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    QUINTET_CHECK(!o.flight_control || o.flight_overhead,
                  "--flight-control is the A/A control of --flight-overhead: give both");
    quintet::World world = quintet::init(config);
    return run(world, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "01_collective_bench: %s\n", e.what());
    return 2;
  }
}
