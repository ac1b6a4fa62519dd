#include "gpt_model.hpp"

#include <cmath>
#include <string>

namespace gpt {

using quintet::Tensor;
namespace nn = quintet::nn;

namespace {
constexpr float kInitStd = 0.02f;
}

GptModel::GptModel(const TrainConfig& c, quintet::Communicator& tp) {
  const bool sp = c.sp;
  tokens_ = &add_module("wte", std::make_unique<quintet::VocabParallelEmbedding>(
                                   tp, c.vocab, c.hidden, kInitStd, sp));
  positions_ = &add_module(
      "wpe", std::make_unique<quintet::PositionEmbedding>(tp, c.seq_len, c.hidden, kInitStd, sp));
  quintet::ParallelTransformerConfig block;
  block.dim = c.hidden;
  block.heads = c.heads;
  block.hidden = 4 * c.hidden;
  block.max_seq_len = c.seq_len;
  block.norm = nn::NormKind::layernorm;
  block.activation = nn::Activation::gelu;
  block.bias = true;
  block.init_std = kInitStd;
  block.proj_init_std = kInitStd / std::sqrt(2.0f * static_cast<float>(c.layers));
  block.sequence_parallel = sp;
  for (std::int64_t l = 0; l < c.layers; ++l) {
    blocks_.push_back(&add_module("block" + std::to_string(l),
                                  std::make_unique<quintet::ParallelTransformerBlock>(tp, block)));
  }
  final_norm_ =
      &add_module("norm", std::make_unique<quintet::ParallelLayerNorm>(c.hidden, 1e-5f, sp));
  head_ = &add_module("lm_head", std::make_unique<quintet::ColumnParallelLinear>(
                                     tp, c.hidden, c.vocab, /*bias=*/false, kInitStd, sp));
  // Unsharded counts, from the sizes (every rank agrees, whatever its shard).
  const std::int64_t d = c.hidden;
  const std::int64_t per_block = 12 * d * d + 13 * d;  // qkv, proj, fc, fc proj, two norms
  non_embedding_params_ = c.layers * per_block + 2 * d + d * c.vocab;
  total_params_ = non_embedding_params_ + c.vocab * d + c.seq_len * d;
}

Tensor GptModel::forward(nn::Context& ctx, const Tensor& ids) {
  Tensor x = tokens_->forward(ctx, ids);
  x = positions_->forward(ctx, x);
  for (auto* block : blocks_) x = block->forward(ctx, x);
  x = final_norm_->forward(ctx, x);
  return head_->forward(ctx, x);
}

Tensor GptModel::backward(nn::Context& ctx, const Tensor& dlogits) {
  Tensor dx = head_->backward(ctx, dlogits);
  dx = final_norm_->backward(ctx, dx);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) dx = (*it)->backward(ctx, dx);
  dx = positions_->backward(ctx, dx);
  tokens_->backward(ctx, dx);
  return Tensor();
}

}  // namespace gpt
