// PipelineExecutor: runs one rank's part of a pipeline Schedule (schedule.hpp) over the model
// chunks of the stages it holds, on the pipeline communicator (parallel/pipeline/executor.cpp).
//
// Per step, it walks the rank's actions in order on one stream:
//   F   the stage's forward on a fresh nn::Context for (stage, microbatch); the first stage's input
//       is the microbatch's tokens, the last stage's chunk ends in its loss (ctx.set_targets with
//       the microbatch's targets and loss_scale), whose value is summed, times loss_scale, into
//       the step's loss;
//   B   its backward (d(loss) = loss_scale on the last stage); I the same with the weight
//       gradients deferred on the context (nn::Context::set_defer_weight_gradients), W runs them;
//       the context (the saved activations) is freed after B or W;
//   SF/RF/SB/RB  consecutive transfers are issued as one batched p2p (Communicator::p2p) without
//       waiting, receives into buffers of the activation shape; a compute action waits (Work::wait
//       on the stream) for the receive it consumes, so transfers overlap the compute in between.
// Between two stages on the same rank the tensor is handed over directly. At the end of the step
// it waits for every transfer it issued.
//
// Gradient synchronisation: give each stage the nn::GradientSync over its chunk's gradients (a
// DataParallel, one per chunk's ParameterStore). run() begins their step (begin_step, which zeroes
// the gradients) and tells each which backward is its stage's last gradient-marking action of the
// step (set_last_microbatch), so that stage's reduction starts right after it, overlapping the rest
// of the schedule. run() does not finish them: the step does, after run() returns
// (train::finalize_gradients: the syncs' finish, then the sum of the gradients of a weight tied
// across the first and the last stage). Without a GradientSync the caller zeroes the gradients
// before run(); they accumulate over the step's microbatches.
//
// Errors: the constructor checks the schedule (check_schedule: structure, then a simulated run, so
// a schedule that would deadlock is an InvalidArgument naming the rank and action), that the stages
// given are exactly this rank's, and the communicator's size, before any communication. Not
// thread-safe; the chunks, gradient syncs and communicator are borrowed and must outlive it.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/gradient_sync.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/pipeline/schedule.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"  // TimedAction

namespace quintet::pipeline {

// One stage this rank holds.
struct StageModule {
  int stage = 0;                     // global stage index
  nn::Module* chunk = nullptr;       // stage 0: takes tokens; the last stage: returns the loss
  nn::GradientSync* sync = nullptr;  // optional: the gradient reduction over this chunk's store
};

// One microbatch's data: tokens [B, S] (read by the first stage), targets [B, S] (the last).
struct MicrobatchData {
  Tensor tokens;
  Tensor targets;
};

struct ExecutorConfig {
  // What travels between stages: the activations [B, S(/tp with sequence parallelism), d] and
  // their gradients, in this dtype (the model's compute dtype).
  Shape activation_shape;
  DType activation_dtype = DType::f32;
  // Record when each compute action of a step ran (ExecutorStats::timeline), by the host clock.
  // On a GPU the stream is synchronised before and after each compute action so the host clock
  // sees the device's work; that serialises launch and execution, so it is for measuring only.
  bool record_timeline = false;
};

// What the last run() did on this rank, measured.
struct ExecutorStats {
  double step_ms = 0.0;  // run(), from its call to its return
  // With record_timeline: this rank's compute actions (F, B, I, W) in the order they ran, start
  // and end in ms from the call of run(); a compute action starts after the receive it consumes
  // has completed, so the gaps are the rank's idle time.
  std::vector<TimedAction> timeline;
  double busy_ms = 0.0;    // the sum of the timeline's durations (0 without it)
  int peak_in_flight = 0;  // most (stage, microbatch) activations held at once (from F to B or W)
};

class PipelineExecutor {
 public:
  // pp: this rank's pipeline communicator (size schedule.pp, rank = pipeline rank); stages: one
  // entry per stage in schedule.stages_of(pp.rank()), in any order.
  PipelineExecutor(Schedule schedule, Communicator& pp, std::vector<StageModule> stages,
                   ExecutorConfig config);
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  // One step's schedule on stream, beginning the stages' gradient syncs (above).
  // data(m) is called once per microbatch m, in increasing order, on a rank that holds the first
  // or the last stage (never elsewhere). Returns the sum over microbatches of loss * loss_scale (a
  // scalar f32 on stream's device) on the rank holding the last stage, an undefined tensor on the
  // others. Every rank of the pipeline must call it. Afterwards every transfer has completed and
  // each stage's gradients are accumulated (their syncs' reductions possibly still in flight).
  Tensor run(const std::function<MicrobatchData(int microbatch)>& data, float loss_scale,
             const Stream& stream);

  // The forward passes alone, for evaluation (train::evaluate): `microbatches` (any number >= 1,
  // not the schedule's) through this rank's stages, each on a forward-only nn::Context (nothing
  // saved, no per-step statistics), no gradient sync begun. Every rank walks one global order of
  // blocks, (group of pp microbatches, stage), so the ranks of a pipeline work on a group
  // together: a block's receives are posted (one p2p each) before its first forward, which waits
  // for its own alone, and each output is sent (one p2p) without waiting, at most 2 pp sends in
  // flight. Every rank thus posts its transfers in the blocks' order, which is the same at both
  // ends of each, so none waits on a transfer its peer has not posted (deadlock-free for any
  // placement, interleaved and V included). data(m) as in run(), once per microbatch in
  // increasing order, on the ranks of the first and the last stage. Returns the sum over the
  // microbatches of the loss (a scalar f32 on stream's device) on the rank holding the last
  // stage, an undefined tensor on the others. Every rank of the pipeline must call it with the
  // same microbatches.
  Tensor forward(int microbatches, const std::function<MicrobatchData(int microbatch)>& data,
                 const Stream& stream);

  const Schedule& schedule() const { return schedule_; }
  const std::vector<StageModule>& stages() const { return stages_; }
  const ExecutorStats& last_step_stats() const { return stats_; }
  // The pipeline communicator the stages' transfers go over.
  Communicator& communicator() const { return *pp_; }
  // Whether this rank holds stage.
  bool local_stage(int stage) const;

 private:
  struct Slot;
  const StageModule& stage_module(int stage) const;

  Schedule schedule_;
  Communicator* pp_;
  std::vector<StageModule> stages_;
  ExecutorConfig config_;
  int rank_ = 0;
  std::vector<std::size_t> last_marking_;  // per stage held: index of its last B or W
  ExecutorStats stats_;
};

}  // namespace quintet::pipeline
