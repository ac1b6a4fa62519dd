// The transformer block and its slot factories.
#include "quintet/parallel/model/block.hpp"

#include "quintet/nn/ops.hpp"
#include "quintet/nn/recompute.hpp"
#include "quintet/parallel/tensor_parallel/attention.hpp"
#include "quintet/parallel/tensor_parallel/mlp.hpp"
#include "quintet/parallel/tensor_parallel/norm.hpp"

namespace quintet::model {

void check_groups(const ModelGroups& groups) {
  QUINTET_CHECK(groups.tp != nullptr,
                "ModelGroups: no tensor-parallel communicator; pass ModelGroups::of(mesh) or a "
                "one-rank communicator for no tensor parallelism");
}

std::unique_ptr<nn::Module> make_attention(const GptConfig& c, const ModelGroups& g) {
  switch (c.attention) {
    case AttentionKind::tensor_parallel:
      return std::make_unique<tensor_parallel::ParallelAttention>(
          *g.tp, c.hidden, c.heads, c.seq_len,
          tensor_parallel::ParallelAttentionOptions{.bias = c.bias,
                                                    .proj_bias = c.proj_bias,
                                                    .init_std = c.init_std,
                                                    .proj_init_std = c.output_init_std(),
                                                    .sequence_parallel = c.sequence_parallel,
                                                    .overlap_chunks = c.tp_overlap_chunks,
                                                    .cp = g.cp,
                                                    .cp_kind = c.context_parallel,
                                                    .kv_heads = c.kv_heads,
                                                    .head_dim = c.head_dim,
                                                    .qk_norm = c.qk_norm,
                                                    .qk_norm_eps = c.eps,
                                                    .rope = c.rope,
                                                    .rope_theta = c.rope_theta,
                                                    .rope_scaling = c.rope_scaling,
                                                    .fp8 = c.fp8});
  }
  QUINTET_THROW(InvalidArgument, "GptConfig: unknown attention kind {}",
                static_cast<int>(c.attention));
}

std::unique_ptr<nn::Module> make_mlp(const GptConfig& c, const ModelGroups& g, std::int64_t layer) {
  if (c.is_moe_block(layer)) {
    return std::make_unique<expert::MoELayer>(
        expert::MoEGroups{g.tp, g.cp, g.ep, g.etp, g.stage}, c.hidden,
        expert::MoEOptions{.router = c.moe.router,
                           .expert_ffn = c.expert_width(),
                           .activation = c.activation,
                           .shared_experts = c.moe.shared_experts,
                           .init_std = c.init_std,
                           .proj_init_std = c.output_init_std(),
                           .sequence_parallel = c.sequence_parallel,
                           .overlap_chunks = c.moe.overlap_chunks,
                           .fp8 = c.fp8});
  }
  switch (c.mlp) {
    case MlpKind::moe:  // a dense block of an MoE model
    case MlpKind::dense:
      return std::make_unique<tensor_parallel::ParallelMLP>(
          *g.tp, c.hidden, c.mlp_width(),
          tensor_parallel::ParallelMLPOptions{.activation = c.activation,
                                              .init_std = c.init_std,
                                              .proj_init_std = c.output_init_std(),
                                              .sequence_parallel = c.sequence_parallel,
                                              .overlap_chunks = c.tp_overlap_chunks,
                                              .fp8 = c.fp8});
  }
  QUINTET_THROW(InvalidArgument, "GptConfig: unknown MLP kind {}", static_cast<int>(c.mlp));
}

std::unique_ptr<tensor_parallel::ParallelNorm> make_norm(const GptConfig& c) {
  return tensor_parallel::make_parallel_norm(
      c.norm, c.hidden, {.eps = c.eps, .sequence_parallel = c.sequence_parallel});
}

TransformerBlock::TransformerBlock(const GptConfig& c, const ModelGroups& g, std::int64_t layer) {
  check_groups(g);
  c.validate_block(g.tp->size(), g.cp_size());
  c.validate_experts(g.ep_size(), g.etp_size());
  norm1_ = &add_module("norm1", make_norm(c));
  std::unique_ptr<nn::Module> attention = make_attention(c, g);
  if (c.recompute == RecomputeKind::attention) {
    attention = std::make_unique<nn::Recompute>(std::move(attention));
  }
  attn_ = &add_module("attn", std::move(attention));
  norm2_ = &add_module("norm2", make_norm(c));
  std::unique_ptr<nn::Module> mlp = make_mlp(c, g, layer);
  moe_ = dynamic_cast<expert::MoELayer*>(mlp.get());
  mlp_ = &add_module("mlp", std::move(mlp));
}

// h = x + attn(norm1(x)); out = h + mlp(norm2(h)). The first residual add is fused into norm2,
// and both residual gradients into the norms' backwards (ParallelNorm); the last add's sum is
// the next block's input.
Tensor TransformerBlock::forward(nn::Context& ctx, const Tensor& x) {
  const tensor_parallel::ParallelNorm::SumAndNorm h =
      norm2_->forward_add(ctx, x, attn_->forward(ctx, norm1_->forward(ctx, x)));
  return nn::add(h.sum, mlp_->forward(ctx, h.y), ctx.stream());
}

Tensor TransformerBlock::backward(nn::Context& ctx, const Tensor& dy) {
  const Tensor dh = norm2_->backward_add(ctx, mlp_->backward(ctx, dy), dy);
  return norm1_->backward_add(ctx, attn_->backward(ctx, dh), dh);
}

}  // namespace quintet::model
