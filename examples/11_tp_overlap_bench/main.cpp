// 11_tp_overlap_bench: the forward and backward of a stack of transformer blocks under tensor
// parallelism (tp = the job, CPU ranks), with the tp communication unchunked and cut into overlap
// chunks, in one run.
//
//   mpirun -np 4 --map-by slot:PE=4 --bind-to core 11_tp_overlap_bench --hidden 768 --json
//
// One model per variant (chunk counts from --chunks, with and without sequence parallelism), all
// built from the same seed, so they hold the same weights. Each repetition runs every variant
// once, in turn, after a barrier: so drift of a shared machine (a slow core, another tenant)
// lands on every variant alike, and each variant is compared with the unchunked one of the same
// repetition. Per variant: the step time (forward + backward, as long as the slowest rank), the
// exposed tp communication (the time the compute thread waited in the tp collectives:
// TimedCommunicator, from the wait) on the least-waiting rank and averaged over the ranks, and the
// median over repetitions of unchunked / chunked step time. A rank that waits for a slower one
// counts that wait as exposed communication; the least-waiting rank is the slow one itself, whose
// waits are the communication that chunking can hide. Each chunked variant's output and input
// gradient are checked against the unchunked one's (f32: the largest difference over the largest
// value, at most 1e-4; tests/mpi/tp_overlap_test.cpp says why sums may round differently): a
// mismatch exits 1.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/model/block.hpp"
#include "quintet/parallel/overlap/timed_communicator.hpp"

using namespace quintet;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double reduce(double v, MPI_Op op) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
  return v;
}

// One model: a stack of blocks whose tp collectives go through a timing wrapper.
struct Variant {
  bool sp;
  int chunks;
  std::unique_ptr<overlap::TimedCommunicator> tp;
  std::vector<std::unique_ptr<model::TransformerBlock>> blocks;
  std::vector<std::unique_ptr<nn::ParameterStore>> stores;
  std::vector<double> step_ms, exposed_min_ms, exposed_mean_ms, speedup;
  Tensor y, dx;  // the last repetition's output and input gradient
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t hidden = 768, heads = 12, seq = 256, batch = 4;
  int layers = 2, reps = 8, warmup = 2;
  std::string chunk_list = "1,2,4";
  bool json = false;
  CLI::App app{"Tensor-parallel blocks on CPU ranks: tp communication unchunked and in chunks"};
  app.add_option("--hidden", hidden, "model width")->capture_default_str();
  app.add_option("--heads", heads, "attention heads")->capture_default_str();
  app.add_option("--seq-len", seq, "tokens per sequence")->capture_default_str();
  app.add_option("--batch", batch, "sequences")->capture_default_str();
  app.add_option("--layers", layers, "transformer blocks")->capture_default_str();
  app.add_option("--chunks", chunk_list, "overlap chunk counts (1 = unchunked, the baseline)")
      ->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed repetitions")->capture_default_str();
  app.add_flag("--json", json, "JSON lines instead of text");
  CLI11_PARSE(app, argc, argv);

  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;
  World world = init(config);
  Communicator& comm = world.comm();
  const int n = comm.size(), rank = comm.rank();
  std::vector<int> chunks{1};
  {
    std::stringstream in(chunk_list);
    for (std::string item; std::getline(in, item, ',');) {
      const int k = std::stoi(item);
      if (k != 1) chunks.push_back(k);
    }
  }
  model::GptConfig c;
  c.hidden = hidden;
  c.heads = heads;
  c.seq_len = seq;
  c.layers = layers;
  c.vocab = 4 * n;
  const Stream cpu;
  std::vector<Variant> variants;
  try {
    for (const bool sp : {false, true}) {
      for (const int k : chunks) {
        c.sequence_parallel = sp;
        c.tp_overlap_chunks = k;
        c.validate(n, 1);  // a chunk count that does not divide is refused here, on every rank
        Variant v{sp,
                  k,
                  std::make_unique<overlap::TimedCommunicator>(
                      comm, overlap::TimedCommunicator::Measure::from_wait),
                  {},
                  {},
                  {},
                  {},
                  {},
                  {}};
        for (int l = 0; l < layers; ++l) {
          v.blocks.push_back(
              std::make_unique<model::TransformerBlock>(c, model::ModelGroups{v.tp.get()}, l));
          v.stores.push_back(std::make_unique<nn::ParameterStore>(
              *v.blocks.back(), DType::f32, cpu, 100 + static_cast<std::uint64_t>(l)));
        }
        variants.push_back(std::move(v));
      }
    }
  } catch (const Error& e) {
    if (rank == 0) std::fprintf(stderr, "11_tp_overlap_bench: %s\n", e.what());
    return 2;
  }

  // The same input on every rank of a variant kind (SP: this rank's part of the sequence).
  const Tensor x_full = Tensor::randn({batch, seq, hidden}, 7);
  const Tensor dy_full = Tensor::randn({batch, seq, hidden}, 8);
  const auto part = [&](const Tensor& t, bool sp) {
    return sp ? t.narrow(1, rank * (seq / n), seq / n).contiguous() : t;
  };
  for (int rep = -warmup; rep < reps; ++rep) {
    double base_ms[2] = {0.0, 0.0};
    for (Variant& v : variants) {
      nn::Context ctx(cpu);
      v.tp->take_stats();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      Tensor h = part(x_full, v.sp);
      for (auto& b : v.blocks) h = b->forward(ctx, h);
      Tensor d = part(dy_full, v.sp);
      for (auto it = v.blocks.rbegin(); it != v.blocks.rend(); ++it) d = (*it)->backward(ctx, d);
      const double ms = reduce(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
          MPI_MAX);
      const double exposed = v.tp->take_stats().exposed_ms;
      if (rep < 0) continue;
      v.y = h;
      v.dx = d;
      v.step_ms.push_back(ms);
      v.exposed_min_ms.push_back(reduce(exposed, MPI_MIN));
      v.exposed_mean_ms.push_back(reduce(exposed, MPI_SUM) / n);
      if (v.chunks == 1) base_ms[v.sp] = ms;
      v.speedup.push_back(base_ms[v.sp] / ms);
    }
  }

  int bad = 0;
  for (const Variant& v : variants) {
    const Variant& base = *std::find_if(variants.begin(), variants.end(), [&](const Variant& w) {
      return w.sp == v.sp && w.chunks == 1;
    });
    // The largest difference relative to the largest value: rounding of a reordered sum
    // (tp_overlap_test.cpp) stays near f32 epsilon at this scale; a misplaced chunk does not.
    const auto max_diff = [](const Tensor& a, const Tensor& b) {
      const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
      double worst = 0.0, scale = 0.0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        worst = std::max(worst, std::abs(double(x[i]) - double(y[i])));
        scale = std::max(scale, std::abs(double(y[i])));
      }
      return worst / std::max(scale, 1e-30);
    };
    const double diff = reduce(std::max(max_diff(v.y, base.y), max_diff(v.dx, base.dx)), MPI_MAX);
    const bool ok = diff <= 1e-4;
    bad += ok ? 0 : 1;
    if (rank != 0) continue;
    nlohmann::json j{{"bench", "tp_overlap"},
                     {"tp", n},
                     {"sp", v.sp},
                     {"chunks", v.chunks},
                     {"hidden", hidden},
                     {"seq_len", seq},
                     {"batch", batch},
                     {"layers", layers},
                     {"reps", reps},
                     {"median_step_ms", median(v.step_ms)},
                     {"median_exposed_tp_ms_min_rank", median(v.exposed_min_ms)},
                     {"median_exposed_tp_ms_mean", median(v.exposed_mean_ms)},
                     {"median_speedup_vs_unchunked", median(v.speedup)},
                     {"max_diff_vs_unchunked", diff},
                     {"matches_unchunked", ok}};
    if (json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "tp %d sp %d chunks %d: step %.1f ms, exposed tp %.2f ms (least-waiting rank) %.2f ms "
          "(mean), unchunked/chunked %.3f%s\n",
          n, v.sp ? 1 : 0, v.chunks, median(v.step_ms), median(v.exposed_min_ms),
          median(v.exposed_mean_ms), median(v.speedup), ok ? "" : "  MISMATCH");
    }
  }
  return bad == 0 ? 0 : 1;
}
