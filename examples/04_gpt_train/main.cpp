// 04_gpt_train: a GPT trained under any dp x tp (+ sp) x pp x cp layout, on CPUs or GPUs, on the
// built-in dataset or token shards, with checkpoints and per-step metrics. Built with
// QUINTET_MOE_TRAINER it is 05_moe_train: the same trainer with mixture-of-experts MLPs spread
// over ep (and etp), its MoE flags, and the per-step MoE telemetry. The library does the
// model, the step and the checkpoints (train::TrainingModel, train::Checkpointer); this program
// adds the flags, the dataset and the metrics. docs/trainer.md has the short version.
//
//   mpirun -np 4 04_gpt_train --tp 2 --dp 2 --device cpu --steps 200         # CPU, 4 ranks
//   mpirun -np 2 04_gpt_train --dp 2 --layers 24 --hidden 1024 --heads 16 \
//       --seq-len 1024 --micro-batch 8 --global-batch 16 --bench              # two GPUs
//   mpirun -np 4 04_gpt_train --pp 4 --schedule zb-h1 --layers 8 --global-batch 32 --device cpu
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "metrics.hpp"
#include "quintet/collectives/bootstrap.hpp"             // World, init
#include "quintet/collectives/checked_communicator.hpp"  // --check-collectives' count
#include "quintet/collectives/consistency.hpp"           // the same settings on every rank
#include "quintet/core/allocator.hpp"                    // peak GPU memory
#include "quintet/core/log.hpp"
#include "quintet/data/loader.hpp"     // DataLoader
#include "quintet/data/synthetic.hpp"  // the built-in dataset and its entropy floor
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/overlap/timed_communicator.hpp"  // exposed tp communication per step
#include "quintet/parallel/train/checkpointer.hpp"          // save and resume in one call
#include "quintet/parallel/train/training_model.hpp"        // this rank's stages, one step
#include "trace_session.hpp"
#include "trainer_state.hpp"

namespace {

using quintet::Axis;

int run(const gpt::TrainConfig& c, quintet::World& world) {
  // Before anything that could fail on one rank only: every rank has the same settings (an
  // MPMD launch with different flags is refused, naming the flag, instead of hanging).
  quintet::check_same_on_all_ranks(world.comm(), gpt::shared_settings(c), gpt::kProgram);
  gpt::validate(c, world.size());
  const quintet::Device device = world.device();
  const bool gpu = device.is_cuda();
  quintet::Stream stream = gpu ? quintet::Stream::create(device) : quintet::Stream();

  quintet::ParallelConfig layout;
  layout.tp = c.tp;
  layout.cp = c.cp;
  layout.dp = c.dp;
  layout.pp = c.pp;
  layout.ep = c.ep;
  layout.etp = c.etp;
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
  // Each measures the time the compute stream stalled on its collectives (from the wait).
  constexpr auto kFromWait = quintet::TimedCommunicator::Measure::from_wait;
  std::optional<quintet::TimedCommunicator> timed_tp;
  if (c.tp > 1) timed_tp.emplace(mesh.comm(Axis::tp), kFromWait);
  std::optional<quintet::TimedCommunicator> timed_cp;  // the same for the cp ring / all-to-alls
  if (c.cp > 1) timed_cp.emplace(mesh.comm(Axis::cp), kFromWait);
  std::optional<quintet::TimedCommunicator> timed_ep;  // the MoE token exchanges
  if (c.ep > 1) timed_ep.emplace(mesh.comm(Axis::ep), kFromWait);
  std::optional<quintet::TimedCommunicator> timed_pp;  // the stage-to-stage transfers
  if (c.pp > 1) timed_pp.emplace(mesh.comm(Axis::pp), kFromWait);

  // This rank's share of the model: its pipeline stages (each a chunk of the library GPT with its
  // parameters, data parallelism and AdamW) and the executor that runs them.
  quintet::train::TrainingConfig tc;
  tc.model = gpt::model_config(c, gpu);
  tc.micro_batch = c.micro_batch;
  tc.microbatches = static_cast<int>(c.accumulation());
  tc.schedule = quintet::pipeline::parse_schedule_kind(c.schedule);
  tc.vpp = c.vpp;
  tc.data_parallel.overlap = !c.no_overlap;
  tc.data_parallel.zero_stage = c.zero;
  tc.data_parallel.bucket_bytes = std::max<std::int64_t>(
      4, static_cast<std::int64_t>(c.bucket_mb * static_cast<double>(1 << 20)));
  tc.data_parallel.first_bucket_bytes =
      std::min(tc.data_parallel.first_bucket_bytes, tc.data_parallel.bucket_bytes);
  tc.optimizer.hyper.lr = c.lr;
  tc.optimizer.hyper.beta1 = 0.9f;
  tc.optimizer.hyper.beta2 = 0.95f;
  tc.optimizer.hyper.eps = 1e-8f;
  tc.optimizer.hyper.weight_decay = c.weight_decay;
  tc.optimizer.max_grad_norm = c.clip;
  tc.seed = c.seed;
  tc.check_batches = c.check_batches;  // --check-batches: a stage's tp ranks read the same tokens
  quintet::train::ModelCommunicators comms;
  comms.tp = timed_tp ? &*timed_tp : nullptr;
  comms.cp = timed_cp ? &*timed_cp : nullptr;
  comms.ep = timed_ep ? &*timed_ep : nullptr;
  comms.pp = timed_pp ? &*timed_pp : nullptr;
  quintet::train::TrainingModel model(tc, mesh, stream, comms);

  // The loader's batch, sequence and replica come from the model (every tp and pp rank of one
  // replica reads the same batches).
  quintet::data::LoaderConfig lc;
  lc.threads = c.loader_threads;
  lc.seed = c.seed;
  quintet::data::DataLoader loader(std::move(dataset), model.loader_config(lc));

  // Checkpoints agree over the CPU communicator (a background save must not share the GPU one).
  quintet::Communicator& ckpt_comm = world.has_cpu_comm() ? world.cpu_comm() : world.comm();
  std::int64_t start = 0;
  const std::string& resume = c.resume.empty() ? c.resume_if_exists : c.resume;
  if (!resume.empty()) {
    const auto step = gpt::checkpointer(c, resume, ckpt_comm).restore(model, loader);
    // Every rank sees the same directory, so every rank throws together.
    QUINTET_CHECK(
        step.has_value() || c.resume.empty(),
        "--resume {}: {}; use --resume-if-exists to start fresh when there is none", c.resume,
        std::filesystem::exists(c.resume) ? "it holds no checkpoint" : "no such directory");
    if (step) {
      start = *step;
      if (world.rank() == 0) quintet::log::info("resumed from {} at step {}", resume, start);
    }
  }
  std::optional<quintet::train::Checkpointer> saver;
  if (!c.save.empty()) saver.emplace(gpt::checkpointer(c, c.save, ckpt_comm));
  // The pinned buffers of --async-save now, not at the first save (seconds for a large model).
  if (saver && c.async_save) saver->prepare_async(model, loader);

  if (world.rank() == 0 && !c.json) {
    fmt::print(
        "{}: {} params ({} non-embedding), {} layers, hidden {}, heads {}, "
        "vocab {}, seq {}{} | tp {}{} x cp {} x dp {} x pp {} ({}, {} chunk{} per rank), ZeRO-{} | "
        "{} | "
        "global batch {} = micro {} x dp {} x accumulation {}\n",
        gpt::kProgram, tc.model.total_params(), tc.model.non_embedding_params(), c.layers, c.hidden,
        c.heads, c.vocab, c.seq_len, c.tied_embeddings ? ", tied embeddings" : "", c.tp,
        c.sp ? " (+sp)" : "", c.cp, c.dp, c.pp, model.executor().schedule().name, c.vpp,
        c.vpp > 1 ? "s" : "", c.zero, device.str(), c.global_batch, c.micro_batch, c.dp,
        c.accumulation());
  }
  if (world.rank() == 0 && !c.json && gpt::kMoeTrainer) {
    fmt::print(
        "  MoE: {} experts, top-{}, {} router, every {} block(s), expert width {}, {} shared, "
        "capacity {} | ep {} x etp {} | {} active non-embedding params per token\n",
        c.experts, c.top_k, c.router, c.moe_every, tc.model.expert_width(), c.shared_experts,
        c.capacity_factor > 0 ? fmt::format("{}", c.capacity_factor) : std::string("dropless"),
        c.ep, mesh.size(Axis::etp), tc.model.active_non_embedding_params());
  }
  gpt::Reporter reporter(world.rank() == 0, c.json, c.progress, c.steps);
  // 6 N + attention per token, N the parameters a token runs through (MoE: its top-k experts).
  const double fpt =
      gpt::flops_per_token(tc.model.active_non_embedding_params(), c.layers, c.hidden, c.seq_len);
  const std::int64_t end = c.stop_at > 0 ? c.stop_at : c.steps;
  // --trace: steps [trace_first, trace_last] (1-based) are recorded (quintet/core/trace.hpp).
  const auto [trace_first, trace_last] = c.traced_steps(start, end);
  gpt::TraceSession tracing(c.trace, trace_first, trace_last, mesh, world.comm(), stream);
  auto take = [](std::optional<quintet::TimedCommunicator>& t) {
    return t ? t->take_stats() : quintet::TimedCommunicator::Stats{};
  };
  reporter.set_start_peak(
      gpu ? static_cast<std::int64_t>(quintet::cuda_allocator_stats(device).peak_bytes)
          : gpt::peak_rss_bytes());
  for (std::int64_t step = start; step < end; ++step) {
    if (saver) saver->check();  // a background save that failed fails this step, on every rank
    gpt::inject_fault(c, step + 1, world.rank());  // --inject-fault (tests only)
    const float lr = gpt::learning_rate(c, step);
    model.set_lr(lr);
    if (gpu) quintet::cuda_reset_peak(device);
    for (auto* t : {&timed_tp, &timed_cp, &timed_ep, &timed_pp}) {
      if (*t) (*t)->reset();  // the window is this step
    }
    tracing.before_step(step + 1);  // one branch unless this step is traced
    const auto t0 = std::chrono::steady_clock::now();
    // One optimizer step: the schedule over the microbatches (without a pipeline, forward and
    // backward of each in turn), the gradient reductions overlapping the last backwards, the
    // (sharded) AdamW update, the loss of the global batch.
    const quintet::pipeline::TrainStepResult r = model.step(loader);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    tracing.after_step(step + 1);
    const quintet::DataParallelStats comm = model.data_parallel_stats();
    const quintet::TimedCommunicator::Stats tp_stats = take(timed_tp);
    const quintet::TimedCommunicator::Stats cp_stats = take(timed_cp);
    const quintet::TimedCommunicator::Stats ep_stats = take(timed_ep);
    const quintet::TimedCommunicator::Stats pp_stats = take(timed_pp);
    const double tp_exposed_ms = tp_stats.exposed_ms;
    const double cp_exposed_ms = cp_stats.exposed_ms;
    const double ep_exposed_ms = ep_stats.exposed_ms;

    gpt::StepRecord rec;
    rec.step = step + 1;
    rec.loss = r.loss;
    rec.entropy_floor = floor;
    rec.lr = lr;
    rec.grad_norm = r.optimizer.grad_norm();
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
    rec.tp_ops = tp_stats.ops;
    rec.cp_comm_ms = cp_exposed_ms;
    rec.ep_comm_ms = ep_exposed_ms;
    rec.exposed_comm_pct =
        100.0 *
        (comm.exposed_ms + tp_exposed_ms + cp_exposed_ms + ep_exposed_ms + pp_stats.exposed_ms) /
        ms;
    rec.comm = {gpt::kind_comm(comm.comm_ms, comm.exposed_ms),
                gpt::kind_comm(tp_stats.comm_ms, tp_stats.exposed_ms),
                gpt::kind_comm(pp_stats.comm_ms, pp_stats.exposed_ms),
                gpt::kind_comm(ep_stats.comm_ms, ep_stats.exposed_ms),
                gpt::kind_comm(cp_stats.comm_ms, cp_stats.exposed_ms)};
    if (gpt::kMoeTrainer) {
      const quintet::expert::MoESummary& moe = model.moe_summary();
      rec.moe = gpt::MoeRecord{moe.min_load,         moe.mean_load, moe.max_load,
                               moe.dropped_fraction, moe.aux_loss,  moe.z_loss};
    }
    reporter.step(rec);

    const bool last = step + 1 == end;
    if (saver && ((c.save_every > 0 && (step + 1) % c.save_every == 0) || last)) {
      using Clock = std::chrono::steady_clock;
      const auto ms_since = [](Clock::time_point t) {
        return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
      };
      const auto s0 = Clock::now();
      saver->wait();  // the previous background save, if still writing
      const double waited = ms_since(s0);
      const auto s1 = Clock::now();
      if (c.async_save) {
        saver->save_async(step + 1, model, loader, gpt::run_metadata(c),
                          gpt::exit_during_save(c, step + 1));
      } else {
        saver->save(step + 1, model, loader, gpt::run_metadata(c),
                    gpt::exit_during_save(c, step + 1));
      }
      reporter.saved(step + 1, c.async_save, ms_since(s1), waited);
    }
  }
  if (saver) saver->wait();  // the last background save, committed before the summary
  reporter.summary(c.bench ? c.bench_skip : 0);
  if (world.config().check_collectives) reporter.checked_collectives(quintet::checked_operations());
  if (world.rank() == 0) tracing.print_report(c.json);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) makes a checkpoint write fail with EFBIG, an error on every
  // rank, instead of killing this rank with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    const quintet::RuntimeConfig runtime = quintet::RuntimeConfig::from_args(argc, argv);
    gpt::TrainConfig config;
    int exit_code = 0;
    if (!gpt::parse_args(runtime, &config, &exit_code)) return exit_code;
    quintet::World world = quintet::init(runtime);
    try {
      return run(config, world);
    } catch (const std::exception& e) {
      // Printed here, inside the World's scope, then passed to the other ranks (whose waits fail
      // with "rank r failed: ..." instead of hanging) before the job ends.
      std::fprintf(stderr, "%s: %s\n", gpt::kProgram, e.what());
      world.fail(e, 2);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", gpt::kProgram, e.what());
    return 2;
  }
}
