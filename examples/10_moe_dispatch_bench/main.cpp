// 10_moe_dispatch_bench: the MoE layer's token exchange on CPU ranks against raw MPI calls moving
// the same bytes, in one run.
//
//   mpirun -np 8 10_moe_dispatch_bench --tokens 4096 --hidden 1024 --experts 16 --top-k 2 --json
//
// Every rank routes --tokens tokens of --hidden f32 values to --top-k of --experts experts (spread
// over all ranks: ep = the job), uniformly at random, and exchanges them there and back with the
// experts as the identity:
//   exchange - quintet::expert::plan_exchange (count all_to_all + the host copy), dispatch_rows and
//              return_rows (the two all_to_all_v, and the reorder to expert-major order when a rank
//              holds several experts);
//   full     - the same plus the permutation, the gather of the sorted rows and the weighted
//              combine (what the MoE layer runs around its experts);
//   raw      - MPI_Alltoall of the per-rank counts and two MPI_Alltoallv of the sorted rows, the
//              calls a user would make by hand, on preallocated buffers.
// Each repetition runs the three back to back after a barrier (steady clock; a repetition counts
// as long as its slowest rank); reported: the median times and the medians over repetitions of
// raw / exchange and raw / full within a repetition (1.0 = no overhead). The combined output is
// checked against the input (identity experts, weights summing to one): a wrong result exits 1.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/expert/dispatch.hpp"

using namespace quintet;
using namespace quintet::expert;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Seconds of f on this rank, after a barrier, as long as the slowest rank.
template <class F>
double timed(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t tokens = 4096, hidden = 1024, experts = 0;
  int top_k = 2, reps = 20, warmup = 3;
  bool json = false;
  CLI::App app{"The MoE token exchange on CPU ranks against raw MPI all_to_all_v"};
  app.add_option("--tokens", tokens, "tokens per rank")->capture_default_str();
  app.add_option("--hidden", hidden, "values per token (f32)")->capture_default_str();
  app.add_option("--experts", experts, "experts over all ranks (0: 2 per rank)");
  app.add_option("--top-k", top_k, "experts per token")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed repetitions")->capture_default_str();
  app.add_flag("--json", json, "one JSON object instead of text");
  CLI11_PARSE(app, argc, argv);

  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;  // CPU ranks: the MPI communicator
  World world = init(config);
  Communicator& ep = world.comm();
  const int n = ep.size(), rank = ep.rank();
  if (experts == 0) experts = 2 * n;
  if (experts % n != 0 || top_k < 1 || top_k > experts || tokens < 1 || hidden < 1) {
    if (rank == 0) {
      std::fprintf(stderr, "10_moe_dispatch_bench: need experts %% ranks == 0 and 1 <= k <= E\n");
    }
    return 2;
  }
  const std::int64_t El = experts / n;

  // Uniform random routing: k distinct experts per token, weights 1/k.
  std::vector<std::int32_t> ex(static_cast<std::size_t>(tokens * top_k));
  std::uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1);
  const auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < top_k; ++j) {
      std::int32_t e;
      bool fresh;
      do {
        e = static_cast<std::int32_t>(next() % static_cast<std::uint64_t>(experts));
        fresh = std::none_of(ex.begin() + t * top_k, ex.begin() + t * top_k + j,
                             [&](std::int32_t o) { return o == e; });
      } while (!fresh);
      ex[static_cast<std::size_t>(t * top_k + j)] = e;
    }
  }
  const Tensor experts_t = Tensor::from_vector(ex, {tokens, top_k});
  const Tensor kept = Tensor::full({tokens, top_k}, 1.0, DType::u8);
  const Tensor weights = Tensor::full({tokens, top_k}, 1.0 / top_k, DType::f32);
  const Tensor x = Tensor::randn({tokens, hidden}, 1000 + static_cast<std::uint64_t>(rank));

  // The raw path's buffers and counts (elements, as MPI takes them).
  const nn::PermuteOutput p0 = nn::moe_permute(x, experts_t, kept, experts, Stream());
  const ExchangePlan plan0 = plan_exchange(p0.counts, El, &ep, nullptr, Stream());
  const std::int64_t n_send = plan0.send_rows(), n_recv = plan0.recv_rows();
  const Tensor sorted0 = p0.rows.narrow(0, 0, n_send);
  std::vector<int> scount(n), rcount(n), sdisp(n), rdisp(n);
  for (int q = 0; q < n; ++q) {
    std::int64_t s = 0, r = 0;
    for (std::int64_t le = 0; le < El; ++le) {
      s += plan0.send[static_cast<std::size_t>(q * El + le)];
      r += plan0.recv(q, le);
    }
    scount[q] = static_cast<int>(s * hidden);
    rcount[q] = static_cast<int>(r * hidden);
  }
  for (int q = 1; q < n; ++q) {
    sdisp[q] = sdisp[q - 1] + scount[q - 1];
    rdisp[q] = rdisp[q - 1] + rcount[q - 1];
  }
  std::vector<float> raw_in(static_cast<std::size_t>(n_recv * hidden)),
      raw_back(static_cast<std::size_t>(n_send * hidden));
  std::vector<long long> count_send(n, 0), count_recv(n, 0);

  Tensor y;
  const auto exchange = [&](bool full) {
    const nn::PermuteOutput p = full ? nn::moe_permute(x, experts_t, kept, experts, Stream()) : p0;
    const ExchangePlan plan = plan_exchange(p.counts, El, &ep, nullptr, Stream());
    const Tensor sorted = full ? p.rows.narrow(0, 0, plan.send_rows()) : sorted0;
    const Tensor xs = dispatch_rows(sorted, plan, &ep, nullptr, Stream());
    const Tensor back = return_rows(xs, plan, &ep, nullptr, Stream());
    if (full) y = nn::moe_unpermute(back, p.slot, weights, Stream());
  };
  const auto raw = [&] {
    for (int q = 0; q < n; ++q) count_send[q] = scount[q];
    MPI_Alltoall(count_send.data(), 1, MPI_LONG_LONG, count_recv.data(), 1, MPI_LONG_LONG,
                 MPI_COMM_WORLD);
    MPI_Alltoallv(sorted0.data<float>(), scount.data(), sdisp.data(), MPI_FLOAT, raw_in.data(),
                  rcount.data(), rdisp.data(), MPI_FLOAT, MPI_COMM_WORLD);
    MPI_Alltoallv(raw_in.data(), rcount.data(), rdisp.data(), MPI_FLOAT, raw_back.data(),
                  scount.data(), sdisp.data(), MPI_FLOAT, MPI_COMM_WORLD);
  };

  std::vector<double> t_ex, t_full, t_raw, r_ex, r_full;
  for (int i = 0; i < warmup + reps; ++i) {
    const double a = timed([&] { exchange(false); });
    const double b = timed([&] { exchange(true); });
    const double c = timed(raw);
    if (i < warmup) continue;
    t_ex.push_back(a);
    t_full.push_back(b);
    t_raw.push_back(c);
    r_ex.push_back(c / a);
    r_full.push_back(c / b);
  }

  // Identity experts and weights summing to one: the combine gives x back.
  double err = 0.0;
  {
    const float* a = y.data<float>();
    const float* b = x.data<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) err = std::max(err, double(std::abs(a[i] - b[i])));
  }
  MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double bytes = 2.0 * static_cast<double>(n_send * hidden) * sizeof(float);
  if (rank == 0) {
    nlohmann::json j{{"bench", "moe_dispatch"},
                     {"ranks", n},
                     {"tokens_per_rank", tokens},
                     {"hidden", hidden},
                     {"experts", experts},
                     {"top_k", top_k},
                     {"bytes_moved_per_rank", bytes},
                     {"exchange_ms", 1e3 * median(t_ex)},
                     {"full_ms", 1e3 * median(t_full)},
                     {"raw_ms", 1e3 * median(t_raw)},
                     {"raw_over_exchange", median(r_ex)},
                     {"raw_over_full", median(r_full)},
                     {"max_abs_error", err}};
    if (json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "ranks %d, %lld tokens x %lld f32 per rank, %lld experts, top-%d: %.1f MB moved per "
          "rank\n"
          "  exchange %.3f ms   full (permute+gather+combine) %.3f ms   raw MPI %.3f ms\n"
          "  raw/exchange %.3f   raw/full %.3f   (max |y - x| %.2g)\n",
          n, static_cast<long long>(tokens), static_cast<long long>(hidden),
          static_cast<long long>(experts), top_k, bytes / 1e6, 1e3 * median(t_ex),
          1e3 * median(t_full), 1e3 * median(t_raw), median(r_ex), median(r_full), err);
    }
  }
  if (err > 1e-5) {
    if (rank == 0) std::fprintf(stderr, "10_moe_dispatch_bench: the combine did not give x back\n");
    return 1;
  }
  return 0;
}
