// One optimizer step over a rank's pipeline stages (see train_step.hpp).
#include "quintet/parallel/pipeline/train_step.hpp"

#include <algorithm>

#include "quintet/core/error.hpp"
#include "quintet/core/trace.hpp"

namespace quintet::pipeline {

TrainStepResult train_step(PipelineExecutor& executor,
                           std::span<DistributedOptimizer* const> optimizers, const Mesh& mesh,
                           const std::function<MicrobatchData(int)>& data, const Stream& stream) {
  const std::vector<StageModule>& stages = executor.stages();
  QUINTET_CHECK(optimizers.size() == stages.size(),
                "train_step: {} optimizers for the {} stages this rank holds; give one "
                "DistributedOptimizer per stage",
                optimizers.size(), stages.size());
  for (const StageModule& s : stages) {
    const bool found = std::any_of(optimizers.begin(), optimizers.end(), [&](const auto* o) {
      return o != nullptr && s.dp != nullptr && &o->data_parallel() == s.dp;
    });
    QUINTET_CHECK(found,
                  "train_step: stage {} has no optimizer over its DataParallel; build each "
                  "stage's DistributedOptimizer over the DataParallel given to the executor",
                  s.stage);
  }
  const float scale = 1.0f / static_cast<float>(executor.schedule().microbatches);
  Tensor loss = executor.run(data, scale, stream);
  TrainStepResult out;
  {
    const trace::Range range(trace::TraceKind::compute, "optimizer step", stream);
    out.optimizer = DistributedOptimizer::step_together(optimizers, stream);
  }
  // The last stage's sum (every tp rank the same) to every stage, then the mean over replicas.
  if (!loss.defined()) {
    loss = Tensor::empty({}, DType::f32, stream.device(), stream);
    loss.fill_(0.0, stream);
  }
  if (mesh.size(Axis::pp) > 1)
    mesh.comm(Axis::pp).all_reduce(loss, ReduceOp::sum, stream).wait(stream);
  // Each cp rank's loss is the mean over its (equal) part of the tokens: the mean over dp x cp.
  mesh.comm(Axis::dp_cp).all_reduce(loss, ReduceOp::avg, stream).wait(stream);
  const Tensor host = loss.to(Device::cpu(), stream);
  stream.synchronize();
  out.loss = host.item();
  return out;
}

}  // namespace quintet::pipeline
