// TrainingModel: this rank's share of the library GPT, ready to train under any layout of the five
// dimensions, tp (+ sp) x cp x ep (x etp) x dp x pp with vpp and ZeRO
// (parallel/train/training_model.cpp). It builds what every trainer builds the same way:
// the pipeline stages this rank holds (for each, its chunk of the model, the chunk's parameters,
// their data parallelism and their AdamW), and the pipeline executor that runs them. Without a
// pipeline it holds one stage, the whole model.
//
//   quintet::train::TrainingConfig config;
//   config.model = {.layers = 4, .hidden = 256, .heads = 8, .vocab = 512, .seq_len = 128};
//   config.micro_batch = 4;
//   config.microbatches = 2;                         // gradient accumulation
//   quintet::train::TrainingModel model(config, mesh, stream);
//   quintet::data::DataLoader loader(dataset, model.loader_config(base));
//   for (step ...) {
//     model.set_lr(schedule.at(step));
//     const train::StepStats r = model.step(loader); // r.loss: the global batch's mean loss
//   }
//
// A trainer with flags builds it from a JobConfig (job_config.hpp) instead:
//   train::TrainingModel model(job, mesh, stream);   // TrainingConfig::from_job(job)
//
// One step (step()) is train::step (step.hpp, read top to bottom in parallel/train/step.cpp): the
// schedule over the step's microbatches with each stage's gradient reduction overlapped, the
// gradients finished (data parallelism, tied embeddings, MoE counters), one global gradient norm
// and the clipped (ZeRO-sharded) AdamW update, and the loss of the global batch on every rank; it
// returns one StepStats (loss, gradient norm, communication per axis, MoE summary, and the step's
// time: wall, busy, input, host; StepStats::time, for the verdict of bound_by.hpp). The parts
// stay reachable (stages(), executor()) for trainers that want to drive them themselves.
//
// Every check happens in the constructor, before any communication: the model config against tp,
// the layers against pp x vpp, the schedule against pp, vpp and microbatches, the data-parallel
// and optimizer configs, a sequence that sequence parallelism cannot split.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/data/loader.hpp"
#include "quintet/nn/optimizer.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/data_parallel/data_parallel.hpp"
#include "quintet/parallel/data_parallel/distributed_optimizer.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/model/gpt.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/overlap/timed_communicator.hpp"
#include "quintet/parallel/pipeline/executor.hpp"
#include "quintet/parallel/pipeline/schedule.hpp"
#include "quintet/parallel/train/job_config.hpp"
#include "quintet/parallel/train/step.hpp"

namespace quintet::train {

struct TrainingConfig {
  model::GptConfig model;        // the whole model; microbatches are [micro_batch, seq_len]
  std::int64_t micro_batch = 1;  // sequences per microbatch on each replica
  int microbatches = 1;          // per optimizer step on each replica (gradient accumulation)
  // The pipeline (used when the mesh has pp > 1; with pp = 1 the microbatches run in turn).
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::one_f_one_b;
  int vpp = 1;                           // stages per pipeline rank (interleaved: >= 2, zb-v: 2)
  pipeline::ActionCosts schedule_costs;  // what the schedule is planned for (schedule.hpp)
  data_parallel::DataParallelConfig data_parallel;  // buckets, overlap, ZeRO stage
  nn::AdamWConfig optimizer;  // AdamW and clipping by the global gradient norm
  std::uint64_t seed = 0;     // the parameters' init draw (the same for any layout)
  // Debug: before each microbatch is used, check that the stage's tp ranks hold the same tokens
  // (check_same_batch, loader_for_mesh.hpp). One small all-gather per microbatch.
  bool check_batches = false;
  // Measure each step's tp, cp, ep and pp communication (StepStats): the model's collectives on
  // those axes (of more than one rank) go through a TimedCommunicator (Measure::from_wait), whose
  // results are the inner communicator's.
  bool measure_communication = true;

  // Sequences of the global batch: micro_batch x microbatches x dp.
  std::int64_t global_batch(const Mesh& mesh) const;

  // The recipe of a job (JobConfig::validate first): its model (gpt_config()), batch, schedule,
  // data parallelism, optimizer and seed.
  static TrainingConfig from_job(const JobConfig& job);
};

// Communicators the model uses instead of the mesh's, one per axis; null means mesh.comm(axis).
// Pass a wrapper of the mesh's to see every collective of that axis (measure_communication wraps
// it in turn). Not owned; they must outlive the model.
struct ModelCommunicators {
  Communicator* tp = nullptr;  // the tp layers and the loss
  // With cp > 1 every rank of a replica reads whole sequences and keeps its 2 chunks of each
  // (context::cp_split); attention spans the cp ranks as model.context_parallel says.
  Communicator* cp = nullptr;
  Communicator* ep = nullptr;  // the MoE blocks' token exchanges
  Communicator* pp = nullptr;  // the pipeline's stage-to-stage transfers
};

class TrainingModel {
 public:
  // Builds this rank's stages on stream's device (the mesh's communicators must be there too);
  // every step runs on stream. The mesh, and a CUDA stream's queue, must outlive the model (it
  // keeps a view of the stream, so a temporary Stream() for the CPU is fine).
  // Collective over the mesh only in what DataParallel and DistributedOptimizer do; throws
  // InvalidArgument, before any communication, for any bad value above (naming the field) and
  // for a communicator in comms whose size is not its axis's.
  TrainingModel(const TrainingConfig& config, Mesh& mesh, const Stream& stream,
                const ModelCommunicators& comms = {});
  // The same for a job (TrainingConfig::from_job); the mesh is the job's layout
  // (Mesh(Layout(job.parallel, world), comm)).
  TrainingModel(const JobConfig& job, Mesh& mesh, const Stream& stream,
                const ModelCommunicators& comms = {});
  ~TrainingModel();
  TrainingModel(const TrainingModel&) = delete;
  TrainingModel& operator=(const TrainingModel&) = delete;

  // base with what the model fixes filled in: batch_size = micro_batch, seq_len = the model's,
  // device = the stream's, and the replica from the mesh (loader_config_for). The rest (the
  // seed, threads, start) stays the caller's.
  data::LoaderConfig loader_config(data::LoaderConfig base) const;

  // One optimizer step whose microbatches come from loader (read on the ranks of the first and
  // last stage, in order). Throws InvalidArgument, before any communication, when the loader's
  // batch size, sequence length or replica (dp rank and size) is not this model's: tp or pp
  // ranks of one replica reading different data is refused, not trained on.
  StepStats step(data::DataLoader& loader);
  // The same with the microbatches from data(m) (the executor's contract, executor.hpp): whole
  // sequences [micro_batch, seq_len], of which each cp rank keeps its part.
  StepStats step(const std::function<pipeline::MicrobatchData(int)>& data);

  // The mean cross-entropy of `batches` global batches from loader (each microbatches
  // microbatches per replica, as a step reads), by the forward passes alone (train::evaluate,
  // evaluate.hpp): no gradient, no optimizer step, no MoE statistic; nothing of the model
  // changes. The same on every rank. The loader's checks are step()'s; collective over the mesh.
  double evaluate(data::DataLoader& loader, std::int64_t batches);

  // The learning rate of the next step (e.g. from an nn::LrSchedule), for every stage.
  void set_lr(float lr);
  // Steps taken (restored ones included).
  std::int64_t steps() const;

  const TrainingConfig& config() const { return config_; }
  Mesh& mesh() const { return mesh_; }
  const Stream& stream() const { return stream_; }
  std::span<TrainingStage> stages() { return stages_; }
  std::span<const TrainingStage> stages() const { return stages_; }
  pipeline::PipelineExecutor& executor() { return *executor_; }

 private:
  // This cp rank's chunks of d's sequences (d itself without context parallelism).
  pipeline::MicrobatchData local_part(pipeline::MicrobatchData d) const;
  // Throws InvalidArgument unless loader reads this model's batches for this rank's replica.
  void check_loader(const data::DataLoader& loader, const char* who) const;
  // loader's next batch, on the stream, this cp rank's part of it (tp ranks checked alike with
  // check_batches).
  pipeline::MicrobatchData next_microbatch(data::DataLoader& loader);

  TrainingConfig config_;
  ModelCommunicators comms_;
  Mesh& mesh_;
  Stream stream_;  // a view of the caller's stream (same device and queue)
  std::vector<TrainingStage> stages_;
  std::vector<data_parallel::DistributedOptimizer*> optimizers_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  // measure_communication: the timing wrappers of tp, cp, ep and pp (axes of more than one rank).
  std::optional<overlap::TimedCommunicator> timed_tp_, timed_cp_, timed_ep_, timed_pp_;
  // GPU: timing events of the step's span on the stream, and around each batch's copy wait
  // (StepStats::time).
  Event span_start_, span_end_;
  std::vector<std::pair<Event, Event>> input_marks_;
};

}  // namespace quintet::train
