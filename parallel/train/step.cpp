// One training step over a rank's pipeline stages, top to bottom (see step.hpp).
#include "quintet/parallel/train/step.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/core/trace.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/tensor_parallel/fp8.hpp"

namespace quintet::train {

namespace {

// stages must be the executor's, in its order, each stage's DataParallel its GradientSync.
void check_stages(const pipeline::PipelineExecutor& executor, std::span<TrainingStage> stages,
                  const char* who) {
  const std::vector<pipeline::StageModule>& run = executor.stages();
  QUINTET_CHECK(stages.size() == run.size(),
                "{}: {} stages given for the {} stages the executor runs on this rank; give the "
                "stages the executor was built over",
                who, stages.size(), run.size());
  for (std::size_t i = 0; i < run.size(); ++i) {
    const TrainingStage& s = stages[i];
    QUINTET_CHECK(s.stage == run[i].stage && s.chunk.get() == run[i].chunk &&
                      s.data_parallel.get() == run[i].sync,
                  "{}: stage {} is not the executor's stage {} (its chunk and DataParallel); "
                  "give the stages the executor was built over, in its order",
                  who, s.stage, run[i].stage);
  }
}

// A tied weight's copies on this rank's stage `stage`, by name (the same order on both ends).
std::vector<std::pair<nn::Parameter*, data_parallel::DataParallel*>> tied_of(
    std::span<TrainingStage> stages, int stage) {
  std::vector<std::pair<std::string, std::pair<nn::Parameter*, data_parallel::DataParallel*>>>
      named;
  for (TrainingStage& s : stages) {
    if (s.stage != stage) continue;
    for (auto& [name, p] : s.chunk->named_parameters()) {
      if (p->attributes().tied != nn::TiedRole::none) {
        named.push_back({name, {p, s.data_parallel.get()}});
      }
    }
  }
  std::sort(named.begin(), named.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<nn::Parameter*, data_parallel::DataParallel*>> out;
  for (auto& n : named) out.push_back(n.second);
  return out;
}

// The reduced gradient of a tied weight as its stage's data parallelism left it.
Tensor tied_gradient(const std::pair<nn::Parameter*, data_parallel::DataParallel*>& t) {
  return t.second != nullptr ? t.second->reduced_grad(*t.first) : t.first->grad();
}

// The gradients of the weights tied across the first and the last stage, summed (step.hpp).
void sum_tied_gradients(const pipeline::PipelineExecutor& executor, std::span<TrainingStage> stages,
                        const Stream& stream) {
  const pipeline::Schedule& schedule = executor.schedule();
  const int last = schedule.num_stages() - 1;
  if (last == 0) return;
  const bool first_here = executor.local_stage(0), last_here = executor.local_stage(last);
  if (!first_here && !last_here) return;
  const auto first = tied_of(stages, 0), second = tied_of(stages, last);
  if (first_here && last_here) {  // both copies here (ZB-V): add in place
    QUINTET_CHECK(first.size() == second.size(),
                  "finalize_gradients: the first stage holds {} tied weights, the last {}; a "
                  "tied weight needs its copy in the other",
                  first.size(), second.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
      Tensor a = tied_gradient(first[i]), b = tied_gradient(second[i]);
      nn::add_(a, b, 1.0f, stream);
      b.copy_(a, stream);
    }
    return;
  }
  const auto& mine = first_here ? first : second;
  if (mine.empty()) return;
  const int peer = schedule.stage_rank[static_cast<std::size_t>(first_here ? last : 0)];
  // Both sides send theirs and add the other's: a + b on one, b + a on the other, the same bits.
  std::vector<Tensor> grads, theirs;
  std::vector<P2POp> ops;
  for (const auto& t : mine) {
    grads.push_back(tied_gradient(t));
    theirs.push_back(
        Tensor::empty(grads.back().shape(), grads.back().dtype(), stream.device(), stream));
    ops.push_back(P2POp::send(grads.back(), peer));
    ops.push_back(P2POp::recv(theirs.back(), peer));
  }
  executor.communicator().p2p(ops, stream).wait(stream);
  for (std::size_t i = 0; i < grads.size(); ++i) nn::add_(grads[i], theirs[i], 1.0f, stream);
}

}  // namespace

PendingMoE finalize_gradients(const pipeline::PipelineExecutor& executor,
                              std::span<TrainingStage> stages, const Mesh& mesh,
                              const Stream& stream) {
  check_stages(executor, stages, "finalize_gradients");
  // The data-parallel reductions: what backward did not start, then wait for all of it.
  for (TrainingStage& s : stages) {
    if (s.data_parallel) s.data_parallel->finish(stream);
  }
  // The embedding tied across the first and the last stage: one gradient, summed.
  sum_tied_gradients(executor, stages, stream);
  // Every MoE layer's step counters (load, drops, aux and z losses) in one all-reduce over the
  // stage's ranks, read after the step's one host synchronisation.
  PendingMoE moe;
  for (TrainingStage& s : stages) {
    const auto& layers = s.chunk->moe_layers();
    moe.layers.insert(moe.layers.end(), layers.begin(), layers.end());
  }
  if (!moe.layers.empty()) {
    moe.counters = expert::reduce_step_counters(moe.layers, mesh.comm(Axis::tp_dp_cp), stream);
  }
  return moe;
}

expert::MoESummary finish_moe(const PendingMoE& moe, const Tensor& host_counters, const Mesh& mesh,
                              const Stream& stream) {
  std::vector<expert::MoEStats> layers;
  if (!moe.layers.empty()) {
    layers = expert::finish_steps(moe.layers, host_counters, mesh.comm(Axis::tp_dp_cp), stream);
  }
  return expert::summarize(layers, mesh.comm(Axis::pp), stream);
}

StepStats step(pipeline::PipelineExecutor& executor, std::span<TrainingStage> stages,
               const Mesh& mesh, const std::function<pipeline::MicrobatchData(int)>& data,
               const Stream& stream) {
  check_stages(executor, stages, "train::step");
  std::vector<data_parallel::DistributedOptimizer*> optimizers;
  for (TrainingStage& s : stages) {
    QUINTET_CHECK(s.optimizer != nullptr && &s.optimizer->data_parallel() == s.data_parallel.get(),
                  "train::step: stage {} has no optimizer over its DataParallel; build each "
                  "stage's DistributedOptimizer over the DataParallel given to the executor",
                  s.stage);
    optimizers.push_back(s.optimizer.get());
  }
  StepStats out;

  // 1. The schedule: every microbatch's forward and backward, reductions started as they fill.
  const float scale = 1.0f / static_cast<float>(executor.schedule().microbatches);
  Tensor loss = executor.run(data, scale, stream);

  // 2. The gradients finished: data parallelism, tied embeddings, MoE counters.
  const PendingMoE moe = finalize_gradients(executor, stages, mesh, stream);
  // FP8 scaling's step ends: delayed scaling's amaxes, the max over the step's microbatches,
  // reduced over the stage's ranks (one unsharded rank would have seen all of those tensors)
  // into the histories that scale the next step.
  {
    std::vector<nn::Fp8TensorScale*> fp8;
    for (TrainingStage& s : stages) {
      for (auto& [name, f] : s.chunk->named_fp8_scales()) fp8.push_back(f);
    }
    if (!fp8.empty()) tensor_parallel::fp8_end_step(fp8, {&mesh.comm(Axis::tp_dp_cp)}, stream);
  }

  // 3. The global norm, clipping, the (sharded) AdamW update.
  {
    const trace::Range range(trace::TraceKind::compute, "optimizer step", stream);
    out.optimizer = data_parallel::DistributedOptimizer::step_together(optimizers, stream);
  }

  // 4. The loss: the last stage's sum (every tp rank the same) to every stage, then the mean over
  // replicas; each cp rank's loss is the mean over its (equal) part of the tokens, so the mean is
  // over dp x cp. Read with the MoE counters in the step's one host synchronisation.
  if (!loss.defined()) {
    loss = Tensor::empty({}, DType::f32, stream.device(), stream);
    loss.fill_(0.0, stream);
  }
  if (mesh.size(Axis::pp) > 1)
    mesh.comm(Axis::pp).all_reduce(loss, ReduceOp::sum, stream).wait(stream);
  mesh.comm(Axis::dp_cp).all_reduce(loss, ReduceOp::avg, stream).wait(stream);
  const Tensor host_loss = loss.to(Device::cpu(), stream);
  const Tensor host_moe =
      moe.counters.summed.defined() ? moe.counters.summed.to(Device::cpu(), stream) : Tensor();
  stream.synchronize();
  out.loss = host_loss.item();
  // (A dense model has no MoE summary; a pipeline stage without MoE layers of an MoE model joins
  // the others' over pp.)
  if (stages.front().chunk->config().mlp == model::MlpKind::moe) {
    out.moe = finish_moe(moe, host_moe, mesh, stream);
  }

  // What the step's gradient reductions cost (measured; the stream is past them).
  for (const TrainingStage& s : stages) {
    const data_parallel::DataParallelStats one = s.data_parallel->last_step_stats();
    out.dp.comm_ms += one.comm_ms;
    out.dp.exposed_ms += one.exposed_ms;
    out.dp.bytes += one.bytes;
    out.dp.ops += one.buckets;
    out.peak_gradient_bytes += one.peak_gradient_bytes;
  }
  return out;
}

}  // namespace quintet::train
