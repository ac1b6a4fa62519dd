// Data parallelism on GPUs (one per rank, NCCL; run with 1 and 2 ranks): the tiny GPT of the CPU
// test, in bf16 with f32 master weights, trained 3 steps with dp = 1 or 2 (ZeRO 0, 1 and 2; 1, 2
// or 4 microbatches; overlapped or serialised) against each rank training the whole batch alone
// with nn::AdamW. The two runs differ by bf16 rounding of activations (half vs whole batch) and the
// order of f32 sums, so the bound is relative to how far training moved the parameters: the mean
// |difference| must stay under 5% of the mean |update|, and so must every chunk of about 4096
// elements' under 20% of the chunk's (so a reduction that drops or misreads one bucket fails even
// where the whole-buffer mean would hide it), and the gradient norms within 2% (a reduction that
// sums where it should average doubles them). No per-element bound: AdamW's first steps move each
// element by about lr whatever its gradient's size, so a gradient near 0 whose sign differs by
// rounding moves that element 2 lr apart in the two runs, and 2 * steps * lr is what any two runs
// stay within. Negative control: a rank training only its own share of the batch (what dp would do
// without the reduction; at 1 rank the first half) with nn::AdamW must fail these bounds. Also: the
// measured overlap statistics, and a CPU store with a GPU mesh is rejected.
#include <algorithm>
#include <cmath>

#include "mpi/dp_tiny_model.hpp"
#include "quintet/collectives/bootstrap.hpp"
#include "quintet/parallel/data_parallel/distributed_optimizer.hpp"
#include "support/catch.hpp"
#include "support/nn_adamw.hpp"

using namespace quintet;
using namespace dp_test;

namespace {

constexpr std::uint64_t kSeed = 7;
constexpr std::int64_t kGlobalBatch = 16;
constexpr int kSteps = 3;
constexpr float kLr = 1e-2f;
const TinyGptConfig kModel{64, 64, 4, 256, 32, 2};

World gpu_world() {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cuda;
  config.timeout_s = 120;
  return init(config);
}

nn::AdamWConfig adam_config() {
  nn::AdamWConfig c;
  c.hyper.lr = kLr;
  c.hyper.weight_decay = 0.1f;
  c.max_grad_norm = 1.0f;
  return c;
}

struct RunResult {
  std::vector<float> init, params;  // the whole value buffer, as f32
  std::vector<double> norms;
  std::vector<data_parallel::DataParallelStats> stats;
};

// One GPU training rows [row0, row0 + rows) of every step's batch alone with nn::AdamW.
RunResult run_alone(std::int64_t row0, std::int64_t rows, const Stream& s) {
  TinyGpt model(kModel, s.device());
  nn::ParameterStore store(model, DType::bf16, s, kSeed);
  RunResult r;
  r.init = store.data_buffer().to_vector<float>();
  nn::AdamW adam(store, adam_config(), s);
  for (int step = 0; step < kSteps; ++step) {
    store.zero_grad(s);
    train_microbatch(model, batch_rows(kModel, step, kGlobalBatch, row0, rows, s), 1.0f, s);
    r.norms.push_back(adam.step(s).grad_norm());
  }
  s.synchronize();
  r.params = store.data_buffer().to_vector<float>();
  return r;
}

RunResult run_dp(const Mesh& mesh, const data_parallel::DataParallelConfig& config, int micro,
                 const Stream& s) {
  TinyGpt model(kModel, s.device());
  nn::ParameterStore store(model, DType::bf16, s, kSeed);
  data_parallel::DataParallel dp(store, mesh, config, s);
  data_parallel::DistributedOptimizer optimizer(dp, adam_config(), s);
  RunResult r;
  for (int step = 0; step < kSteps; ++step) {
    train_data_parallel_step(model, dp, mesh, kModel, step, kGlobalBatch, micro, s);
    r.norms.push_back(optimizer.step(s).grad_norm());
    r.stats.push_back(dp.last_step_stats());
  }
  optimizer.wait_for_parameters(s);
  s.synchronize();
  r.params = store.data_buffer().to_vector<float>();
  return r;
}

// How far a run is from the reference, against the bounds of the header.
struct Distance {
  bool norms_ok = true, mean_ok = false, chunks_ok = true;
  double moved = 0.0;
};

constexpr std::size_t kChunk = 4096;

Distance distance(const RunResult& got, const RunResult& want) {
  Distance d;
  for (std::size_t i = 0; i < want.norms.size(); ++i) {
    UNSCOPED_INFO("step " << i << " norm " << got.norms[i] << " vs " << want.norms[i]);
    if (!(std::abs(got.norms[i] - want.norms[i]) <= 2e-2 * want.norms[i])) d.norms_ok = false;
  }
  double diff = 0.0, worst_chunk = 0.0;
  // About kChunk elements each, the last not much shorter than the others.
  const std::size_t chunks = std::max<std::size_t>(1, want.params.size() / kChunk);
  for (std::size_t c = 0; c < chunks; ++c) {
    double chunk_diff = 0.0, chunk_moved = 0.0;
    for (std::size_t i = c * want.params.size() / chunks; i < (c + 1) * want.params.size() / chunks;
         ++i) {
      chunk_diff += std::abs(got.params[i] - want.params[i]);
      chunk_moved += std::abs(want.params[i] - want.init[i]);
    }
    diff += chunk_diff;
    d.moved += chunk_moved;
    if (chunk_moved > 0.0) worst_chunk = std::max(worst_chunk, chunk_diff / chunk_moved);
    if (!(chunk_diff <= 0.2 * chunk_moved)) d.chunks_ok = false;
  }
  const double n = static_cast<double>(want.params.size());
  UNSCOPED_INFO("mean |difference| " << diff / n << ", mean |update| " << d.moved / n
                                     << ", worst chunk's |difference| / |update| " << worst_chunk);
  d.mean_ok = diff <= 0.05 * d.moved;
  return d;
}

void require_close(const RunResult& got, const RunResult& want) {
  const Distance d = distance(got, want);
  CHECK(d.moved > 0.0);
  CHECK(d.norms_ok);
  CHECK(d.mean_ok);
  CHECK(d.chunks_ok);
}

}  // namespace

TEST_CASE("gpu dp: dp = 2 in bf16 follows one GPU training the whole batch") {
  World world = gpu_world();
  const Stream s = Stream::create(world.device());
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  RunResult reference = run_alone(0, kGlobalBatch, s);
  {
    INFO("negative control: this rank's share alone, without the reduction");
    const std::int64_t share = kGlobalBatch / std::max<std::int64_t>(world.size(), 2);
    RunResult alone = run_alone(mesh.rank(Axis::dp) * share, share, s);
    alone.init = reference.init;
    const Distance d = distance(alone, reference);
    CHECK(d.moved > 0.0);
    CHECK_FALSE(d.mean_ok);
    CHECK_FALSE(d.chunks_ok);
  }
  struct Case {
    int stage;
    bool overlap;
    std::int64_t bucket;
    int micro;
  };
  std::int64_t full_grad_bytes = 0;
  for (const Case c :
       {Case{0, true, 1 << 16, 1}, Case{0, false, 1 << 16, 2}, Case{1, true, 1 << 14, 2},
        Case{2, true, 25 << 20, 1}, Case{2, true, 1 << 14, 4}, Case{2, false, 1 << 16, 2}}) {
    INFO("stage " << c.stage << " overlap " << c.overlap << " bucket " << c.bucket << " micro "
                  << c.micro);
    data_parallel::DataParallelConfig config;
    config.zero_stage = c.stage;
    config.overlap = c.overlap;
    config.first_bucket_bytes = c.bucket / 4;
    config.bucket_bytes = c.bucket;
    RunResult got = run_dp(mesh, config, c.micro, s);
    got.init = reference.init;
    require_close(got, reference);
    for (const data_parallel::DataParallelStats& st : got.stats) {
      CHECK(st.buckets > 0);
      CHECK(st.exposed_ms >= 0.0);
      if (world.size() > 1) CHECK(st.comm_ms > 0.0);
      if (!c.overlap) CHECK(st.comm_ms <= st.exposed_ms + 0.05);
      if (c.stage == 0) full_grad_bytes = st.peak_gradient_bytes;
      // ZeRO-2 keeps shards (1/dp of the gradient, twice with accumulation) and the buckets in
      // flight, never the full buffer.
      if (c.stage == 2 && world.size() > 1) CHECK(st.peak_gradient_bytes < full_grad_bytes);
    }
  }
}

TEST_CASE("gpu dp: a CPU store with a GPU mesh is rejected before any communication") {
  World world = gpu_world();
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  TinyGpt model(kModel);
  const Stream cpu;
  nn::ParameterStore store(model, DType::f32, cpu, kSeed);
  REQUIRE_THROWS_QUINTET(
      data_parallel::DataParallel(store, mesh, data_parallel::DataParallelConfig{}, cpu),
      InvalidArgument, "communicator moves tensors on");
}
