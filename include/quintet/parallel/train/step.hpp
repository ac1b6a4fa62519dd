// One training step over the pipeline stages a rank holds (without a pipeline: one stage, the
// whole model), read top to bottom in parallel/train/step.cpp. In order, on one stream:
//   1. the schedule (PipelineExecutor::run) over the step's microbatches with loss_scale =
//      1 / microbatches: each stage's gradient reduction starts after its last backward and
//      overlaps the rest of the schedule;
//   2. finalize_gradients: each stage's data-parallel finish, the sum of the gradients of the
//      embedding tied across the first and the last stage, and every MoE layer's step counters
//      in ONE all-reduce, left in flight (no host synchronisation per layer);
//   3. the global gradient norm, clipping and the (ZeRO-sharded) AdamW update
//      (DistributedOptimizer::step_together);
//   4. the loss of the global batch on every rank: the step's one host synchronisation, which also
//      brings the MoE counters home (the balancing bias moves, the MoE summary is taken).
// Megatron-Core's finalize_model_grads and llm.c's training loop are the models.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/optimizer.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/data_parallel/data_parallel.hpp"
#include "quintet/parallel/data_parallel/distributed_optimizer.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/model/gpt.hpp"
#include "quintet/parallel/pipeline/executor.hpp"

namespace quintet::train {

// One pipeline stage this rank holds.
struct TrainingStage {
  int stage = 0;  // global stage index (0: the embedding; the last: the head and the loss)
  std::unique_ptr<model::GptChunk> chunk;
  std::unique_ptr<nn::ParameterStore> store;
  std::unique_ptr<data_parallel::DataParallel>
      data_parallel;  // the executor's GradientSync for this stage
  std::unique_ptr<data_parallel::DistributedOptimizer>
      optimizer;  // over data_parallel (step() needs it)
};

// One axis's communication during a step, on this rank, in milliseconds.
struct AxisCommunication {
  double comm_ms = 0.0;     // in flight: the union of its operations' intervals, hidden or not
  double exposed_ms = 0.0;  // the time the compute stream (CPU: thread) waited for them
  std::int64_t bytes = 0;   // payload (dp: f32 gradient of the padded buckets reduced)
  std::int64_t ops = 0;     // operations issued (dp: bucket reductions)
  // The part that ran under compute: comm_ms - exposed_ms, exposed cut at comm_ms (two clocks).
  double hidden_ms() const { return comm_ms - (exposed_ms < comm_ms ? exposed_ms : comm_ms); }
};

// What one step did.
struct StepStats {
  // The mean cross-entropy over the global batch's tokens (nats/token), the same on every rank.
  // It does NOT include the MoE auxiliary losses (load balancing, z), which the step trains on
  // but reports apart, in moe.aux_loss and moe.z_loss.
  double loss = 0.0;
  nn::OptimizerStepInfo
      optimizer;  // the global gradient norm (before clipping), the clip, the step
  double grad_norm() const { return optimizer.grad_norm(); }
  // Communication per axis (dp: the gradient reductions, DataParallelStats; tp, cp, ep, pp: the
  // model's collectives, measured by TrainingModel when it times them, else zero).
  AxisCommunication dp, tp, cp, ep, pp;
  // The most gradient storage held at once during the step, in bytes, over this rank's stages
  // (DataParallelStats::peak_gradient_bytes; ZeRO-2: the shards and the buckets in flight).
  std::int64_t peak_gradient_bytes = 0;
  expert::MoESummary moe;  // the whole model's MoE telemetry (layers = 0 for a dense model)
  // Where the step's time went on this rank, in milliseconds (filled by TrainingModel::step, not
  // by step() below; bound_by.hpp makes the verdict of them and the exposed times above).
  struct Time {
    double wall_ms = 0.0;   // host clock, the whole step
    double busy_ms = 0.0;   // CPU: the thread's CPU time; GPU: the stream's span less its waits
    double input_ms = 0.0;  // blocked in the loader's next(); GPU: + the stream's wait for copies
    double host_ms = 0.0;   // GPU: wall_ms outside the stream's span; CPU: 0
  } time;
};

// What finalize_gradients leaves in flight: every MoE layer of this rank's stages and their step
// counters, summed over the stage's ranks in one all-reduce, on the stream's device
// (expert::reduce_step_counters). finish_moe reads them.
struct PendingMoE {
  std::vector<expert::MoELayer*> layers;
  expert::StepCounters counters;
};

// Step 2: after the schedule (executor.run), in order on stream:
//   each stage's DataParallel::finish (the reductions left, waited for on stream);
//   the gradients of a weight tied across the first and the last stage (nn::TiedRole) summed, as
//   the data parallelism left them (DataParallel::reduced_grad: whole, or the owned shard of its
//   own bucket, so both copies own the same elements): over the executor's pipeline communicator
//   between the first and the last stage's ranks (both sides add the other's: the same bits), or
//   in place when one rank holds both (ZB-V); both copies then get the same update;
//   every MoE layer's step counters, in one all-reduce over Axis::tp_dp_cp, not waited for by the
//   host.
// stages: the executor's, in its order (stage indices and each one's DataParallel as its
// GradientSync; InvalidArgument otherwise, before any communication).
PendingMoE finalize_gradients(const pipeline::PipelineExecutor& executor,
                              std::span<TrainingStage> stages, const Mesh& mesh,
                              const Stream& stream);

// After the host has waited for stream: each MoE layer's statistics from its reduced counters
// (moving its balancing bias), combined over pp (collective over Axis::pp).
expert::MoESummary finish_moe(const PendingMoE& moe, const Tensor& host_counters, const Mesh& mesh,
                              const Stream& stream);

// The whole step (1 to 4 above). data(m) is the executor's: called on the ranks of the first and
// last stage, in order. Set the learning rate (DistributedOptimizer::set_lr) before. Collective
// over the mesh; synchronises stream once, to read the loss. Throws InvalidArgument, before any
// communication, unless stages are the executor's, each with an optimizer over its DataParallel.
// Fills loss, optimizer, dp, peak_gradient_bytes and moe.
StepStats step(pipeline::PipelineExecutor& executor, std::span<TrainingStage> stages,
               const Mesh& mesh, const std::function<pipeline::MicrobatchData(int)>& data,
               const Stream& stream);

}  // namespace quintet::train
