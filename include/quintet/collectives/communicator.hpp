// Communicator: one small interface for collective and point-to-point communication among a
// group of ranks, with three backends picked by the tensors' device:
//   - NCCL for CUDA tensors (each communicator owns a high-priority comm stream),
//   - MPI for CPU tensors (each communicator owns a progress thread running operations in order),
//   - Self for groups of one rank (no copies when in == out, no MPI or NCCL call).
//
// Contract for every operation:
//   * Counts and sizes are in ELEMENTS, never bytes.
//   * It returns a Work at once. The inputs are read after the work already queued on `stream`
//     (the caller's stream) — the op waits on an event recorded there — and the outputs must not
//     be read before Work::wait(stream). On the CPU, stream is ignored.
//   * In-place forms pass the same tensor as input and output.
//   * Tensors must be contiguous; every input is validated (dtype, device, sizes, peers, reduction
//     support) before anything is sent, and a bad one throws InvalidArgument naming the operation
//     and the values. Every rank of the group must call the same collectives in the same order.
//   * Operations on one communicator run in the order they were issued.
// Not thread-safe: issue operations on one communicator from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/collectives/work.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet {

enum class ReduceOp { sum, avg, max, min, prod };
std::string_view reduce_op_name(ReduceOp op);

// One send or receive of a batched point-to-point call.
struct P2POp {
  enum class Kind { send, recv };
  Kind kind;
  Tensor tensor;  // sent from / received into (whole tensor)
  int peer;       // rank in this communicator
  static P2POp send(Tensor t, int peer) { return {Kind::send, std::move(t), peer}; }
  static P2POp recv(Tensor t, int peer) { return {Kind::recv, std::move(t), peer}; }
};

enum class Backend { mpi, nccl, self };
std::string_view backend_name(Backend b);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  // The device whose tensors this communicator moves (cpu for MPI; cuda:N for NCCL).
  virtual Device device() const = 0;
  // A name for messages ("world", "tp", ...).
  virtual const std::string& name() const = 0;

  // out = op over ranks of in. in and out: same dtype, device and numel (may be the same tensor).
  virtual Work all_reduce(const Tensor& in, const Tensor& out, ReduceOp op,
                          const Stream& stream = Stream()) = 0;
  Work all_reduce(const Tensor& inout, ReduceOp op = ReduceOp::sum,
                  const Stream& stream = Stream()) {
    return all_reduce(inout, inout, op, stream);
  }
  // in has size() * out.numel() elements; rank r gets the reduction of block r of every in.
  // In place: out may be the r-th block view of in.
  virtual Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                              const Stream& stream = Stream()) = 0;
  // out has size() * in.numel() elements; block r of out is rank r's in. In place: in may be the
  // r-th block view of out.
  virtual Work all_gather(const Tensor& in, const Tensor& out, const Stream& stream = Stream()) = 0;
  // Every rank's inout becomes root's.
  virtual Work broadcast(const Tensor& inout, int root, const Stream& stream = Stream()) = 0;
  // root's out = op over ranks of in; out is ignored (may be undefined) on other ranks.
  virtual Work reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
                      const Stream& stream = Stream()) = 0;
  // in and out have size() equal blocks; block j of rank i's in becomes block i of rank j's out.
  virtual Work all_to_all(const Tensor& in, const Tensor& out, const Stream& stream = Stream()) = 0;
  // Variable sizes: rank sends send_counts[j] elements (consecutive in in) to rank j and receives
  // recv_counts[j] elements from rank j into out (consecutive, in rank order). Counts have
  // size() entries, sum(send_counts) == in.numel(), sum(recv_counts) == out.numel().
  virtual Work all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                            const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                            const Stream& stream = Stream()) = 0;
  virtual Work send(const Tensor& in, int peer, const Stream& stream = Stream()) = 0;
  virtual Work recv(const Tensor& out, int peer, const Stream& stream = Stream()) = 0;
  // Several sends and receives issued together (ncclGroupStart/End, or MPI nonblocking calls),
  // so that exchanges in both directions cannot deadlock.
  virtual Work p2p(const std::vector<P2POp>& ops, const Stream& stream = Stream()) = 0;
  virtual Work barrier(const Stream& stream = Stream()) = 0;

  // Splits into sub-communicators: ranks with the same color form one, ordered by key (then by
  // rank). Collective over this communicator. color < 0 means "in no group": returns nullptr.
  // A resulting group of one rank gets the Self backend.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
  // The same split, by a caller that knows the group it asks for (the Mesh does: Layout::group_of):
  // members are the ranks of this communicator whose color is this rank's, in key order, so that
  // rank i of the result is members[i] (empty when color < 0). The NCCL backend, which cannot see
  // its members' world ranks otherwise, then records the result's operations in the flight
  // recorder as '<name> (nccl)' with their world ranks (docs/reliability.md); the others ignore
  // them. Throws InvalidArgument before any communication when members are not distinct ranks of
  // this communicator including this one (or are given with color < 0), and after the split when
  // the result's rank or size disagrees with them.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      const std::vector<int>& members);

 protected:
  // split(color, key, name, members) once members are checked; by default split(color, key,
  // name). Backends that use members, and wrappers that pass them on, override it.
  virtual std::unique_ptr<Communicator> split_with_members(int color, int key,
                                                           const std::string& name,
                                                           const std::vector<int>& members);
};

}  // namespace quintet
