// Vocabulary-parallel embedding and cross-entropy, and the position embedding of a
// sequence-parallel chunk.
#include <vector>

#include "parallel/tensor_parallel/internal/regions.hpp"
#include "quintet/nn/vocab_parallel_ops.hpp"
#include "quintet/parallel/tensor_parallel/regions.hpp"
#include "quintet/parallel/tensor_parallel/vocab.hpp"

#include "quintet/parallel/context/ring_attention.hpp"

namespace quintet::tensor_parallel {

// ---- VocabParallelEmbedding -------------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(Communicator& tp, std::int64_t vocab,
                                               std::int64_t dim, const EmbeddingOptions& options)
    : tp_(&tp), vocab_(vocab), sp_(options.sequence_parallel) {
  const float init_std = options.init_std;
  QUINTET_CHECK(vocab > 0 && dim > 0, "VocabParallelEmbedding({}, {}): sizes must be > 0", vocab,
                dim);
  check_divisible("VocabParallelEmbedding: vocab", vocab, tp.size());
  const std::int64_t local = vocab / tp.size();
  vocab_start_ = tp.rank() * local;
  nn::ParameterAttributes a;
  a.shard_dim = 0;
  a.shard_axis = Axis::tp;
  a.full_shape = {vocab, dim};
  a.shard_start = {vocab_start_, 0};
  weight_ = &add_parameter("weight", {local, dim}, nn::ParameterInit::normal(init_std), a);
}

Tensor VocabParallelEmbedding::forward(nn::Context& ctx, const Tensor& ids) {
  const Stream& s = ctx.stream();
  if (sp_) detail::check_sequence("VocabParallelEmbedding", ids, tp_->size());
  const Tensor y =
      nn::vocab_parallel_embedding_forward(ids, weight_->use(s), vocab_start_, vocab_, s);
  ctx.save(*this, {ids});
  return sp_ ? detail::start_reduce_scatter_sequence(y, *tp_, s).finish(s)
             : detail::start_all_reduce(y, *tp_, s).finish(s);
}

Tensor VocabParallelEmbedding::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& s = ctx.stream();
  const Tensor ids = ctx.take(*this).at(0);
  const Tensor dy_full = sp_ ? gather_sequence(dy, *tp_, s) : dy;
  nn::accumulate_gradients(
      ctx, {weight_},
      [dy_full, ids, start = vocab_start_](const std::vector<Tensor>& g, const Stream& st) {
        nn::vocab_parallel_embedding_backward(dy_full, ids, g[0], start, st);
      },
      nn::GradTiming::deferrable);
  return Tensor();
}

// ---- PositionEmbedding ------------------------------------------------------------------------

PositionEmbedding::PositionEmbedding(Communicator& tp, std::int64_t max_len, std::int64_t dim,
                                     const EmbeddingOptions& options)
    : tp_(&tp),
      max_len_(max_len),
      dim_(dim),
      sp_(options.sequence_parallel),
      cp_(options.cp != nullptr && options.cp->size() > 1 ? options.cp : nullptr) {
  const float init_std = options.init_std;
  const bool sequence_parallel = options.sequence_parallel;
  QUINTET_CHECK(max_len > 0 && dim > 0, "PositionEmbedding({}, {}): sizes must be > 0", max_len,
                dim);
  nn::ParameterAttributes a;
  a.reduce_over_tp = sequence_parallel;
  weight_ = &add_parameter("weight", {max_len, dim}, nn::ParameterInit::normal(init_std), a);
}

Tensor PositionEmbedding::forward(nn::Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  QUINTET_CHECK(x.defined() && x.dim() == 3 && x.size(2) == dim_,
                "PositionEmbedding: x is {}, expected [batch, seq{}, {}]",
                x.defined() ? shape_str(x.shape()) : std::string("undefined"), sp_ ? "/tp" : "",
                dim_);
  const std::int64_t b = x.size(0), local = x.size(1);
  const std::int64_t first = sp_ ? tp_->rank() * local : 0;  // within this cp rank's tokens
  const std::int64_t mine = sp_ ? local * tp_->size() : local;
  const std::int64_t seq = cp_ != nullptr ? mine * cp_->size() : mine;
  QUINTET_CHECK(seq <= max_len_,
                "PositionEmbedding: a sequence of {} tokens is longer than the {} positions it "
                "has; shorten it or build it with a larger max_len",
                seq, max_len_);
  if (!ids_.defined() || ids_.shape() != Shape{b, local} || ids_.device() != x.device()) {
    std::vector<std::int64_t> positions(static_cast<std::size_t>(mine));
    if (cp_ != nullptr) {
      positions = context::cp_positions(seq, cp_->size(), cp_->rank());
    } else {
      for (std::int64_t i = 0; i < mine; ++i) positions[i] = i;
    }
    std::vector<std::int64_t> ids(static_cast<std::size_t>(b * local));
    for (std::int64_t i = 0; i < b * local; ++i) ids[i] = positions[first + i % local];
    ids_ = Tensor::from_vector(ids, {b, local}).to(x.device(), s);
  }
  const Tensor y = nn::add(x, nn::embedding_forward(ids_, weight_->use(s), s), s);
  ctx.save(*this, {ids_});
  return y;
}

Tensor PositionEmbedding::backward(nn::Context& ctx, const Tensor& dy) {
  const Tensor ids = ctx.take(*this).at(0);
  nn::accumulate_gradients(
      ctx, {weight_},
      [dy, ids](const std::vector<Tensor>& g, const Stream& st) {
        nn::embedding_backward(dy, ids, g[0], st);
      },
      nn::GradTiming::deferrable);
  return dy;
}

// ---- VocabParallelCrossEntropy ----------------------------------------------------------------

VocabParallelCrossEntropy::VocabParallelCrossEntropy(Communicator& tp, std::int64_t vocab,
                                                     std::int64_t ignore_index)
    : tp_(&tp), vocab_(vocab), ignore_index_(ignore_index) {
  check_divisible("VocabParallelCrossEntropy: vocab", vocab, tp.size());
  local_vocab_ = vocab / tp.size();
  vocab_start_ = tp.rank() * local_vocab_;
}

nn::CrossEntropyOutput VocabParallelCrossEntropy::forward(const Tensor& logits_shard,
                                                          const Tensor& targets,
                                                          const Stream& stream) {
  QUINTET_CHECK(logits_shard.defined() && logits_shard.dim() >= 1 &&
                    logits_shard.size(logits_shard.dim() - 1) == local_vocab_,
                "VocabParallelCrossEntropy: logits_shard is {}, expected [..., {}] (vocab {} / tp "
                "{})",
                logits_shard.defined() ? shape_str(logits_shard.shape()) : std::string("undefined"),
                local_vocab_, vocab_, tp_->size());
  // Validates targets (on the CPU) before the all-gather.
  const Tensor partials = nn::vocab_parallel_ce_partials(logits_shard, targets, vocab_start_,
                                                         vocab_, ignore_index_, stream);
  Tensor gathered = partials.view({1, 3, partials.size(1)});
  if (tp_->size() > 1) {
    gathered = Tensor::empty({tp_->size(), 3, partials.size(1)}, partials.dtype(),
                             partials.device(), stream);
    tp_->all_gather(partials, gathered, stream).wait(stream);
  }
  return nn::vocab_parallel_ce_combine(gathered, targets, vocab_, ignore_index_, stream);
}

Tensor VocabParallelCrossEntropy::backward(const Tensor& logits_shard, const Tensor& targets,
                                           const nn::CrossEntropyOutput& out, float dloss,
                                           const Stream& stream) {
  return nn::vocab_parallel_ce_backward(logits_shard, targets, out.lse, out.valid_count, dloss,
                                        vocab_start_, vocab_, ignore_index_, stream);
}

}  // namespace quintet::tensor_parallel
