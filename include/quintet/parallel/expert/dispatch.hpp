// The token exchange of the MoE layer (parallel/expert/dispatch.cpp; its TokenDispatcher drives it,
// token_dispatcher.hpp), for MoE layers of one's own too: device-generic (narrowed copies and the
// communicators' all_to_all / all_to_all_v), with the permutation and combine of the nn ops
// (nn::moe_permute, nn::moe_unpermute of quintet/nn/ops.hpp) on either side. Collective over ep
// (and etp): every rank of them calls each function, also with no rows to send or receive.
//
// Row orders. This rank sends its dispatched rows sorted by global expert, so the rows for ep rank
// q's local expert le form block (q, le). After the ep exchange a rank holds, per source ep rank q
// and local expert le, the block recv(q, le); with etp > 1 the etp ranks of one expert all-gather
// those, so each holds gathered(s, q, le) for every etp source s ("arrival order": s, q, le).
// The experts run in "expert-major order": le, then s, then q.
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::expert {

struct ExchangePlan {
  int ep = 1, etp = 1, etp_rank = 0;
  std::int64_t local_experts = 1;
  std::vector<std::int64_t> send;      // [ep * E_l]: rows this rank sends to (q, le)
  std::vector<std::int64_t> gathered;  // [etp * ep * E_l]: rows of (s, q, le) after the exchange

  std::int64_t recv(int q, std::int64_t le) const { return at(etp_rank, q, le); }
  std::int64_t at(int s, int q, std::int64_t le) const {
    return gathered[static_cast<std::size_t>((s * ep + q) * local_experts + le)];
  }
  std::int64_t send_rows() const;
  std::int64_t recv_rows() const;                   // this rank's rows after the ep exchange
  std::int64_t rows_from(int s) const;              // rows of etp source s
  std::int64_t gathered_rows() const;               // all of them
  std::int64_t expert_rows(std::int64_t le) const;  // rows local expert le runs
};

// Exchanges the counts: send_counts [ep * E_l] i64 (on the tokens' device), rows for ep rank q's
// local expert le at q * E_l + le. One all_to_all over ep and (etp > 1) one all_gather over etp,
// then one copy of the counts to the host, which waits for it (its one host synchronisation,
// quintet::host_sync_count). ep / etp may be null.
ExchangePlan plan_exchange(const Tensor& send_counts, std::int64_t local_experts, Communicator* ep,
                           Communicator* etp, const Stream& stream);
// The same for `chunks` exchanges at once (one all_to_all, one copy to the host): send_counts
// [chunks * ep * E_l], chunk c's counts at c * ep * E_l; one plan per chunk. Every rank of ep and
// etp passes the same number of chunks.
std::vector<ExchangePlan> plan_exchange(const Tensor& send_counts, int chunks,
                                        std::int64_t local_experts, Communicator* ep,
                                        Communicator* etp, const Stream& stream);

// rows [send_rows, d] (sorted by expert) -> [gathered_rows, d] in expert-major order.
Tensor dispatch_rows(const Tensor& rows, const ExchangePlan& plan, Communicator* ep,
                     Communicator* etp, const Stream& stream);
// [gathered_rows, d] in expert-major order (partial sums over etp) -> [send_rows, d] in the
// sorted order of this rank's dispatched rows, summed over etp. The adjoint of dispatch_rows.
Tensor return_rows(const Tensor& rows, const ExchangePlan& plan, Communicator* ep,
                   Communicator* etp, const Stream& stream);

// The two in halves, to overlap the ep all_to_all_v with compute: start_* issues it and returns at
// once (the etp exchange and the reorder, which are not overlapped, run in start_return before it
// and in finish_dispatch after it); finish_* orders stream after it and returns the rows.
// dispatch_rows(r) = finish_dispatch(start_dispatch(r)), and likewise for return. A pending
// exchange holds its buffers; finish it before the plan goes away, in issue order per
// communicator on every rank.
struct PendingRows {
  Work work;
  Tensor in, out;
};
PendingRows start_dispatch(const Tensor& rows, const ExchangePlan& plan, Communicator* ep,
                           const Stream& stream);
Tensor finish_dispatch(const PendingRows& pending, const ExchangePlan& plan, Communicator* etp,
                       const Stream& stream);
PendingRows start_return(const Tensor& rows, const ExchangePlan& plan, Communicator* ep,
                         Communicator* etp, const Stream& stream);
Tensor finish_return(const PendingRows& pending, const Stream& stream);

}  // namespace quintet::expert
