// The GPT of 04_gpt_train, built from Quintet's tensor-parallel layers, so the same code runs at
// any tp (tp = 1 is the plain model) with or without sequence parallelism:
//
//   ids [B, S] -> VocabParallelEmbedding + PositionEmbedding     [B, S(/tp with SP), d]
//             -> layers x ParallelTransformerBlock (pre-norm: causal attention, GELU MLP of 4d)
//             -> final LayerNorm
//             -> LM head: ColumnParallelLinear d -> vocab, no bias  [B, S, vocab/tp]
//   loss = VocabParallelCrossEntropy(logits, targets): the full logits are never gathered.
//
// Init: normal(0, 0.02); the two output projections of each block normal(0, 0.02/sqrt(2 layers))
// (GPT-2); biases zero, norm gains one. Parameter names ("block3.attn.qkv.weight") are the same at
// every tp, and every rank's shard is the exact slice of the tp = 1 draw.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/tensor/transformer.hpp"
#include "quintet/parallel/tensor/linear.hpp"
#include "quintet/parallel/tensor/norm.hpp"
#include "quintet/parallel/tensor/regions.hpp"
#include "quintet/parallel/tensor/vocab.hpp"
#include "train_config.hpp"

namespace gpt {

class GptModel : public quintet::nn::Module {
 public:
  // tp: this rank's tensor-parallel communicator (borrowed; must outlive the model).
  GptModel(const TrainConfig& config, quintet::Communicator& tp);

  // ids [B, S] int32 (the full sequence on every tp rank) -> this rank's logits [B, S, vocab/tp].
  quintet::Tensor forward(quintet::nn::Context& ctx, const quintet::Tensor& ids) override;
  // dlogits [B, S, vocab/tp] -> accumulates every parameter's gradient; returns an undefined
  // tensor (ids have no gradient).
  quintet::Tensor backward(quintet::nn::Context& ctx, const quintet::Tensor& dlogits) override;

  // Parameters of the unsharded model, and those outside the token and position embeddings (the
  // N of the 6 N FLOPs per token; the untied LM head counts, it is a real matmul).
  std::int64_t total_params() const { return total_params_; }
  std::int64_t non_embedding_params() const { return non_embedding_params_; }

 private:
  quintet::VocabParallelEmbedding* tokens_;
  quintet::PositionEmbedding* positions_;
  std::vector<quintet::ParallelTransformerBlock*> blocks_;
  quintet::ParallelLayerNorm* final_norm_;
  quintet::ColumnParallelLinear* head_;
  std::int64_t total_params_ = 0;
  std::int64_t non_embedding_params_ = 0;
};

}  // namespace gpt
