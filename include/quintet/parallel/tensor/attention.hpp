// Tensor-parallel causal self-attention (parallel/tensor/attention.cpp): the attention of a
// transformer block split by heads over tp. Conventions (activations, streams, parameters):
// regions.hpp.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/context/ring_attention.hpp"
#include "quintet/parallel/tensor/linear.hpp"

namespace quintet {

struct ParallelAttentionOptions {
  bool bias = true;                // of the qkv and output projections
  float init_std = 0.02f;          // qkv
  float proj_init_std = 0.02f;     // the output projection (GPT-2: init_std / sqrt(2 * layers))
  bool sequence_parallel = false;  // x and the output are [B, S/tp, dim]
  int overlap_chunks = 1;  // of the qkv and output projections' tp communication (linear.hpp)
  // Context parallelism: with a cp communicator of more than one rank, x holds this cp rank's
  // chunks of the sequence (context/ring_attention.hpp's layout) and the attention spans the cp
  // ranks as cp_kind says.
  Communicator* cp = nullptr;
  context::ContextParallelKind cp_kind = context::ContextParallelKind::ring;
};

// Causal self-attention with heads split over tp: qkv = ColumnParallelLinear with 3 fused parts
// (parameters "qkv.weight" [3, dim/tp, dim], "qkv.bias" [3, dim/tp]), heads/tp local heads,
// proj = RowParallelLinear (dim/tp -> dim). x [B, S(/tp), dim] -> same shape.
class ParallelAttention : public nn::Module {
 public:
  ParallelAttention(Communicator& tp, std::int64_t dim, std::int64_t heads,
                    std::int64_t max_seq_len, const ParallelAttentionOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  std::int64_t tp_size_, dim_, local_heads_, head_dim_, max_seq_len_;
  bool sp_;
  Communicator* cp_;  // null or one rank: no context parallelism
  context::ContextParallelKind cp_kind_;
  ColumnParallelLinear* qkv_;
  RowParallelLinear* proj_;
};

}  // namespace quintet
