// train_step: one optimizer step of a model held as pipeline stages (without a pipeline: one
// stage), the part of a training loop every trainer writes the same way
// (parallel/pipeline/train_step.cpp). In order, on stream:
//   1. executor.run over the schedule's microbatches with loss_scale = 1 / microbatches: each
//      stage's DataParallel begins and finishes inside (reductions overlapped with the last
//      backwards), tied embedding gradients are summed;
//   2. DistributedOptimizer::step_together over optimizers: one global gradient norm over the
//      whole job, clipping, the (sharded) AdamW update;
//   3. the loss of the global batch, on every rank: the last stage's sum over its microbatches,
//      summed over Axis::pp and averaged over Axis::dp_cp (one value per step, no hand-written
//      collective in the trainer).
// data(m) is the executor's: called on the ranks of the first and last stage, in order. Set the
// learning rate (DistributedOptimizer::set_lr, e.g. from an nn::LrSchedule) before the call.
// Collective over the mesh; synchronises stream to read the loss.
#pragma once

#include <functional>
#include <span>

#include "quintet/core/stream.hpp"
#include "quintet/nn/optimizer.hpp"
#include "quintet/parallel/data/distributed_optimizer.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/pipeline/executor.hpp"

namespace quintet::pipeline {

struct TrainStepResult {
  // The language-model loss (cross-entropy), the mean over the global batch's microbatches, on
  // every rank. An MoE model's aux and z losses are not in it: they only add their gradients in
  // backward (TrainingModel::moe_summary reports their values).
  double loss = 0.0;
  nn::OptimizerStepInfo optimizer;  // the global gradient norm, the clip scale, the step
};

// Throws InvalidArgument, before any communication, unless there is one optimizer per stage the
// executor holds, each over that stage's DataParallel.
TrainStepResult train_step(PipelineExecutor& executor,
                           std::span<DistributedOptimizer* const> optimizers, const Mesh& mesh,
                           const std::function<MicrobatchData(int microbatch)>& data,
                           const Stream& stream);

}  // namespace quintet::pipeline
