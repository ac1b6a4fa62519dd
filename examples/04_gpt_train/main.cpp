// 04_gpt_train: a GPT trained under any dp x tp (+ sp) x pp layout, on CPUs or GPUs, on the
// built-in dataset or token shards, with checkpoints and per-step metrics. The template for your
// trainer: one step reads top to bottom in train_step() below.
//
//   mpirun -np 4 04_gpt_train --tp 2 --dp 2 --device cpu --steps 200         # CPU, 4 ranks
//   mpirun -np 2 04_gpt_train --dp 2 --layers 24 --hidden 1024 --heads 16 \
//       --seq-len 1024 --micro-batch 8 --global-batch 16 --bench              # two GPUs
//   mpirun -np 4 04_gpt_train --pp 4 --schedule zb-h1 --layers 8 --global-batch 32 --device cpu
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "metrics.hpp"
#include "quintet/collectives/bootstrap.hpp"  // World, init
#include "quintet/core/allocator.hpp"         // peak GPU memory
#include "quintet/core/log.hpp"
#include "quintet/data/loader.hpp"                  // DataLoader
#include "quintet/data/synthetic.hpp"               // the built-in dataset and its entropy floor
#include "quintet/nn/ops.hpp"                       // add_
#include "quintet/parallel/data/data_parallel.hpp"  // gradient buckets over dp
#include "quintet/parallel/data/distributed_optimizer.hpp"  // AdamW, ZeRO 0/1/2, clipping
#include "quintet/parallel/data/loader_for_mesh.hpp"        // the loader's replica
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/model/gpt.hpp"                   // the library GPT (model + loss)
#include "quintet/parallel/overlap/timed_communicator.hpp"  // exposed tp communication per step
#include "quintet/parallel/pipeline/executor.hpp"           // the pipeline schedule, run
#include "quintet/parallel/pipeline/train_step.hpp"         // one optimizer step over the stages
#include "trainer_state.hpp"

namespace {

using quintet::Axis;
using quintet::Tensor;

// One pipeline stage this rank holds: its chunk of the model, the chunk's parameters, their
// data parallelism and optimizer (a rank holds --vpp stages; one without a pipeline).
struct Stage {
  std::unique_ptr<quintet::model::GptChunk> model;
  std::unique_ptr<quintet::nn::ParameterStore> store;
  std::unique_ptr<quintet::DataParallel> dp;
  std::unique_ptr<quintet::DistributedOptimizer> optimizer;
};

struct Trainer {
  const gpt::TrainConfig& config;
  quintet::World& world;
  quintet::Mesh& mesh;
  const quintet::Stream& stream;
  std::vector<Stage>& stages;
  quintet::pipeline::PipelineExecutor& pipeline;
  quintet::data::DataLoader& loader;
  quintet::data::SamplerState data_position;  // after the last batch consumed
};

struct StepResult {
  double loss = 0.0;
  double grad_norm = 0.0;
};

// One optimizer step: the pipeline schedule over the step's microbatches (without a pipeline:
// forward and backward of each in turn, accumulating), the gradient reductions overlapping the
// last backwards, the (sharded) AdamW update, the loss averaged over dp.
StepResult train_step(Trainer& t) {
  // Called on the ranks of the first and last stage, once per microbatch, in order.
  auto next_microbatch = [&t](int) {
    quintet::data::Batch batch = t.loader.next(t.stream);
    batch.wait(t.stream);
    t.data_position = batch.next_state;
    // --check-batches: this stage's tp ranks must hold the same tokens.
    if (t.config.check_batches) {
      quintet::check_same_batch(t.mesh.comm(Axis::tp), batch.tokens, t.stream);
    }
    return quintet::pipeline::MicrobatchData{batch.tokens, batch.targets};
  };
  // The library's step: the schedule (each stage's data-parallel step inside, tied embedding
  // gradients summed), the joint optimizer step, the loss of the global batch on every rank.
  std::vector<quintet::DistributedOptimizer*> optimizers;
  for (Stage& s : t.stages) optimizers.push_back(s.optimizer.get());
  const quintet::pipeline::TrainStepResult r =
      quintet::pipeline::train_step(t.pipeline, optimizers, t.mesh, next_microbatch, t.stream);
  return {r.loss, r.optimizer.grad_norm};
}

int run(const gpt::TrainConfig& c, quintet::World& world) {
  gpt::validate(c, world.size());
  const quintet::Device device = world.device();
  const bool gpu = device.is_cuda();
  quintet::Stream stream = gpu ? quintet::Stream::create(device) : quintet::Stream();

  quintet::ParallelConfig layout;
  layout.tp = c.tp;
  layout.dp = c.dp;
  layout.pp = c.pp;
  quintet::Mesh mesh(quintet::Layout(layout, world.size()), world.comm());

  // Data: the built-in dataset (made once, by whichever rank gets there first) or the user's.
  std::string spec = c.data;
  if (spec.empty()) {
    quintet::data::SyntheticConfig synthetic;
    synthetic.order = c.synthetic_order;
    QUINTET_CHECK(c.vocab >= synthetic.vocab_size,
                  "--vocab {}: the built-in dataset has {} tokens; use --vocab >= {}", c.vocab,
                  synthetic.vocab_size, synthetic.vocab_size);
    // One directory per dataset configuration, so datasets of other settings never clash.
    const auto made =
        quintet::data::ensure_synthetic_dataset(c.data_dir + "/" + synthetic.describe(), synthetic);
    spec = fmt::format("{}", fmt::join(made.train, ","));
  }
  quintet::data::TokenDataset dataset = quintet::data::TokenDataset::open(spec);
  const std::optional<double> floor = quintet::data::entropy_floor_nats(dataset);

  // The tp layers and the loss issue their collectives through a timing wrapper (results are the
  // inner communicator's), so each step can report the tp communication it was exposed to.
  std::optional<quintet::TimedCommunicator> timed_tp;
  if (c.tp > 1) timed_tp.emplace(mesh.comm(Axis::tp));
  quintet::Communicator& tp_comm = timed_tp ? *timed_tp : mesh.comm(Axis::tp);
  const quintet::model::GptConfig model_config = gpt::model_config(c, gpu);
  quintet::pipeline::Schedule schedule = gpt::pipeline_schedule(c);
  const auto chunks = quintet::model::split_into_chunks(model_config, c.pp * c.vpp);
  quintet::DataParallelConfig dp_config;
  dp_config.overlap = !c.no_overlap;
  dp_config.zero_stage = c.zero;
  dp_config.bucket_bytes = std::max<std::int64_t>(
      4, static_cast<std::int64_t>(c.bucket_mb * static_cast<double>(1 << 20)));
  dp_config.first_bucket_bytes = std::min(dp_config.first_bucket_bytes, dp_config.bucket_bytes);
  quintet::nn::AdamWConfig adam;
  adam.hyper.lr = c.lr;
  adam.hyper.beta1 = 0.9f;
  adam.hyper.beta2 = 0.95f;
  adam.hyper.eps = 1e-8f;
  adam.hyper.weight_decay = c.weight_decay;
  adam.max_grad_norm = c.clip;
  // This rank's stages: each a chunk of the library model with its own parameters, data
  // parallelism and optimizer.
  std::vector<Stage> stages;
  std::vector<quintet::pipeline::StageModule> stage_modules;
  std::vector<gpt::StageState> saved_state;
  for (int s : schedule.stages_of(mesh.rank(Axis::pp))) {
    Stage st;
    st.model = quintet::model::build_gpt_chunk(model_config, {&tp_comm}, chunks[s]);
    st.store = std::make_unique<quintet::nn::ParameterStore>(*st.model, model_config.dtype, stream,
                                                             c.seed);
    st.dp = std::make_unique<quintet::DataParallel>(*st.store, mesh, dp_config, stream);
    st.optimizer = std::make_unique<quintet::DistributedOptimizer>(*st.dp, adam, stream);
    stage_modules.push_back({s, st.model.get(), st.dp.get()});
    saved_state.push_back({s, st.store.get(), st.optimizer.get()});
    stages.push_back(std::move(st));
  }
  const std::int64_t seq = c.sp ? c.seq_len / c.tp : c.seq_len;
  quintet::pipeline::PipelineExecutor pipeline(
      std::move(schedule), mesh.comm(Axis::pp), stage_modules,
      {{c.micro_batch, seq, c.hidden}, model_config.dtype});

  gpt::RunPosition start;
  if (!c.resume.empty()) {
    if (auto resumed = gpt::resume_run(c, saved_state, world.comm(), stream)) {
      start = *resumed;
      if (world.rank() == 0) {
        quintet::log::info("resumed from {} at step {}", c.resume, start.step);
      }
    }
  }

  quintet::data::LoaderConfig lc;
  lc.seq_len = c.seq_len;
  lc.batch_size = c.micro_batch;
  lc.threads = c.loader_threads;
  lc.device = device;
  lc.seed = c.seed;
  lc.start = start.data;
  // The mesh sets the data-parallel replica: every tp and pp rank of one reads the same batches.
  quintet::data::DataLoader loader(std::move(dataset), quintet::loader_config_for(mesh, lc));

  if (world.rank() == 0 && !c.json) {
    fmt::print(
        "04_gpt_train: {} params ({} non-embedding), {} layers, hidden {}, heads {}, "
        "vocab {}, seq {}{} | tp {}{} x dp {} x pp {} ({}, {} chunk{} per rank), ZeRO-{} | {} | "
        "global batch {} = micro {} x dp {} x accumulation {}\n",
        model_config.total_params(), model_config.non_embedding_params(), c.layers, c.hidden,
        c.heads, c.vocab, c.seq_len, c.tied_embeddings ? ", tied embeddings" : "", c.tp,
        c.sp ? " (+sp)" : "", c.dp, c.pp, pipeline.schedule().name, c.vpp, c.vpp > 1 ? "s" : "",
        c.zero, device.str(), c.global_batch, c.micro_batch, c.dp, c.accumulation());
  }
  Trainer t{c, world, mesh, stream, stages, pipeline, loader, start.data};
  gpt::Reporter reporter(world.rank() == 0, c.json, c.progress, c.steps);
  const double fpt =
      gpt::flops_per_token(model_config.non_embedding_params(), c.layers, c.hidden, c.seq_len);
  const std::int64_t end = c.stop_at > 0 ? c.stop_at : c.steps;
  for (std::int64_t step = start.step; step < end; ++step) {
    const float lr = gpt::learning_rate(c, step);
    for (Stage& st : stages) st.optimizer->set_lr(lr);
    if (gpu) quintet::cuda_reset_peak(device);
    if (timed_tp) timed_tp->reset();  // the window is this step
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = train_step(t);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    quintet::DataParallelStats comm;  // over this rank's stages
    for (const Stage& st : stages) {
      const quintet::DataParallelStats one = st.dp->last_step_stats();
      comm.comm_ms += one.comm_ms;
      comm.exposed_ms += one.exposed_ms;
      comm.peak_gradient_bytes += one.peak_gradient_bytes;
    }
    const double tp_exposed_ms = timed_tp ? timed_tp->take_stats().exposed_ms : 0.0;

    gpt::StepRecord rec;
    rec.step = step + 1;
    rec.loss = r.loss;
    rec.entropy_floor = floor;
    rec.lr = lr;
    rec.grad_norm = r.grad_norm;
    rec.ms = ms;
    rec.tokens_per_s = static_cast<double>(c.tokens_per_step()) / (ms / 1000.0);
    if (gpu) {
      const double flops_per_gpu = rec.tokens_per_s * fpt / world.size();
      rec.tflops = flops_per_gpu / 1e12;
      rec.mfu = flops_per_gpu / gpt::kPeakFlopsPerGpu;
      rec.peak_mem_bytes =
          static_cast<std::int64_t>(quintet::cuda_allocator_stats(device).peak_bytes);
    } else {
      rec.peak_mem_bytes = gpt::peak_rss_bytes();
    }
    rec.grad_mem_bytes = comm.peak_gradient_bytes;
    rec.comm_ms = comm.comm_ms;
    rec.tp_comm_ms = tp_exposed_ms;
    rec.exposed_comm_pct = 100.0 * (comm.exposed_ms + tp_exposed_ms) / ms;
    reporter.step(rec);

    const bool last = step + 1 == end;
    if (!c.save.empty() && ((c.save_every > 0 && (step + 1) % c.save_every == 0) || last)) {
      gpt::save_run(c, {step + 1, t.data_position}, saved_state, world.comm(), stream);
    }
  }
  reporter.summary(c.bench ? c.bench_skip : 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const quintet::RuntimeConfig runtime = quintet::RuntimeConfig::from_args(argc, argv);
    gpt::TrainConfig config;
    int exit_code = 0;
    if (!gpt::parse_args(runtime, &config, &exit_code)) return exit_code;
    quintet::World world = quintet::init(runtime);
    return run(config, world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "04_gpt_train: %s\n", e.what());
    return 2;
  }
}
