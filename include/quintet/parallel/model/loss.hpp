// The loss as a stage of the model (parallel/model/loss.cpp): the vocabulary-parallel
// cross-entropy behind the LM head, as a Module, so a pipeline's last chunk is an ordinary chunk
// whose forward returns the loss and whose backward starts from nothing.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/tensor_parallel/vocab.hpp"

namespace quintet::model {

class VocabParallelLoss : public nn::Module {
 public:
  // vocab: the full vocabulary (divisible by tp); targets equal to ignore_index do not count.
  VocabParallelLoss(Communicator& tp, std::int64_t vocab, std::int64_t ignore_index = -100);
  // logits_shard [B, S, vocab/tp] (an LM head's output) and ctx.targets() [B, S] (the same on
  // every tp rank) -> the mean cross-entropy over the counted tokens: a scalar f32 tensor on the
  // logits' device, equal on every tp rank (VocabParallelCrossEntropy: never gathers the logits).
  Tensor forward(nn::Context& ctx, const Tensor& logits_shard) override;
  // dy must be undefined: the loss is the end of the model, and its gradient is ctx.loss_scale().
  // Returns this rank's slice of d(logits).
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  tensor_parallel::VocabParallelCrossEntropy ce_;
};

}  // namespace quintet::model
