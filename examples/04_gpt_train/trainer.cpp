// The loop of 04_gpt_train and 05_moe_train (trainer.hpp): parse into a JobConfig, build, train,
// print.
#include "trainer.hpp"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "metrics.hpp"
#include "quintet/collectives/bootstrap.hpp"             // World, init
#include "quintet/collectives/checked_communicator.hpp"  // --check-collectives' count
#include "quintet/collectives/consistency.hpp"           // the same settings on every rank
#include "quintet/core/allocator.hpp"                    // peak GPU memory
#include "quintet/core/log.hpp"
#include "quintet/data/loader.hpp"     // DataLoader
#include "quintet/data/synthetic.hpp"  // the built-in dataset and its entropy floor
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/train/checkpointer.hpp"    // save and resume in one call
#include "quintet/parallel/train/evaluate.hpp"        // the data, the validation loss
#include "quintet/parallel/train/hf_checkpoint.hpp"   // --init-from-hf
#include "quintet/parallel/train/hf_export.hpp"       // --export-hf
#include "quintet/parallel/train/training_model.hpp"  // this rank's stages, one step
#include "trace_session.hpp"
#include "trainer_state.hpp"

namespace gpt {

namespace {

using quintet::Axis;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void print_header(const char* program, const quintet::train::JobConfig& job,
                  quintet::train::TrainingModel& model, const quintet::Device& device) {
  const quintet::model::GptConfig& m = model.config().model;
  const quintet::ParallelConfig& p = job.parallel;
  fmt::print(
      "{}: {} params ({} non-embedding), {} layers, hidden {}, heads {}, "
      "vocab {}, seq {}{} | tp {}{} x cp {} x dp {} x pp {} ({}, {} chunk{} per rank), ZeRO-{} | "
      "{} | "
      "global batch {} = micro {} x dp {} x accumulation {}\n",
      program, m.total_params(), m.non_embedding_params(), m.layers, m.hidden, m.heads, m.vocab,
      m.seq_len, m.tied_embeddings ? ", tied embeddings" : "", p.tp,
      m.sequence_parallel ? " (+sp)" : "", p.cp, p.dp, p.pp, model.executor().schedule().name,
      p.vpp, p.vpp > 1 ? "s" : "", job.training.zero, device.str(), job.training.global_batch,
      job.training.micro_batch, p.dp, job.accumulation());
  if (m.mlp != quintet::model::MlpKind::moe) return;
  const quintet::expert::RouterConfig& r = m.moe.router;
  fmt::print(
      "  MoE: {} experts, top-{}, {} router, every {} block(s){}, expert width {}, {} shared, "
      "capacity {} | ep {} x etp {} | {} active non-embedding params per token\n",
      r.experts, r.top_k, r.score == quintet::expert::RouterScore::softmax ? "softmax" : "sigmoid",
      m.moe.every,
      m.moe.dense_layers.empty()
          ? std::string()
          : fmt::format(" but {} (dense, width {})",
                        quintet::model::layer_list_text(m.moe.dense_layers), m.mlp_width()),
      m.expert_width(), m.moe.shared_experts,
      r.capacity_factor > 0 ? fmt::format("{}", r.capacity_factor) : std::string("dropless"), p.ep,
      model.mesh().size(Axis::etp), m.active_non_embedding_params());
}

// A refusal every rank makes alike (the same job, checked the same way): printed once, by rank 0.
struct RefusedOnEveryRank : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int run(const char* program, quintet::train::JobConfig job, quintet::World& world) {
  // Before anything that could fail on one rank only: every rank has the same settings (an
  // MPMD launch with different flags is refused, naming the flag, instead of hanging).
  quintet::check_same_on_all_ranks(world.comm(), job.settings(), program);
  try {
    job.validate(world.size());  // the same job on every rank: the same verdict
  } catch (const quintet::Error& e) {
    throw RefusedOnEveryRank(e.what());
  }
  const quintet::Device device = world.device();
  const bool gpu = device.is_cuda();
  job.model.dtype = gpu ? quintet::DType::bf16 : quintet::DType::f32;
  quintet::Stream stream = gpu ? quintet::Stream::create(device) : quintet::Stream();
  // The data first: a --data or --val-data with nothing to read is refused before the mesh.
  quintet::data::TokenDataset dataset = quintet::train::open_training_data(job, world.config());
  std::optional<quintet::data::TokenDataset> val_data;
  if (!job.validation.data.empty()) {
    val_data = quintet::train::open_validation_data(job, world.config());
  }
  quintet::Mesh mesh(quintet::Layout(job.parallel, world.size()), world.comm());
  const std::optional<double> floor = quintet::data::entropy_floor_nats(dataset);
  // This rank's share of the model: its pipeline stages (each a chunk of the library GPT with its
  // parameters, data parallelism and AdamW) and the executor that runs them; it measures each
  // axis's communication.
  quintet::train::TrainingModel model(job, mesh, stream);
  // The loader's batch, sequence and replica come from the model (every tp and pp rank of one
  // replica reads the same batches).
  quintet::data::LoaderConfig lc;
  lc.threads = job.data.loader_threads;
  lc.read_delay_ms = job.data.loader_delay_ms;  // tests only
  lc.seed = job.training.seed;
  quintet::data::DataLoader loader(std::move(dataset), model.loader_config(lc));

  // Checkpoints agree over the CPU communicator (a background save must not share the GPU one).
  quintet::Communicator& ckpt_comm = world.has_cpu_comm() ? world.cpu_comm() : world.comm();
  const quintet::train::JobConfig::Checkpoint& ck = job.checkpoint;
  std::int64_t start = 0;
  bool resumed = false;
  const std::string& resume = ck.resume.empty() ? ck.resume_if_exists : ck.resume;
  if (!resume.empty()) {
    const auto step = checkpointer(job, resume, ckpt_comm).restore(model, loader);
    // Every rank sees the same directory, so every rank throws together.
    QUINTET_CHECK(
        step.has_value() || ck.resume.empty(),
        "--resume {}: {}; use --resume-if-exists to start fresh when there is none", ck.resume,
        std::filesystem::exists(ck.resume) ? "it holds no checkpoint" : "no such directory");
    if (step) {
      start = *step;
      resumed = true;
      if (world.rank() == 0) quintet::log::info("resumed from {} at step {}", resume, start);
    }
  }
  // --init-from-hf (its config.json made the model already, parse_job_args): the weights, each
  // rank reading its own shards; a resumed run has its own.
  if (!resumed && !ck.init_from_hf.empty()) {
    quintet::train::load_hf_weights(quintet::train::read_hf_config(ck.init_from_hf), model,
                                    ckpt_comm);
    if (world.rank() == 0) quintet::log::info("initialized from {}", ck.init_from_hf);
  }
  // --val-data: its windows, read ahead from now on.
  std::optional<quintet::train::Validation> validation;
  if (val_data) {
    validation.emplace(std::move(*val_data), model, job.validation.batches,
                       job.data.loader_threads);
  }
  std::optional<quintet::train::Checkpointer> saver;
  if (!ck.save.empty()) saver.emplace(checkpointer(job, ck.save, ckpt_comm));
  // The pinned buffers of --async-save now, not at the first save (seconds for a large model).
  if (saver && ck.async_save) saver->prepare_async(model, loader);

  const quintet::train::JobConfig::Observe& out = job.observe;
  if (world.rank() == 0 && !out.json) print_header(program, job, model, device);
  Reporter reporter(world.rank() == 0, out.json, out.progress, job.training.steps);
  if (job.validation.eval_only) {  // the model as restored, evaluated; nothing else
    reporter.validation(start, validation->run(model));
    return 0;
  }
  // 6 N + attention per token, N the parameters a token runs through (MoE: its top-k experts).
  const quintet::model::GptConfig& m = model.config().model;
  reporter.set_params(m.total_params(), m.non_embedding_params());
  const double fpt =
      flops_per_token(m.active_non_embedding_params(), m.layers, m.hidden, m.seq_len);
  const std::int64_t end = job.last_step();
  // --trace: steps [trace_first, trace_last] (1-based) are recorded (quintet/core/trace.hpp).
  const auto [trace_first, trace_last] = job.traced_steps(start, end);
  TraceSession tracing(out.trace, trace_first, trace_last, mesh, world.comm(), stream);
  const quintet::nn::LrSchedule schedule = job.learning_rate_schedule();
  reporter.set_start_peak(
      gpu ? static_cast<std::int64_t>(quintet::cuda_allocator_stats(device).peak_bytes)
          : peak_rss_bytes());
  for (std::int64_t step = start; step < end; ++step) {
    if (saver) saver->check();  // a background save that failed fails this step, on every rank
    inject_fault(job, step + 1, world.rank());  // --inject-fault (tests only)
    const float lr = schedule.at(step);
    model.set_lr(lr);
    if (gpu) quintet::cuda_reset_peak(device);
    tracing.before_step(step + 1);  // one branch unless this step is traced
    const auto t0 = Clock::now();
    // One optimizer step: the schedule over the microbatches (without a pipeline, forward and
    // backward of each in turn), the gradients finished (reductions overlapping the last
    // backwards), the (sharded) AdamW update, the loss of the global batch; and what it cost.
    const quintet::train::StepStats r = model.step(loader);
    const double ms = ms_since(t0);
    tracing.after_step(step + 1);

    StepRecord rec = step_record(step + 1, r, lr, ms, job.tokens_per_step(),
                                 m.mlp == quintet::model::MlpKind::moe);
    rec.entropy_floor = floor;
    if (gpu) {
      const double flops_per_gpu = rec.tokens_per_s * fpt / world.size();
      rec.tflops = flops_per_gpu / 1e12;
      rec.mfu = flops_per_gpu / kPeakFlopsPerGpu;
      rec.peak_mem_bytes =
          static_cast<std::int64_t>(quintet::cuda_allocator_stats(device).peak_bytes);
    } else {
      rec.peak_mem_bytes = peak_rss_bytes();
    }
    reporter.step(rec);

    const bool last = step + 1 == end;
    if (job.evaluates_after(step + 1)) reporter.validation(step + 1, validation->run(model));
    if (saver && ((ck.save_every > 0 && (step + 1) % ck.save_every == 0) || last)) {
      const auto s0 = Clock::now();
      saver->wait();  // the previous background save, if still writing
      const double waited = ms_since(s0);
      const auto s1 = Clock::now();
      if (ck.async_save) {
        saver->save_async(step + 1, model, loader, run_metadata(job),
                          exit_during_save(job, step + 1));
      } else {
        saver->save(step + 1, model, loader, run_metadata(job), exit_during_save(job, step + 1));
      }
      reporter.saved(step + 1, ck.async_save, ms_since(s1), waited);
    }
    // --export-hf (at the end) and --export-hf-every: the model as a Hugging Face directory,
    // each rank writing its own pieces and its share of the files.
    if (job.exports_hf_at(step + 1)) {
      const auto e0 = Clock::now();
      const std::string dir = job.hf_export_dir(step + 1);
      std::error_code ec;  // --export-hf-every: DIR holds one directory per export (made here;
      // a failure shows as export_hf's refusal of the parent, on every rank alike)
      if (ck.export_hf_every > 0) std::filesystem::create_directories(ck.export_hf, ec);
      quintet::train::export_hf(dir, model, ckpt_comm, hf_export_options(job));
      if (world.rank() == 0)
        quintet::log::info("exported step {} to {} ({:.0f} ms)", step + 1, dir, ms_since(e0));
    }
  }
  if (saver) saver->wait();  // the last background save, committed before the summary
  reporter.summary(out.bench ? out.bench_skip : 0);
  if (world.config().check_collectives) reporter.checked_collectives(quintet::checked_operations());
  if (world.rank() == 0) tracing.print_report(out.json);
  return 0;
}

}  // namespace

int train_main(int argc, char** argv, const Trainer& trainer) {
  // A file-size limit (ulimit -f) makes a checkpoint write fail with EFBIG, an error on every
  // rank, instead of killing this rank with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    const quintet::RuntimeConfig runtime = quintet::RuntimeConfig::from_args(argc, argv);
    quintet::train::JobConfig job = trainer.defaults;
    if (auto exit = quintet::train::parse_job_args(runtime, trainer.description, &job)) {
      return *exit;
    }
    install_checkpoint_fault(runtime);  // tests only
    quintet::World world = quintet::init(runtime);
    try {
      return run(trainer.program, std::move(job), world);
    } catch (const RefusedOnEveryRank& e) {
      // Every rank exits with it, no rank waits for another: no need to pass it on.
      if (world.rank() == 0) std::fprintf(stderr, "%s: %s\n", trainer.program, e.what());
      return 2;
    } catch (const std::exception& e) {
      // Printed here, inside the World's scope, then passed to the other ranks (whose waits fail
      // with "rank r failed: ..." instead of hanging) before the job ends.
      std::fprintf(stderr, "%s: %s\n", trainer.program, e.what());
      world.fail(e, 2);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", trainer.program, e.what());
    return 2;
  }
}

}  // namespace gpt
