#include "bench_ops.hpp"

#include <fmt/format.h>

#include <vector>

#include "quintet/collectives/mpi.hpp"
#if QUINTET_HAS_NCCL
#include "quintet/collectives/nccl.hpp"
#endif

namespace bench {

using quintet::Device;

namespace {

// Host tensor of n elements with element i = value(i), then moved to device.
template <class Value>
Tensor filled(std::int64_t n, DType dtype, const Device& device, Value value) {
  Tensor host = Tensor::empty({n}, dtype, Device::cpu());
  quintet::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(host.data_ptr());
    for (std::int64_t i = 0; i < n; ++i) p[i] = quintet::convert_scalar<T>(value(i));
  });
  return host.to(device);
}

int next_rank(int rank, int ranks) { return (rank + 1) % ranks; }
int prev_rank(int rank, int ranks) { return (rank + ranks - 1) % ranks; }

void* at(const Tensor& t, std::int64_t elements) {
  return static_cast<char*>(t.data_ptr()) + static_cast<std::size_t>(elements) * t.element_size();
}

}  // namespace

Buffers make_buffers(Op op, std::size_t bytes, DType dtype, const Device& device, int rank,
                     int ranks) {
  Buffers b;
  const auto elems = static_cast<std::int64_t>(bytes / quintet::dtype_size(dtype));
  const bool blocked = op == Op::all_gather || op == Op::reduce_scatter || op == Op::all_to_all;
  b.count = blocked ? elems / ranks * ranks : elems;
  b.block = blocked ? b.count / ranks : b.count;
  const std::int64_t in_elems = op == Op::all_gather ? b.block : b.count;
  const std::int64_t out_elems = op == Op::reduce_scatter ? b.block : b.count;
  b.in = filled(in_elems, dtype, device, [&](std::int64_t i) { return input_value(op, rank, i); });
  b.out = op == Op::broadcast ? b.in : Tensor::zeros({out_elems}, dtype, device);
  return b;
}

std::string verify(Op op, const Buffers& b, int rank, int ranks) {
  const Tensor out = b.out.to(Device::cpu());
  auto expected = [&](std::int64_t k) -> double {
    switch (op) {
      case Op::all_reduce:
      case Op::reduce_scatter: {
        const std::int64_t i = op == Op::all_reduce ? k : rank * b.block + k;
        double sum = 0;
        for (int r = 0; r < ranks; ++r) sum += input_value(op, r, i);
        return sum;
      }
      case Op::all_gather:
        return input_value(op, static_cast<int>(k / b.block), k % b.block);
      case Op::all_to_all:
        return input_value(op, static_cast<int>(k / b.block), rank * b.block + k % b.block);
      case Op::broadcast:
        return input_value(op, 0, k);
      case Op::sendrecv:
        return input_value(op, prev_rank(rank, ranks), k);
    }
    return 0;
  };
  std::int64_t bad = 0;
  std::string first;
  quintet::dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(out.data_ptr());
    for (std::int64_t k = 0; k < out.numel(); ++k) {
      const double got = quintet::convert_scalar<double>(p[k]);
      const double want = expected(k);
      if (got != want && bad++ == 0) {
        first = fmt::format("element {}: got {}, expected {}", k, got, want);
      }
    }
  });
  if (bad == 0) return "";
  return fmt::format("{} of {} elements wrong on rank {}; first: {}", bad, out.numel(), rank,
                     first);
}

quintet::Work issue_ours(quintet::Communicator& comm, Op op, const Buffers& b,
                         const quintet::Stream& stream) {
  using quintet::P2POp;
  using quintet::ReduceOp;
  switch (op) {
    case Op::all_reduce:
      return comm.all_reduce(b.in, b.out, ReduceOp::sum, stream);
    case Op::all_gather:
      return comm.all_gather(b.in, b.out, stream);
    case Op::reduce_scatter:
      return comm.reduce_scatter(b.in, b.out, ReduceOp::sum, stream);
    case Op::all_to_all:
      return comm.all_to_all(b.in, b.out, stream);
    case Op::broadcast:
      return comm.broadcast(b.in, 0, stream);
    case Op::sendrecv: {
      const int me = comm.rank(), n = comm.size();
      return comm.p2p({P2POp::send(b.in, next_rank(me, n)), P2POp::recv(b.out, prev_rank(me, n))},
                      stream);
    }
  }
  return quintet::Work();
}

#if QUINTET_HAS_NCCL
namespace {
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw std::runtime_error(fmt::format("raw NCCL {} failed: {}", what, ncclGetErrorString(r)));
  }
}
}  // namespace

void issue_raw_nccl(ncclComm_t comm, Op op, const Buffers& b, cudaStream_t stream, int rank,
                    int ranks) {
  // The library's type table: u16, which NCCL lacks, moves as two bytes per element.
  const ncclDataType_t t = quintet::nccl_datatype(b.in.dtype());
  const std::size_t count = quintet::nccl_count(b.in.dtype(), b.count);
  const std::size_t block = quintet::nccl_count(b.in.dtype(), b.block);
  switch (op) {
    case Op::all_reduce:
      nccl_check(ncclAllReduce(b.in.data_ptr(), b.out.data_ptr(), count, t, ncclSum, comm, stream),
                 "ncclAllReduce");
      return;
    case Op::all_gather:
      nccl_check(ncclAllGather(b.in.data_ptr(), b.out.data_ptr(), block, t, comm, stream),
                 "ncclAllGather");
      return;
    case Op::reduce_scatter:
      nccl_check(
          ncclReduceScatter(b.in.data_ptr(), b.out.data_ptr(), block, t, ncclSum, comm, stream),
          "ncclReduceScatter");
      return;
    case Op::all_to_all:
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (int peer = 0; peer < ranks; ++peer) {
        nccl_check(ncclSend(at(b.in, peer * b.block), block, t, peer, comm, stream), "ncclSend");
        nccl_check(ncclRecv(at(b.out, peer * b.block), block, t, peer, comm, stream), "ncclRecv");
      }
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
      return;
    case Op::broadcast:
      nccl_check(ncclBroadcast(b.in.data_ptr(), b.in.data_ptr(), count, t, 0, comm, stream),
                 "ncclBroadcast");
      return;
    case Op::sendrecv:
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      nccl_check(ncclSend(b.in.data_ptr(), count, t, next_rank(rank, ranks), comm, stream),
                 "ncclSend");
      nccl_check(ncclRecv(b.out.data_ptr(), count, t, prev_rank(rank, ranks), comm, stream),
                 "ncclRecv");
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
      return;
  }
}
#endif

bool run_raw_mpi(MPI_Comm comm, Op op, const Buffers& b, int rank, int ranks) {
  if (b.count > INT_MAX) return false;
  const MPI_Datatype t = quintet::mpi_datatype(b.in.dtype());  // the library's type table
  const MPI_Op sum = quintet::mpi_op(b.in.dtype(), quintet::ReduceOp::sum);
  const int count = static_cast<int>(b.count), block = static_cast<int>(b.block);
  void* in = b.in.data_ptr();
  void* out = b.out.data_ptr();
  switch (op) {
    case Op::all_reduce:
      MPI_Allreduce(in, out, count, t, sum, comm);
      break;
    case Op::all_gather:
      MPI_Allgather(in, block, t, out, block, t, comm);
      break;
    case Op::reduce_scatter:
      MPI_Reduce_scatter_block(in, out, block, t, sum, comm);
      break;
    case Op::all_to_all:
      MPI_Alltoall(in, block, t, out, block, t, comm);
      break;
    case Op::broadcast:
      MPI_Bcast(in, count, t, 0, comm);
      break;
    case Op::sendrecv:
      MPI_Sendrecv(in, count, t, next_rank(rank, ranks), 0, out, count, t, prev_rank(rank, ranks),
                   0, comm, MPI_STATUS_IGNORE);
      break;
  }
  return true;
}

}  // namespace bench
