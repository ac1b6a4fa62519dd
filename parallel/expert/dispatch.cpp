// The MoE token exchange: count exchange, the ep all_to_all_v, the etp all-gather and
// reduce-scatter of variable-sized blocks, and the reorder between arrival and expert-major order.
#include <numeric>

#include "quintet/core/error.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/expert/dispatch.hpp"

namespace quintet::expert {

namespace {

int size_of(Communicator* c) { return c != nullptr ? c->size() : 1; }

std::int64_t sum(const std::vector<std::int64_t>& v, std::size_t first, std::size_t n) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(first),
                         v.begin() + static_cast<std::ptrdiff_t>(first + n), std::int64_t{0});
}

// The blocks of arrival order (s, q, le) and their offsets in arrival and expert-major order.
struct Block {
  std::int64_t arrival = 0, expert_major = 0, rows = 0;
};
std::vector<Block> blocks(const ExchangePlan& p) {
  const std::int64_t El = p.local_experts;
  std::vector<Block> out(static_cast<std::size_t>(p.etp * p.ep * El));
  std::int64_t off = 0;
  for (int s = 0; s < p.etp; ++s) {
    for (int q = 0; q < p.ep; ++q) {
      for (std::int64_t le = 0; le < El; ++le) {
        Block& b = out[static_cast<std::size_t>((s * p.ep + q) * El + le)];
        b.arrival = off;
        b.rows = p.at(s, q, le);
        off += b.rows;
      }
    }
  }
  off = 0;
  for (std::int64_t le = 0; le < El; ++le) {
    for (int s = 0; s < p.etp; ++s) {
      for (int q = 0; q < p.ep; ++q) {
        Block& b = out[static_cast<std::size_t>((s * p.ep + q) * El + le)];
        b.expert_major = off;
        off += b.rows;
      }
    }
  }
  return out;
}

// Copies every block from one order to the other.
Tensor reorder(const Tensor& in, const ExchangePlan& p, bool to_expert_major,
               const Stream& stream) {
  Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device(), stream);
  for (const Block& b : blocks(p)) {
    if (b.rows == 0) continue;
    const std::int64_t from = to_expert_major ? b.arrival : b.expert_major;
    const std::int64_t to = to_expert_major ? b.expert_major : b.arrival;
    out.narrow(0, to, b.rows).copy_(in.narrow(0, from, b.rows), stream);
  }
  return out;
}

}  // namespace

std::int64_t ExchangePlan::send_rows() const { return sum(send, 0, send.size()); }
std::int64_t ExchangePlan::recv_rows() const { return rows_from(etp_rank); }
std::int64_t ExchangePlan::rows_from(int s) const {
  const std::size_t n = static_cast<std::size_t>(ep * local_experts);
  return sum(gathered, static_cast<std::size_t>(s) * n, n);
}
std::int64_t ExchangePlan::gathered_rows() const { return sum(gathered, 0, gathered.size()); }
std::int64_t ExchangePlan::expert_rows(std::int64_t le) const {
  std::int64_t r = 0;
  for (int s = 0; s < etp; ++s) {
    for (int q = 0; q < ep; ++q) r += at(s, q, le);
  }
  return r;
}

ExchangePlan plan_exchange(const Tensor& send_counts, std::int64_t local_experts, Communicator* ep,
                           Communicator* etp, const Stream& stream) {
  return plan_exchange(send_counts, 1, local_experts, ep, etp, stream).front();
}

std::vector<ExchangePlan> plan_exchange(const Tensor& send_counts, int chunks,
                                        std::int64_t local_experts, Communicator* ep,
                                        Communicator* etp, const Stream& stream) {
  const int epn = size_of(ep), etpn = size_of(etp);
  const std::int64_t El = local_experts, n = static_cast<std::int64_t>(epn) * El;
  QUINTET_CHECK(chunks >= 1, "MoE exchange: {} chunks; need at least one", chunks);
  QUINTET_CHECK(send_counts.defined() && send_counts.dtype() == DType::i64 &&
                    send_counts.numel() == chunks * n,
                "MoE exchange: expected {} i64 send counts for {} chunk(s) x ep {} x {} local "
                "experts, got {}",
                chunks * n, chunks, epn, El, send_counts.str());
  const Device dev = send_counts.device();
  const std::int64_t total = chunks * n;
  // [send (chunk, q, le) | gathered (s, q, chunk, le)] in one tensor: one copy to the host.
  Tensor all = Tensor::empty({total + etpn * total}, DType::i64, dev, stream);
  const Tensor send = send_counts.contiguous(stream);
  all.narrow(0, 0, total).copy_(send, stream);
  // Peer-major (q, chunk, le), so that each ep rank's counts of every chunk are one block.
  Tensor recv = chunks == 1
                    ? send
                    : send.view({chunks, epn, El}).transpose(0, 1).contiguous(stream).view({total});
  if (epn > 1) {
    Tensor out = Tensor::empty({total}, DType::i64, dev, stream);
    ep->all_to_all(recv, out, stream).wait(stream);
    recv = out;
  }
  if (etpn > 1) {
    etp->all_gather(recv, all.narrow(0, total, etpn * total), stream).wait(stream);
  } else {
    all.narrow(0, total, total).copy_(recv, stream);
  }
  // The host needs the counts to size the token exchange: the one host synchronisation of a
  // forward with an exchange (a copy to pinned memory, then the wait, then reads in place).
  const Tensor host = all.to(Device::cpu(), stream);
  stream.synchronize();
  const std::int64_t* v = host.data<std::int64_t>();
  std::vector<ExchangePlan> plans(static_cast<std::size_t>(chunks));
  for (int c = 0; c < chunks; ++c) {
    ExchangePlan& p = plans[static_cast<std::size_t>(c)];
    p.ep = epn;
    p.etp = etpn;
    p.etp_rank = etp != nullptr ? etp->rank() : 0;
    p.local_experts = El;
    p.send.assign(v + c * n, v + (c + 1) * n);
    p.gathered.resize(static_cast<std::size_t>(etpn * n));
    for (int sidx = 0; sidx < etpn; ++sidx) {
      for (int q = 0; q < epn; ++q) {
        for (std::int64_t le = 0; le < El; ++le) {
          p.gathered[static_cast<std::size_t>((sidx * epn + q) * El + le)] =
              v[static_cast<std::size_t>(total + sidx * total + (q * chunks + c) * El + le)];
        }
      }
    }
  }
  return plans;
}

PendingRows start_dispatch(const Tensor& rows, const ExchangePlan& p, Communicator* ep,
                           const Stream& stream) {
  const std::int64_t d = rows.size(1);
  QUINTET_CHECK(rows.dim() == 2 && rows.size(0) == p.send_rows(),
                "MoE dispatch: {} rows for a plan of {}", rows.size(0), p.send_rows());
  PendingRows pending;
  pending.in = rows.contiguous(stream);
  if (p.ep == 1) {
    pending.out = pending.in;
    return pending;
  }
  const std::int64_t El = p.local_experts;
  std::vector<std::int64_t> send(static_cast<std::size_t>(p.ep)),
      recv(static_cast<std::size_t>(p.ep));
  for (int q = 0; q < p.ep; ++q) {
    send[q] = sum(p.send, static_cast<std::size_t>(q * El), static_cast<std::size_t>(El)) * d;
    for (std::int64_t le = 0; le < El; ++le) recv[q] += p.recv(q, le) * d;
  }
  pending.out = Tensor::empty({p.recv_rows(), d}, rows.dtype(), rows.device(), stream);
  pending.work = ep->all_to_all_v(pending.in, send, pending.out, recv, stream);
  return pending;
}

Tensor finish_dispatch(const PendingRows& pending, const ExchangePlan& p, Communicator* etp,
                       const Stream& stream) {
  pending.work.wait(stream);
  const Tensor& mine = pending.out;
  const std::int64_t d = mine.size(1);
  Tensor arrival = mine;
  if (p.etp > 1) {
    // An all-gather of blocks of different sizes: this rank's block sent to every etp rank.
    const std::int64_t n = p.recv_rows();
    Tensor copies = Tensor::empty({p.etp * n, d}, mine.dtype(), mine.device(), stream);
    for (int s = 0; s < p.etp; ++s) copies.narrow(0, s * n, n).copy_(mine, stream);
    std::vector<std::int64_t> send(static_cast<std::size_t>(p.etp), n * d), recv;
    for (int s = 0; s < p.etp; ++s) recv.push_back(p.rows_from(s) * d);
    arrival = Tensor::empty({p.gathered_rows(), d}, mine.dtype(), mine.device(), stream);
    etp->all_to_all_v(copies, send, arrival, recv, stream).wait(stream);
  }
  // With one local expert, arrival order (s, q) is already expert-major.
  return p.local_experts == 1 ? arrival : reorder(arrival, p, true, stream);
}

PendingRows start_return(const Tensor& rows, const ExchangePlan& p, Communicator* ep,
                         Communicator* etp, const Stream& stream) {
  const std::int64_t d = rows.size(1);
  QUINTET_CHECK(rows.dim() == 2 && rows.size(0) == p.gathered_rows(),
                "MoE return: {} rows for a plan of {}", rows.size(0), p.gathered_rows());
  Tensor arrival = p.local_experts == 1 ? rows.contiguous(stream) : reorder(rows, p, false, stream);
  const std::int64_t El = p.local_experts;
  Tensor mine = arrival;
  if (p.etp > 1) {
    // A reduce-scatter of blocks of different sizes: each etp source gets its block back from
    // every etp rank, and sums them.
    const std::int64_t n = p.recv_rows();
    std::vector<std::int64_t> send, recv(static_cast<std::size_t>(p.etp), n * d);
    for (int s = 0; s < p.etp; ++s) send.push_back(p.rows_from(s) * d);
    Tensor parts = Tensor::empty({p.etp * n, d}, rows.dtype(), rows.device(), stream);
    etp->all_to_all_v(arrival, send, parts, recv, stream).wait(stream);
    mine = parts.narrow(0, 0, n).contiguous(stream);
    for (int s = 1; s < p.etp; ++s) nn::add_(mine, parts.narrow(0, s * n, n), 1.0f, stream);
  }
  PendingRows pending;
  pending.in = mine;
  if (p.ep == 1) {
    pending.out = mine;
    return pending;
  }
  std::vector<std::int64_t> send(static_cast<std::size_t>(p.ep)),
      recv(static_cast<std::size_t>(p.ep));
  for (int q = 0; q < p.ep; ++q) {
    for (std::int64_t le = 0; le < El; ++le) send[q] += p.recv(q, le) * d;
    recv[q] = sum(p.send, static_cast<std::size_t>(q * El), static_cast<std::size_t>(El)) * d;
  }
  pending.out = Tensor::empty({p.send_rows(), d}, rows.dtype(), rows.device(), stream);
  pending.work = ep->all_to_all_v(mine, send, pending.out, recv, stream);
  return pending;
}

Tensor finish_return(const PendingRows& pending, const Stream& stream) {
  pending.work.wait(stream);
  return pending.out;
}

Tensor dispatch_rows(const Tensor& rows, const ExchangePlan& p, Communicator* ep, Communicator* etp,
                     const Stream& stream) {
  return finish_dispatch(start_dispatch(rows, p, ep, stream), p, etp, stream);
}

Tensor return_rows(const Tensor& rows, const ExchangePlan& p, Communicator* ep, Communicator* etp,
                   const Stream& stream) {
  return finish_return(start_return(rows, p, ep, etp, stream), stream);
}

}  // namespace quintet::expert
