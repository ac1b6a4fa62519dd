// A small GPT assembled from the tensor-parallel layers exactly as tensor_parallel.hpp describes
// (vocab-parallel embedding + position embedding -> blocks -> final norm -> column-parallel LM
// head, loss by VocabParallelCrossEntropy), for the tests that compare tp = N with tp = 1.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "quintet/parallel/tensor/transformer.hpp"
#include "quintet/parallel/tensor/linear.hpp"
#include "quintet/parallel/tensor/norm.hpp"
#include "quintet/parallel/tensor/regions.hpp"
#include "quintet/parallel/tensor/vocab.hpp"

namespace tp_test {

using namespace quintet;

// forward(ids [B, S]) -> logits shard [B, S, vocab/tp]; backward(dlogits shard) -> undefined.
class TinyGpt : public nn::Module {
 public:
  TinyGpt(Communicator& tp, const ParallelTransformerConfig& c, std::int64_t vocab, int layers) {
    const bool sp = c.sequence_parallel;
    wte_ = &add_module("wte",
                       std::make_unique<VocabParallelEmbedding>(tp, vocab, c.dim, c.init_std, sp));
    wpe_ = &add_module(
        "wpe", std::make_unique<PositionEmbedding>(tp, c.max_seq_len, c.dim, c.init_std, sp));
    for (int i = 0; i < layers; ++i) {
      blocks_.push_back(&add_module("block" + std::to_string(i),
                                    std::make_unique<ParallelTransformerBlock>(tp, c)));
    }
    norm_ = &add_module("norm", make_parallel_norm(c.norm, c.dim, c.eps, sp));
    head_ = &add_module(
        "head", std::make_unique<ColumnParallelLinear>(tp, c.dim, vocab, false, c.init_std, sp));
  }
  Tensor forward(nn::Context& ctx, const Tensor& ids) override {
    Tensor x = wpe_->forward(ctx, wte_->forward(ctx, ids));
    for (nn::Module* b : blocks_) x = b->forward(ctx, x);
    return head_->forward(ctx, norm_->forward(ctx, x));
  }
  Tensor backward(nn::Context& ctx, const Tensor& dlogits) override {
    Tensor dx = norm_->backward(ctx, head_->backward(ctx, dlogits));
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) dx = (*it)->backward(ctx, dx);
    return wte_->backward(ctx, wpe_->backward(ctx, dx));
  }

 private:
  VocabParallelEmbedding* wte_;
  PositionEmbedding* wpe_;
  std::vector<nn::Module*> blocks_;
  nn::Module* norm_;
  ColumnParallelLinear* head_;
};

}  // namespace tp_test
