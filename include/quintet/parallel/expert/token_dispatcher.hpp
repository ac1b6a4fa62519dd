// The token dispatcher of an MoE layer (parallel/expert/token_dispatcher.cpp): takes the routed
// tokens of a rank to the ranks that hold their experts and brings the experts' outputs back,
// combined per token by the router's weights. MoELayer (moe_layer.hpp) composes it with its
// Router (router.hpp) and its Experts (experts.hpp); the pieces it drives are the fused nn ops
// nn::moe_permute (the permutation fused with the gather of the rows), nn::moe_unpermute (the
// un-permutation fused with the weighted combine) and its backward (quintet/nn/ops.hpp), and
// dispatch.hpp (the count exchange and the rows' all-to-all over ep, all-gather / reduce-scatter
// over etp).
//
// Forward, for the T tokens x [T, d] of the layer on this rank and their routing [T, k]:
//   1. the tokens this rank dispatches: all T, or without sequence parallelism and tp > 1 its
//      1/tp of them (T must divide: check_tokens);
//   2. in `chunks` near-equal consecutive chunks of those, each chunk's kept assignments permuted
//      by expert (then token, then choice) with their rows gathered in that order; with an
//      exchange (ep > 1 or etp > 1), one count exchange for every chunk;
//   3. chunk by chunk: chunk c + 1's rows travel while chunk c's experts run (the caller's
//      ExpertsForward, on the rows in expert-major order), and chunk c's results travel back
//      during chunk c + 1's; without an exchange the experts run on the chunk's rows in place;
//   4. back on this rank: the weighted sum per token (un-permutation and combine), and without
//      sequence parallelism an all-gather over tp, so y is the same on every tp rank.
// What backward needs is returned in a DispatchHandle. backward mirrors forward: the combine's
// backward (d(rows) and d(weights)), the gradients' exchange chunk by chunk around the caller's
// ExpertsBackward, the un-permutation (each token sums its rows' gradients), the all-gathers.
// Collective over tp (when it splits the tokens), ep and etp: every rank calls forward and
// backward, also with no rows to send or receive.
//
// Host synchronisations (host_sync_count, quintet/core/stream.hpp). With an exchange, forward
// waits once: the copy of the exchanged counts to the host (plan_exchange), which size the rows'
// all-to-all (ep) and all-gather (etp) and which the experts read as host counts; backward reuses
// them and waits for nothing. Without one (ep = etp = 1) the dispatcher waits for nothing: it
// hands the experts their rows' offsets on the device (ExpertRows::offsets, moe_permute's) with
// all T k rows of a chunk (the kept ones first; the rows past them are moe_permute's zeros, their
// outputs unused by the combine), and the expert load stays on the device
// (DispatchHandle::Chunk::counts) until the step ends. etp > 1 at ep = 1 still exchanges: its
// all-gather is of blocks of data-dependent sizes, which the host must know to post (padding each
// to T k rows would multiply the experts' rows by etp). Not thread-safe; the communicators must
// outlive the dispatcher.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/parallel/expert/dispatch.hpp"
#include "quintet/parallel/expert/router.hpp"

namespace quintet::expert {

// One forward's dispatch, for its backward.
struct DispatchHandle {
  std::int64_t tokens = 0;            // T: the layer's tokens on this rank
  std::int64_t first = 0, count = 0;  // the tokens this rank dispatches: [first, first + count)
  Tensor weights;                     // [count, k] f32: their combine weights
  bool exchanged = false;             // ep > 1 or etp > 1: the chunks' plans hold host counts
  struct Chunk {
    std::int64_t first = 0, count = 0;  // its tokens, among the dispatched ones
    Tensor counts;                      // [E] i64 on the device: kept assignments per expert
    ExchangePlan plan;                  // exchanged: its exchange's row counts
    Tensor slot;      // [count, k] i32: each assignment's sorted row (-1: dropped)
    Tensor source;    // [count k] i32: each sorted row's assignment (-1 past the kept ones)
    Tensor returned;  // the experts' outputs, sorted: [plan.send_rows(), d] exchanged, else
                      // [count k, d] (the rows past the kept ones unused)
  };
  std::vector<Chunk> chunks;
};

// The rows a chunk's experts run on, in expert-major order. Where each local expert's rows are is
// said on the host (counts, with an exchange) or on the device (offsets, without), not both.
struct ExpertRows {
  Tensor rows;  // [n, d]
  // Exchanged (ep > 1 or etp > 1): counts[le] rows for local expert le, summing to n.
  std::vector<std::int64_t> counts;
  // Not exchanged: [E_l + 1] i64 on the rows' device, local expert le's rows being
  // [offsets[le], offsets[le + 1]); the rows past offsets[E_l] are unused (their outputs too).
  Tensor offsets;
};
// The experts' part of a chunk: its rows -> their outputs [n, d] (forward); their gradients ->
// the rows' (backward).
using ExpertsForward = std::function<Tensor(int chunk, const ExpertRows& rows)>;
using ExpertsBackward = std::function<Tensor(int chunk, const Tensor& drows, const Stream& stream)>;
// Runs body (the experts' backward over every chunk) with the experts' weight gradients at hand:
// the caller's nn::accumulate_gradients around it.
using ExpertGradientScope = std::function<void(const std::function<void(const Stream&)>& body)>;

// The gradients backward returns.
struct DispatchGrads {
  Tensor dx;        // [T, d]
  Tensor dweights;  // [T, k] f32: of the combine weights
};

struct TokenDispatcherConfig {
  std::int64_t experts = 1;        // E
  std::int64_t local_experts = 1;  // E / ep
  bool sequence_parallel = false;
  int chunks = 1;  // the exchanges' chunks (1 without an ep exchange)
};

class TokenDispatcher {
 public:
  // tp is required (a one-rank one for none); ep and etp may be null (one rank).
  TokenDispatcher(Communicator& tp, Communicator* ep, Communicator* etp,
                  const TokenDispatcherConfig& config);

  const TokenDispatcherConfig& config() const { return config_; }
  // Throws InvalidArgument when this rank's share of batch x seq tokens is not whole (without
  // sequence parallelism the tp ranks split them). Local: call it before any communication.
  void check_tokens(std::int64_t batch, std::int64_t seq) const;

  // x [T, d] and its routing (experts, weights, kept [T, k]) -> y [T, d]; fills handle.
  Tensor forward(const Tensor& x, const Routing& routing, const ExpertsForward& experts,
                 DispatchHandle& handle, const Stream& stream) const;
  // dy [T, d] of the forward that filled handle -> d(x) through the experts, d(weights).
  DispatchGrads backward(const Tensor& dy, const DispatchHandle& handle,
                         const ExpertsBackward& experts, const ExpertGradientScope& scope,
                         const Stream& stream) const;

 private:
  Communicator* tp_;
  Communicator* ep_;
  Communicator* etp_;
  TokenDispatcherConfig config_;

  bool splits_tokens() const;
  bool exchanges() const;
};

}  // namespace quintet::expert
