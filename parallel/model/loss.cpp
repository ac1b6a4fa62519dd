// The vocabulary-parallel cross-entropy as the last stage of a model.
#include "quintet/parallel/model/loss.hpp"

namespace quintet::model {

VocabParallelLoss::VocabParallelLoss(Communicator& tp, std::int64_t vocab,
                                     std::int64_t ignore_index)
    : ce_(tp, vocab, ignore_index) {}

Tensor VocabParallelLoss::forward(nn::Context& ctx, const Tensor& logits_shard) {
  const Tensor& targets = ctx.targets();
  nn::CrossEntropyOutput out = ce_.forward(logits_shard, targets, ctx.stream());
  ctx.save(*this, {logits_shard, targets, out.lse, out.valid_count});
  return out.loss;
}

Tensor VocabParallelLoss::backward(nn::Context& ctx, const Tensor& dy) {
  QUINTET_CHECK(!dy.defined(),
                "VocabParallelLoss::backward: the loss is the end of the model, so its backward "
                "takes an undefined tensor (got {}); scale the loss's gradient with "
                "ctx.set_targets(targets, loss_scale)",
                shape_str(dy.shape()));
  const auto saved = ctx.take(*this);
  nn::CrossEntropyOutput out;
  out.lse = saved[2];
  out.valid_count = saved[3];
  return ce_.backward(saved[0], saved[1], out, ctx.loss_scale(), ctx.stream());
}

}  // namespace quintet::model
