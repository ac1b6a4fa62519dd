// Data parallelism under mpirun (any rank count; every rank is a dp replica): a tiny GPT trained
// for a few steps with DataParallel + DistributedOptimizer at global batch B ends with the same
// parameters, and reports the same gradient norms (clipping active), as one rank training on the
// whole batch with nn::AdamW — for ZeRO stages 0, 1, 2, with 1 or 2 accumulated microbatches,
// overlapped or serialised, and tiny, default and huge buckets. Also: the bucket plan, and the
// measured communication statistics.
//
// Tolerance (f32): parameters agree within 2e-5 + 1e-4 * |reference| after 3 AdamW steps at
// lr 1e-2 (the runs differ only in the order of f32 sums: reductions over ranks and
// microbatches); gradient norms within 1e-5 relative.
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

const Stream kCpu;
constexpr std::uint64_t kSeed = 7;
constexpr std::int64_t kGlobalBatch = 24;  // divisible by 1..4 ranks times 2 microbatches
constexpr int kSteps = 3;
const TinyGptConfig kModel;

World cpu_world() {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;
  config.timeout_s = 60;
  return init(config);
}

nn::AdamWConfig adam_config() {
  nn::AdamWConfig c;
  c.hyper.lr = 1e-2f;
  c.hyper.weight_decay = 0.1f;
  c.max_grad_norm = 0.2f;  // below the norms of this model: clipping is active every step
  return c;
}

struct RunResult {
  std::vector<std::vector<float>> params;  // store order
  std::vector<double> norms;
  std::vector<float> scales;
  std::vector<data_parallel::DataParallelStats> stats;
};

std::vector<std::vector<float>> values(const nn::ParameterStore& store) {
  std::vector<std::vector<float>> out;
  for (const nn::Parameter* p : store.parameters()) out.push_back(p->data().to_vector<float>());
  return out;
}

// One rank, the whole batch, nn::AdamW.
RunResult run_reference() {
  TinyGpt model(kModel);
  nn::ParameterStore store(model, DType::f32, kCpu, kSeed);
  nn::AdamW adam(store, adam_config(), kCpu);
  RunResult r;
  for (int s = 0; s < kSteps; ++s) {
    store.zero_grad(kCpu);
    train_microbatch(model, batch_rows(kModel, s, kGlobalBatch, 0, kGlobalBatch, kCpu), 1.0f, kCpu);
    const nn::OptimizerStepInfo info = adam.step(kCpu);
    r.norms.push_back(info.grad_norm());
    r.scales.push_back(info.grad_scale());
  }
  r.params = values(store);
  return r;
}

RunResult run_data_parallel(const Mesh& mesh, const data_parallel::DataParallelConfig& config,
                            int micro) {
  TinyGpt model(kModel);
  nn::ParameterStore store(model, DType::f32, kCpu, kSeed);
  data_parallel::DataParallel dp(store, mesh, config, kCpu);
  data_parallel::DistributedOptimizer optimizer(dp, adam_config(), kCpu);
  RunResult r;
  for (int s = 0; s < kSteps; ++s) {
    train_data_parallel_step(model, dp, mesh, kModel, s, kGlobalBatch, micro, kCpu);
    const nn::OptimizerStepInfo info = optimizer.step(kCpu);
    r.norms.push_back(info.grad_norm());
    r.scales.push_back(info.grad_scale());
    r.stats.push_back(dp.last_step_stats());
  }
  optimizer.wait_for_parameters(kCpu);
  r.params = values(store);
  return r;
}

void require_same(const RunResult& got, const RunResult& want) {
  REQUIRE(got.norms.size() == want.norms.size());
  for (std::size_t s = 0; s < want.norms.size(); ++s) {
    INFO("step " << s << ": norm " << got.norms[s] << " vs one rank " << want.norms[s]);
    CHECK(std::abs(got.norms[s] - want.norms[s]) <= 1e-5 * want.norms[s]);
    CHECK(want.scales[s] < 1.0f);  // clipping was exercised
    CHECK(std::abs(got.scales[s] - want.scales[s]) <= 1e-5f * want.scales[s]);
  }
  REQUIRE(got.params.size() == want.params.size());
  double worst = 0.0;
  for (std::size_t p = 0; p < want.params.size(); ++p) {
    REQUIRE(got.params[p].size() == want.params[p].size());
    for (std::size_t i = 0; i < want.params[p].size(); ++i) {
      const double w = want.params[p][i], g = got.params[p][i];
      worst = std::max(worst, std::abs(g - w) / (2e-5 + 1e-4 * std::abs(w)));
    }
  }
  INFO("worst parameter error / tolerance = " << worst);
  CHECK(worst <= 1.0);
}

}  // namespace

TEST_CASE("dp: training with dp = N equals one rank at the same global batch") {
  World world = cpu_world();
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  const RunResult reference = run_reference();

  struct Case {
    const char* name;
    int stage;
    bool overlap;
    std::int64_t first, bytes;
    int micro;
  };
  const Case cases[] = {
      {"stage 0, default buckets", 0, true, 1 << 20, 25 << 20, 1},
      {"stage 0, tiny buckets, 2 microbatches", 0, true, 256, 1024, 2},
      {"stage 0, serialised, 2 microbatches", 0, false, 256, 1024, 2},
      {"stage 0, huge buckets", 0, true, std::int64_t{1} << 30, std::int64_t{1} << 30, 1},
      {"ZeRO-1, tiny buckets, 2 microbatches", 1, true, 256, 1024, 2},
      {"ZeRO-1, default buckets", 1, true, 1 << 20, 25 << 20, 1},
      {"ZeRO-2, tiny buckets", 2, true, 256, 1024, 1},
      {"ZeRO-2, default buckets, 2 microbatches", 2, true, 1 << 20, 25 << 20, 2},
      // 3 or 4 microbatches: the later ones' reductions land in scratch and are added to the
      // shard when the bucket reduces again.
      {"ZeRO-2, tiny buckets, 3-4 microbatches", 2, true, 256, 1024, 0},
      {"ZeRO-2, huge buckets, 2 microbatches, serialised", 2, false, std::int64_t{1} << 30,
       std::int64_t{1} << 30, 2},
  };
  for (const Case& c : cases) {
    INFO(c.name << " with dp = " << world.size());
    data_parallel::DataParallelConfig config;
    config.zero_stage = c.stage;
    config.overlap = c.overlap;
    config.first_bucket_bytes = c.first;
    config.bucket_bytes = c.bytes;
    const std::int64_t local = kGlobalBatch / world.size();
    const int micro = c.micro > 0 ? c.micro : local % 3 == 0 ? 3 : 4;
    REQUIRE(local % micro == 0);
    const RunResult got = run_data_parallel(mesh, config, micro);
    require_same(got, reference);
    for (const data_parallel::DataParallelStats& st : got.stats) {
      CHECK(st.buckets > 0);
      CHECK(st.bytes >= 4 * 64 * st.buckets);
      CHECK(st.comm_ms >= 0.0);
      CHECK(st.exposed_ms >= 0.0);
      // Serialised, every reduction runs inside finish(): its span holds all of them.
      if (!c.overlap) CHECK(st.comm_ms <= st.exposed_ms + 1e-3);
      if (world.size() > 1) CHECK(st.comm_ms > 0.0);
      // Stage 2 reduces every microbatch; stages 0, 1 once per step.
      if (c.stage == 2) CHECK(st.buckets % micro == 0);
    }
  }
}

TEST_CASE("dp: ZeRO-2 holds the gradient shards and the buckets in flight, not a full buffer") {
  World world = cpu_world();
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  auto peak = [&](int stage, std::int64_t* shard_bytes, std::int64_t* largest3) {
    TinyGpt model(kModel);
    nn::ParameterStore store(model, DType::f32, kCpu, kSeed);
    const std::int64_t full_bytes = store.total_elements() * 4;
    data_parallel::DataParallelConfig config;
    config.zero_stage = stage;
    config.first_bucket_bytes = 256;  // about one parameter per bucket
    config.bucket_bytes = 1024;
    data_parallel::DataParallel dp(store, mesh, config, kCpu);
    data_parallel::DistributedOptimizer optimizer(dp, adam_config(), kCpu);
    if (stage == 2) {
      CHECK(!store.grad_buffer().defined());
      REQUIRE_THROWS_QUINTET(store.parameters().front()->grad(), InvalidArgument,
                             "keeps gradients on demand");
    }
    std::vector<std::int64_t> sizes;
    *shard_bytes = 0;
    for (const data_parallel::GradientBucket& b : dp.buckets()) {
      *shard_bytes += b.shard_size * 4;
      sizes.push_back(b.shard_size * b.shard_count * 4);
    }
    std::sort(sizes.rbegin(), sizes.rend());
    *largest3 = 0;
    for (std::size_t i = 0; i < std::min<std::size_t>(3, sizes.size()); ++i) *largest3 += sizes[i];
    const std::int64_t rows = kGlobalBatch / world.size();
    dp.begin_step();
    train_microbatch(model, batch_rows(kModel, 0, kGlobalBatch, world.rank() * rows, rows, kCpu),
                     1.0f, kCpu);
    dp.finish(kCpu);
    optimizer.step(kCpu);
    optimizer.wait_for_parameters(kCpu);
    const data_parallel::DataParallelStats st = dp.last_step_stats();
    if (stage == 0) CHECK(st.peak_gradient_bytes == full_bytes);
    if (stage == 2) {
      // No gradient is left bound once the step is done.
      for (const nn::Parameter* p : store.parameters()) CHECK(!p->grad_bound());
    }
    return st.peak_gradient_bytes;
  };
  std::int64_t shards = 0, largest = 0;
  const std::int64_t full = peak(0, &shards, &largest);
  const std::int64_t zero2 = peak(2, &shards, &largest);
  INFO("stage 0 peak " << full << " B, ZeRO-2 peak " << zero2 << " B, shards " << shards
                       << " B, three largest buckets " << largest << " B");
  CHECK(zero2 >= shards);
  CHECK(zero2 <= shards + largest);  // the bound buckets: a layer's weight and bias at most
  if (world.size() > 1) CHECK(zero2 < full);
}

TEST_CASE("dp: buckets tile the gradient buffer in order, within their limits") {
  World world = cpu_world();
  const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
  TinyGpt model(kModel);
  nn::ParameterStore store(model, DType::f32, kCpu, kSeed);
  for (std::int64_t bytes : {std::int64_t{256}, std::int64_t{4096}, std::int64_t{1} << 30}) {
    data_parallel::DataParallelConfig config;
    config.first_bucket_bytes = bytes / 2;
    config.bucket_bytes = bytes;
    config.zero_stage = 1;
    data_parallel::DataParallel dp(store, mesh, config, kCpu);
    const std::vector<data_parallel::GradientBucket>& buckets = dp.buckets();
    REQUIRE(!buckets.empty());
    std::int64_t at = 0;
    std::size_t params = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const data_parallel::GradientBucket& k = buckets[b];
      CHECK(k.begin == at);
      CHECK(k.params.front()->offset() == k.begin);
      const std::int64_t limit = b == 0 ? config.first_bucket_bytes : config.bucket_bytes;
      if (k.params.size() > 1) CHECK(k.numel() * 4 <= limit);
      CHECK(k.axis == Axis::dp_cp);
      CHECK(k.shard_count == world.size());
      CHECK(k.shard_rank == world.rank());
      CHECK(k.shard_size * k.shard_count >= k.numel());
      CHECK(k.shard_size * k.shard_count < k.numel() + k.shard_count);
      for (const nn::Parameter* p : k.params) CHECK(p == store.parameters()[params++]);
      at = k.end;
    }
    CHECK(at == store.grad_buffer().numel());
    CHECK(params == store.parameters().size());
    if (bytes == 256) CHECK(buckets.size() > store.parameters().size() / 2);
    if (bytes == (std::int64_t{1} << 30)) CHECK(buckets.size() <= 2);
  }
}
