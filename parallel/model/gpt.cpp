// The GPT chunk: embedding, blocks, and the head with its loss, each present as the spec says.
#include "quintet/parallel/model/gpt.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>

#include "quintet/core/trace.hpp"
#include "quintet/nn/recompute.hpp"

namespace quintet::model {

namespace {
// Validates before any member is built, so a bad config fails first, naming the field.
const GptConfig& checked(const GptConfig& config, const ModelGroups& groups,
                         const ChunkSpec& spec) {
  check_groups(groups);
  config.validate(groups.tp->size(), groups.cp_size());
  config.validate_experts(groups.ep_size(), groups.etp_size());
  spec.validate(config);
  return config;
}
}  // namespace

GptChunk::GptChunk(const GptConfig& config, const ModelGroups& groups, const ChunkSpec& spec)
    : config_(checked(config, groups, spec)), spec_(spec) {
  const GptConfig& c = config_;
  Communicator& tp = *groups.tp;
  const bool sp = c.sequence_parallel;
  const tensor_parallel::EmbeddingOptions embedding{.init_std = c.init_std,
                                                    .sequence_parallel = sp};
  const tensor_parallel::EmbeddingOptions positions{
      .init_std = c.init_std, .sequence_parallel = sp, .cp = groups.cp};
  if (spec.embedding) {
    tokens_ = &add_module("wte", std::make_unique<tensor_parallel::VocabParallelEmbedding>(
                                     tp, c.vocab, c.hidden, embedding));
    if (c.learned_positions) {
      positions_ = &add_module("wpe", std::make_unique<tensor_parallel::PositionEmbedding>(
                                          tp, c.seq_len, c.hidden, positions));
    }
  }
  for (std::int64_t l = spec.first_layer; l < spec.first_layer + spec.num_layers; ++l) {
    auto transformer = std::make_unique<TransformerBlock>(c, groups, l);
    if (transformer->moe() != nullptr) moe_layers_.push_back(transformer->moe());
    std::unique_ptr<nn::Module> block = std::move(transformer);
    if (c.recompute == RecomputeKind::full)
      block = std::make_unique<nn::Recompute>(std::move(block));
    blocks_.push_back(&add_module("block" + std::to_string(l), std::move(block)));
  }
  const bool tied_across = c.tied_embeddings && spec.embedding != spec.head;
  if (tied_across && spec.embedding) tokens_->weight().set_tied(nn::TiedRole::owner);
  if (spec.head) {
    final_norm_ = &add_module("norm", make_norm(c));
    const nn::Fp8Recipe head_fp8 = c.fp8_lm_head ? c.fp8 : nn::Fp8Recipe{};
    if (!c.tied_embeddings) {
      head_ =
          &add_module("lm_head", std::make_unique<tensor_parallel::ColumnParallelLinear>(
                                     tp, c.hidden, c.vocab,
                                     tensor_parallel::ColumnParallelOptions{.bias = false,
                                                                            .init_std = c.init_std,
                                                                            .sequence_parallel = sp,
                                                                            .fp8 = head_fp8}));
    } else if (!tied_across) {  // the embedding's backward, run last, marks the table
      head_ = &add_module("lm_head", std::make_unique<tensor_parallel::ColumnParallelLinear>(
                                         tp, tokens_->weight(),
                                         tensor_parallel::SharedWeightOptions{
                                             .sequence_parallel = sp, .fp8 = head_fp8}));
    } else {  // this chunk's copy of the table: never run as an embedding, so the head marks it
      auto& table = add_module("wte", std::make_unique<tensor_parallel::VocabParallelEmbedding>(
                                          tp, c.vocab, c.hidden, embedding));
      table.weight().set_tied(nn::TiedRole::copy);
      head_ = &add_module(
          "lm_head",
          std::make_unique<tensor_parallel::ColumnParallelLinear>(
              tp, table.weight(),
              tensor_parallel::SharedWeightOptions{
                  .sequence_parallel = sp, .ready = nn::GradReady::mark, .fp8 = head_fp8}));
    }
    loss_ = &add_module("loss", std::make_unique<VocabParallelLoss>(tp, c.vocab));
  }
}

namespace {

// A trace range of this chunk's compute (trace.hpp); nothing but a branch when tracing is off.
// The name is formatted only when it is on.
template <typename... Args>
void traced(std::optional<trace::Range>& r, const nn::Context& ctx,
            fmt::format_string<Args...> name, Args&&... args) {
  r.reset();
  if (trace::enabled())
    r.emplace(trace::TraceKind::compute, fmt::format(name, std::forward<Args>(args)...),
              ctx.stream());
}

}  // namespace

Tensor GptChunk::forward(nn::Context& ctx, const Tensor& x) {
  std::optional<trace::Range> range;
  Tensor h = x;
  if (tokens_ || positions_) traced(range, ctx, "embedding fwd");
  if (tokens_) h = tokens_->forward(ctx, h);
  if (positions_) h = positions_->forward(ctx, h);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    traced(range, ctx, "block {} fwd", spec_.first_layer + static_cast<std::int64_t>(i));
    h = blocks_[i]->forward(ctx, h);
  }
  range.reset();
  if (!loss_) return h;
  traced(range, ctx, "head+loss fwd");
  h = final_norm_->forward(ctx, h);
  return loss_->forward(ctx, head_->forward(ctx, h));
}

Tensor GptChunk::backward(nn::Context& ctx, const Tensor& dy) {
  std::optional<trace::Range> range;
  Tensor d = dy;
  if (loss_) {
    traced(range, ctx, "head+loss bwd");
    d = head_->backward(ctx, loss_->backward(ctx, d));
    d = final_norm_->backward(ctx, d);
  }
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    traced(range, ctx, "block {} bwd", spec_.first_layer + static_cast<std::int64_t>(i));
    d = blocks_[i]->backward(ctx, d);
  }
  range.reset();
  if (tokens_ || positions_) traced(range, ctx, "embedding bwd");
  if (positions_) d = positions_->backward(ctx, d);
  if (tokens_) d = tokens_->backward(ctx, d);
  return d;
}

std::unique_ptr<GptChunk> build_gpt_chunk(const GptConfig& config, const ModelGroups& groups,
                                          const ChunkSpec& spec) {
  return std::make_unique<GptChunk>(config, groups, spec);
}

}  // namespace quintet::model
