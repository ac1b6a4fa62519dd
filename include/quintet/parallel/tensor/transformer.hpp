// The tensor-parallel (and sequence-parallel) transformer block: attention split by heads, MLP
// split along its hidden size, the same math as nn::TransformerBlock (nn/layers.hpp). With tp = 1
// and no sequence parallelism it equals nn::TransformerBlock built from the same config and seed
// (the fused QKV weight is declared [3, dim, dim] rather than [3 * dim, dim]: same values in the
// same order). See regions.hpp for the conventions (activations, streams, parameters)
// and for how a GPT is assembled from these blocks.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/nn/layers.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/tensor/linear.hpp"
#include "quintet/parallel/tensor/norm.hpp"
#include "quintet/parallel/tensor/regions.hpp"

namespace quintet {

// nn::TransformerBlockConfig plus sequence_parallel. heads, hidden and dim must divide by tp.
struct ParallelTransformerConfig {
  std::int64_t dim = 64;
  std::int64_t heads = 4;
  std::int64_t hidden = 256;  // MLP hidden size
  std::int64_t max_seq_len = 1024;
  nn::NormKind norm = nn::NormKind::layernorm;
  nn::Activation activation = nn::Activation::gelu;
  bool bias = true;  // biases of the attention projections (the GELU MLP always has them)
  float init_std = 0.02f;
  float proj_init_std = 0.02f;  // output projections (GPT-2: 0.02 / sqrt(2 * layers))
  float eps = 1e-5f;
  bool sequence_parallel = false;  // activations between blocks are [batch, seq/tp, dim]
};

// Causal self-attention with heads split over tp: qkv = ColumnParallelLinear with 3 fused parts
// (parameters "qkv.weight" [3, dim/tp, dim], "qkv.bias" [3, dim/tp]), heads/tp local heads,
// proj = RowParallelLinear (dim/tp -> dim). x [B, S(/tp), dim] -> same shape.
class ParallelAttention : public nn::Module {
 public:
  ParallelAttention(Communicator& tp, std::int64_t dim, std::int64_t heads,
                    std::int64_t max_seq_len, bool bias, float init_std, float proj_init_std,
                    bool sequence_parallel);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  std::int64_t tp_size_, dim_, local_heads_, head_dim_, max_seq_len_;
  bool sp_;
  ColumnParallelLinear* qkv_;
  RowParallelLinear* proj_;
};

// nn::MLP split along hidden: GELU: fc (column) -> gelu -> proj (row), with biases. SwiGLU: gate
// "fc" and "up" (column, no bias, sharing one entry into the tp region) -> silu(gate) * up ->
// proj (row, no bias). x [B, S(/tp), dim] -> same shape.
class ParallelMLP : public nn::Module {
 public:
  ParallelMLP(Communicator& tp, std::int64_t dim, std::int64_t hidden, nn::Activation activation,
              float init_std, float proj_init_std, bool sequence_parallel);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  Communicator* tp_;
  nn::Activation activation_;
  bool sp_;
  ColumnParallelLinear* fc_;
  ColumnParallelLinear* up_ = nullptr;
  RowParallelLinear* proj_;
};

// Pre-norm block: h = x + attn(norm1(x)); y = h + mlp(norm2(h)). Parameter names as in
// nn::TransformerBlock: norm1.*, attn.qkv.*, attn.proj.*, norm2.*, mlp.fc.*, [mlp.up.weight],
// mlp.proj.*. The norms' parameters carry reduce_over_tp = config.sequence_parallel.
// Throws InvalidArgument at construction when heads, hidden or dim do not divide by tp (before
// any communication), and in forward when the sequence does not divide under SP.
class ParallelTransformerBlock : public nn::Module {
 public:
  ParallelTransformerBlock(Communicator& tp, const ParallelTransformerConfig& config);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  nn::Module* norm1_;
  ParallelAttention* attn_;
  nn::Module* norm2_;
  ParallelMLP* mlp_;
};

// A ParallelLayerNorm or ParallelRMSNorm (the final norm of a model, for instance).
std::unique_ptr<nn::Module> make_parallel_norm(nn::NormKind kind, std::int64_t dim, float eps,
                                               bool sequence_parallel);

}  // namespace quintet
