// Context-parallel attention (parallel/context/ring_attention.cpp): the attention of one long
// sequence computed by the cp ranks that each hold part of it.
//
// Layout (load-balanced for causal attention): the sequence of S tokens is cut into 2·cp chunks
// of c = S / (2·cp); rank r holds chunks r and 2·cp − 1 − r, in that order, as its local
// sequence of 2c tokens. Every rank then has the same causal work (an early chunk, which sees
// little, and a late one, which sees much). cp_split / cp_gather move between the full sequence
// and this layout; cp_positions gives the global positions of a rank's tokens.
//
// Ring attention: q, k, v [B, H, 2c, D] in that layout. The K/V of each rank travel around the cp
// ring (rank r sends to r + 1 and receives from r − 1), the transfer of the next block posted
// before the current block is computed, so it runs under it. Each (query chunk, key chunk) pair
// is one attention_forward with its global offsets (skipped when causal masks it whole, without a
// mask when it is whole visible), and the partial results are merged by their log-sum-exp. The
// backward runs the same ring: the gradients of each K/V block travel with it and reach their
// owner one hop after the last step.
//
// All-to-all (Ulysses) attention: the same layout in and out. An all-to-all over cp trades the
// sequence split for a head split (every rank gets the whole sequence of H / cp heads), one full
// attention runs, and a second all-to-all trades back. H (the local heads, after tp) must divide
// by cp.
//
// Grouped-query attention: k and v may have fewer heads Hkv than q (H a multiple of Hkv; q head i
// reads K/V head i / (H / Hkv)). Ring attention passes the Hkv heads around the ring as they are.
// All-to-all splits them over cp with the query heads: Hkv / cp to each rank when cp divides Hkv;
// when Hkv < cp (cp a multiple of Hkv), each K/V head is repeated cp / Hkv times before the
// exchange, so every rank gets the one head its H / cp query heads read, and backward sums the
// repeats' gradients. Other head counts are refused (check_ulysses_heads).
//
// The results equal one attention over the whole sequence up to f32 rounding (the merge sums in
// another order). Collective over cp, on stream.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::context {

// Throws InvalidArgument unless seq divides into 2 * cp chunks (naming both numbers).
void check_cp_sequence(std::int64_t seq, int cp);
// This rank's part of full (the sequence along dim): chunks rank and 2·cp − 1 − rank of it,
// concatenated along dim (a new contiguous tensor).
Tensor cp_split(const Tensor& full, int dim, int cp, int rank, const Stream& stream = Stream());
// The whole sequence from every rank's part (all-gather over cp, then the chunks put in order).
Tensor cp_gather(Communicator& cp, const Tensor& local, int dim, const Stream& stream = Stream());
// The global positions of rank's 2c tokens.
std::vector<std::int64_t> cp_positions(std::int64_t seq, int cp, int rank);

// How attention spans the cp ranks.
enum class ContextParallelKind {
  ring,        // K/V blocks around the ring, merged by log-sum-exp
  all_to_all,  // Ulysses: sequence split traded for a head split and back
};
// "ring", "ulysses" (or "all-to-all"); InvalidArgument listing them for anything else.
ContextParallelKind parse_context_parallel_kind(std::string_view name);

struct CpAttentionOptions {
  bool causal = true;
  float scale = 0.0f;  // 0 = 1 / sqrt(head_dim)
};

// out [B, H, 2c, D] and the merged lse [B, H, 2c] (f32) in the cp layout.
nn::AttentionOutput ring_attention_forward(Communicator& cp, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const CpAttentionOptions& options,
                                           const Stream& stream = Stream());
// dq, dk, dv in the cp layout, from the forward's out and lse.
nn::AttentionGrads ring_attention_backward(Communicator& cp, const Tensor& dout, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& lse, const CpAttentionOptions& options,
                                           const Stream& stream = Stream());

// Throws InvalidArgument unless all-to-all attention can split heads query heads and kv_heads
// K/V heads over cp (above), naming the numbers; `where` says who asks and `from` where the head
// counts come from (as "heads 8, kv_heads 2, tp 2"; may be empty).
void check_ulysses_heads(const char* where, std::int64_t heads, std::int64_t kv_heads, int cp,
                         const std::string& from = {});

// What the Ulysses forward keeps for its backward: the head-split, whole-sequence q, k, v, out and
// lse ([B, H/cp, S, D]; k and v [B, max(Hkv/cp, 1), S, D]), and Hkv, k's and v's heads before
// the split (0: as many as q's).
struct UlyssesSaved {
  Tensor q, k, v, out, lse;
  std::int64_t kv_heads = 0;
};
struct UlyssesOutput {
  Tensor out;  // [B, H, 2c, D] in the cp layout
  UlyssesSaved saved;
};
// Throws InvalidArgument (before any communication) unless check_ulysses_heads passes.
UlyssesOutput ulysses_attention_forward(Communicator& cp, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const CpAttentionOptions& options,
                                        const Stream& stream = Stream());
nn::AttentionGrads ulysses_attention_backward(Communicator& cp, const Tensor& dout,
                                              const UlyssesSaved& saved,
                                              const CpAttentionOptions& options,
                                              const Stream& stream = Stream());

}  // namespace quintet::context
