// Tensor parallelism (tp) and sequence parallelism (SP): layers whose weights are split over the
// ranks of one tp group, each equal (outputs and gradients) to its unsharded nn layer.
//
// Every layer takes the tp communicator (mesh.comm(Axis::tp)) and `sequence_parallel`:
//   - without SP, activations between layers are [batch, seq, dim] and the same on every tp rank;
//   - with SP, they are [batch, seq/tp, dim]: tp rank r holds sequence positions
//     [r*seq/tp, (r+1)*seq/tp). Norms, dropout-free residual adds and position embeddings run on
//     that chunk; a column-parallel layer all-gathers the sequence on entry and a row-parallel one
//     reduce-scatters it on exit (in place of the all-reduce without SP).
// Communication runs on the layer's ctx.stream(): the op is issued after the work queued there
// and the stream then waits for it (Work::wait; no host synchronisation on GPUs; on the CPU the
// MPI communicator's thread does the work while the caller blocks in wait). Every rank of the tp
// group must run the same layers in the same order.
//
// Parameters: a sharded parameter sets attrs.shard_axis = tp, shard_dim, full_shape and
// shard_start, so ParameterStore draws exactly its slice of the unsharded init: the same seed
// gives the same model at any tp. Names match the nn layers ("weight", "bias"). Replicated
// parameters that act on sequence-split activations (norms, the position embedding) get
// attrs.reduce_over_tp = sequence_parallel: their gradient on one rank covers only its sequence
// chunk, and data parallelism (or the caller) must all-reduce it (sum) over tp before the
// optimizer step. Every other replicated parameter gets the same gradient on every tp rank.
//
// A GPT assembled from these layers (tests/mpi/tp_gpt.hpp builds exactly this):
//   ids [B, S] (full sequence on every tp rank), targets [B, S]
//   x  = VocabParallelEmbedding(tp, vocab, dim, std, sp).forward(ids)     // [B, S or S/tp, D]
//   x  = PositionEmbedding(tp, max_seq_len, dim, std, sp).forward(x)      // adds rows of its chunk
//   x  = ParallelTransformerBlock(tp, config) x N                          //
//   parallel_transformer.hpp x  = ParallelLayerNorm / ParallelRMSNorm(tp, dim, eps, sp).forward(x)
//   lg = ColumnParallelLinear(tp, dim, vocab, false, std, sp).forward(x)  // [B, S, vocab/tp]
//   loss = VocabParallelCrossEntropy(tp, vocab).forward(lg, targets, stream)  // never gathered
// and backward in reverse: dlg = ce.backward(...), then each module's backward. Sizes that must
// divide: vocab, heads, hidden (and dim for the attention output) by tp; with SP, seq by tp.
//
// Not thread-safe; a layer borrows the communicator, which must outlive it.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet {

// ---- sequence regions ------------------------------------------------------------------------
// [B, S/tp, ...] -> [B, S, ...]: every rank's sequence chunk, concatenated in rank order along
// dim 1. One all-gather and (for B > 1) one copy. Returns x itself when tp has one rank.
Tensor gather_sequence(const Tensor& x, Communicator& tp, const Stream& stream);
// [B, S, ...] -> [B, S/tp, ...]: the sum over tp ranks of x, of which rank r keeps chunk r of the
// sequence. One copy (for B > 1) and one reduce-scatter. Throws InvalidArgument, before any
// communication, when S is not divisible by tp.size().
Tensor reduce_scatter_sequence(const Tensor& x, Communicator& tp, const Stream& stream);
// The sum over tp ranks of x, as a new tensor (x is not modified; x itself for one rank).
Tensor all_reduce_tp(const Tensor& x, Communicator& tp, const Stream& stream);

// Throws InvalidArgument naming what, the size and tp unless size % tp == 0 (and size > 0).
void check_divisible(const char* what, std::int64_t size, int tp);

// ---- linear layers --------------------------------------------------------------------------

// y = x · Wᵀ + b with W [out, in] split along out: rank r holds output features
// [r*out/tp, (r+1)*out/tp). x enters the tp region (identity forward / all-reduce of dx backward;
// with SP all-gather of the sequence forward / reduce-scatter of dx backward). Output
// [B, S, out/tp], the full sequence, not gathered over features.
// fused_parts > 1 splits each of that many equal blocks of out separately (a fused QKV: parts =
// 3, so rank r holds rows r of q, of k and of v); the weight is then declared
// [parts, out/parts/tp, in] (bias [parts, out/parts/tp]), the exact slice of the unsharded
// [parts, out/parts, in] draw. enter_region = false: x is already inside the region (the full
// sequence on every rank) and the caller reduces dx itself (for layers sharing one input).
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(Communicator& tp, std::int64_t in, std::int64_t out, bool bias,
                       float init_std, bool sequence_parallel, std::int64_t fused_parts = 1,
                       bool enter_region = true);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  std::int64_t local_out() const { return local_out_; }
  nn::Parameter& weight() { return *weight_; }
  nn::Parameter* bias() { return bias_; }

 private:
  Communicator* tp_;
  std::int64_t in_, local_out_;
  bool sp_, enter_region_;
  nn::Parameter* weight_;
  nn::Parameter* bias_ = nullptr;
};

// y = x · Wᵀ + b with W [out, in] split along in: rank r holds input features
// [r*in/tp, (r+1)*in/tp) and takes x [B, S, in/tp] (a column-parallel layer's output). The
// partial products are all-reduced (with SP reduce-scattered along the sequence: output
// [B, S/tp, out]). The bias [out] is replicated (added once, by tp rank 0, before the reduction);
// its gradient comes from the full-sequence dy, so it needs no tp reduction.
class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(Communicator& tp, std::int64_t in, std::int64_t out, bool bias, float init_std,
                    bool sequence_parallel);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  nn::Parameter& weight() { return *weight_; }
  nn::Parameter* bias() { return bias_; }

 private:
  Communicator* tp_;
  std::int64_t local_in_, out_;
  bool sp_;
  nn::Parameter* weight_;
  nn::Parameter* bias_ = nullptr;
};

// ---- vocabulary-parallel embedding and cross-entropy ----------------------------------------

// Token embedding with the table [vocab, dim] split along vocab: each rank looks up the ids in its
// shard (zero rows for the others), then the rows are all-reduced (with SP reduce-scattered along
// the sequence). ids [B, S] i32/i64, the full sequence on every tp rank -> [B, S(/tp), dim].
// backward returns an undefined tensor (ids have no gradient).
class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(Communicator& tp, std::int64_t vocab, std::int64_t dim, float init_std,
                         bool sequence_parallel);
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
  PositionEmbedding(Communicator& tp, std::int64_t max_len, std::int64_t dim, float init_std,
                    bool sequence_parallel);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  nn::Parameter& weight() { return *weight_; }

 private:
  Communicator* tp_;
  std::int64_t max_len_, dim_;
  bool sp_;
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

// ---- norms on (possibly sequence-split) activations ------------------------------------------

// nn::LayerNorm over the last dim (weight, bias [dim], replicated) whose parameters carry
// reduce_over_tp = sequence_parallel.
class ParallelLayerNorm : public nn::Module {
 public:
  ParallelLayerNorm(std::int64_t dim, float eps, bool sequence_parallel);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  float eps_;
  nn::Parameter* weight_;
  nn::Parameter* bias_;
};

// nn::RMSNorm over the last dim (weight [dim], replicated), reduce_over_tp = sequence_parallel.
class ParallelRMSNorm : public nn::Module {
 public:
  ParallelRMSNorm(std::int64_t dim, float eps, bool sequence_parallel);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  float eps_;
  nn::Parameter* weight_;
};

}  // namespace quintet
