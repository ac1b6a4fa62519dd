// Vocabulary-parallel token embedding and cross-entropy, and the position embedding
// (parallel/tensor_parallel/vocab.cpp). Conventions: regions.hpp.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::tensor_parallel {

// ---- vocabulary-parallel embedding and cross-entropy ----------------------------------------

// How an embedding (tokens or positions) is built.
struct EmbeddingOptions {
  float init_std = 0.02f;
  bool sequence_parallel = false;  // the output is [B, S/tp, dim]
  // PositionEmbedding: with a cp communicator of more than one rank, the tokens are this cp
  // rank's chunks of the sequence (context/ring_attention.hpp), and get those chunks' positions.
  Communicator* cp = nullptr;
};

// Token embedding with the table [vocab, dim] split along vocab: each rank looks up the ids in its
// shard (zero rows for the others), then the rows are all-reduced (with SP reduce-scattered along
// the sequence). ids [B, S] i32/i64, the full sequence on every tp rank -> [B, S(/tp), dim].
// backward returns an undefined tensor (ids have no gradient).
class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(Communicator& tp, std::int64_t vocab, std::int64_t dim,
                         const EmbeddingOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& ids) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  std::int64_t vocab_start() const { return vocab_start_; }
  nn::Parameter& weight() { return *weight_; }

 private:
  Communicator* tp_;
  std::int64_t vocab_, vocab_start_;
  bool sp_;
  nn::Parameter* weight_;
};

// Learned position embedding added to x: weight [max_len, dim], replicated. x is [B, S, dim], or
// with SP [B, S/tp, dim] holding positions [r*S/tp, (r+1)*S/tp) on tp rank r. backward returns
// dy and accumulates the rows of this rank's positions (reduce_over_tp = sequence_parallel).
class PositionEmbedding : public nn::Module {
 public:
  PositionEmbedding(Communicator& tp, std::int64_t max_len, std::int64_t dim,
                    const EmbeddingOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  nn::Parameter& weight() { return *weight_; }

 private:
  Communicator* tp_;
  std::int64_t max_len_, dim_;
  bool sp_;
  Communicator* cp_;
  nn::Parameter* weight_;
  Tensor ids_;  // cached position ids [B, S_local] of the last shape seen
};

// Cross-entropy of logits split along the vocabulary ([..., vocab/tp], rank r holding entries
// [r*vocab/tp, ...), e.g. a ColumnParallelLinear LM head) without gathering them: each rank
// computes its per-token (max, sum of exp, target logit), one all-gather over tp of those
// [3, tokens] statistics, and every rank merges them. Stateless (safe for several microbatches
// in flight): backward takes what forward returned.
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(Communicator& tp, std::int64_t vocab, std::int64_t ignore_index = -100);
  // Equal to nn::cross_entropy_forward(full logits, targets, ignore_index): loss (scalar, mean
  // over tokens whose target != ignore_index), lse [tokens], valid_count; the same on every rank.
  // targets [...] i32/i64, the same on every tp rank. Runs on stream.
  nn::CrossEntropyOutput forward(const Tensor& logits_shard, const Tensor& targets,
                                 const Stream& stream);
  // This rank's slice of the full dlogits (scaled by dloss); no communication.
  Tensor backward(const Tensor& logits_shard, const Tensor& targets,
                  const nn::CrossEntropyOutput& out, float dloss, const Stream& stream);
  std::int64_t vocab_start() const { return vocab_start_; }
  std::int64_t local_vocab() const { return local_vocab_; }

 private:
  Communicator* tp_;
  std::int64_t vocab_, vocab_start_, local_vocab_, ignore_index_;
};

}  // namespace quintet::tensor_parallel
