// GptChunk: the library's GPT, or one pipeline chunk of it, as a Module (parallel/model/gpt.cpp).
// Every trainer and test builds its model here; nobody keeps a copy.
//
//   ids [B, S] -> wte: VocabParallelEmbedding (+ wpe: PositionEmbedding)   [embedding chunk]
//              -> block{first_layer} .. block{first_layer + num_layers - 1}: TransformerBlock
//              -> norm -> lm_head: ColumnParallelLinear d -> vocab/tp (or tied to wte)
//              -> loss: VocabParallelLoss against ctx.targets()          [head chunk]
//
// forward(ctx, x): x is the ids [B, S] (i32/i64, the full sequence on every tp rank) when the chunk
// holds the embedding, else the previous chunk's output [B, S(/tp), d]. It returns the loss (a
// scalar f32 tensor, mean over the counted tokens; call ctx.set_targets first) when the chunk holds
// the head, else its activations [B, S(/tp), d] for the next chunk.
// backward(ctx, dy): dy is undefined for a head chunk (the loss's gradient is ctx.loss_scale()),
// else d(output). It accumulates every parameter's gradient and returns d(input) (undefined for
// an embedding chunk: ids have no gradient).
//
// Names are global: block l is "block{l}" in whichever chunk holds it, so the chunks of a model
// cut any way hold exactly the parameters of the one-chunk model, under the same names, and the
// counter-based init (ParameterStore) gives them the same values; every tp rank's shard is the
// exact slice of the tp = 1 draw. Build the store with config.dtype.
//
// Tied embeddings: in one chunk the head borrows wte's table. Cut across chunks, the head's chunk
// holds its own copy of the table as "wte.weight" (a wte module that its forward never runs, so
// the same name gives the same init) and the head reads that; the embedding chunk's table is
// nn::TiedRole::owner, the head chunk's nn::TiedRole::copy, and the pipeline executor sums the
// two gradients after each step's data-parallel reduction, so the copies stay equal.
#pragma once

#include <memory>
#include <vector>

#include "quintet/nn/module.hpp"
#include "quintet/parallel/model/block.hpp"
#include "quintet/parallel/model/chunk_spec.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/model/groups.hpp"
#include "quintet/parallel/model/loss.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"
#include "quintet/parallel/tensor_parallel/vocab.hpp"

namespace quintet::model {

class GptChunk : public nn::Module {
 public:
  // Validates groups, config and spec (InvalidArgument, before any layer exists).
  GptChunk(const GptConfig& config, const ModelGroups& groups, const ChunkSpec& spec);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

  const GptConfig& config() const { return config_; }
  const ChunkSpec& spec() const { return spec_; }
  // The MoE layers of this chunk's blocks, in layer order (empty for a dense model).
  const std::vector<expert::MoELayer*>& moe_layers() const { return moe_layers_; }

 private:
  GptConfig config_;
  ChunkSpec spec_;
  tensor_parallel::VocabParallelEmbedding* tokens_ =
      nullptr;  // run by forward (the embedding chunk)
  tensor_parallel::PositionEmbedding* positions_ = nullptr;
  std::vector<nn::Module*> blocks_;
  std::vector<expert::MoELayer*>
      moe_layers_;  // TransformerBlocks (wrapped in nn::Recompute with full)
  nn::Module* final_norm_ = nullptr;
  tensor_parallel::ColumnParallelLinear* head_ = nullptr;
  VocabParallelLoss* loss_ = nullptr;
};

// The chunk `spec` of the model `config` over `groups` (the whole model: ChunkSpec::whole).
std::unique_ptr<GptChunk> build_gpt_chunk(const GptConfig& config, const ModelGroups& groups,
                                          const ChunkSpec& spec);

}  // namespace quintet::model
