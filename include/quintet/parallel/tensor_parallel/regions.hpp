// The regions of tensor parallelism (tp) and sequence parallelism (SP): the collectives at the
// boundaries of a tp layer, and the conventions every tp layer follows. The layers (linear.hpp,
// vocab.hpp, norm.hpp, attention.hpp, mlp.hpp) have weights split over the ranks of one tp group,
// each equal (outputs and gradients) to its unsharded nn layer.
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
// The layers live in linear.hpp, vocab.hpp, norm.hpp, attention.hpp and mlp.hpp beside this
// header; quintet/parallel/model/gpt.hpp composes them into a GPT. Sizes that must divide: vocab,
// heads, hidden (and dim for the attention output) by tp; with SP, seq by tp.
//
// Not thread-safe; a layer borrows the communicator, which must outlive it.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::tensor_parallel {

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

}  // namespace quintet::tensor_parallel
