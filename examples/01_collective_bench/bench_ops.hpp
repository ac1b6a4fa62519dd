// The operations of 01_collective_bench: buffers, nccl-tests' sizes and bus factors, the expected
// result of each operation (for verification), and the same operation issued three ways: through
// a Quintet Communicator, through raw NCCL calls (GPU) and through raw MPI calls (CPU). The raw
// calls take their datatypes (and MPI's bf16/f16 sum) from the library's tables
// (quintet/collectives/nccl.hpp, mpi.hpp), so both sides move the same bytes.
//
// Sizes follow nccl-tests: `bytes` is the whole buffer of the operation (all_reduce: the tensor;
// all_gather: the gathered output; reduce_scatter and all_to_all: the input), rounded down to a
// multiple of ranks * element size where the operation splits it into per-rank blocks.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/config.hpp"
#include "quintet/core/tensor.hpp"
#if QUINTET_HAS_NCCL
#include <nccl.h>
#endif

namespace bench {

using quintet::DType;
using quintet::Tensor;

enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, sendrecv };
inline constexpr Op kAllOps[] = {Op::all_reduce, Op::all_gather, Op::reduce_scatter,
                                 Op::all_to_all, Op::broadcast,  Op::sendrecv};

inline std::string_view op_name(Op op) {
  switch (op) {
    case Op::all_reduce:
      return "all_reduce";
    case Op::all_gather:
      return "all_gather";
    case Op::reduce_scatter:
      return "reduce_scatter";
    case Op::all_to_all:
      return "all_to_all";
    case Op::broadcast:
      return "broadcast";
    case Op::sendrecv:
      return "sendrecv";
  }
  return "?";
}

inline bool reduces(Op op) { return op == Op::all_reduce || op == Op::reduce_scatter; }

// nccl-tests' bus bandwidth factor for n ranks: busbw = algbw * factor.
inline double bus_factor(Op op, int n) {
  switch (op) {
    case Op::all_reduce:
      return 2.0 * (n - 1) / n;
    case Op::all_gather:
    case Op::reduce_scatter:
    case Op::all_to_all:
      return static_cast<double>(n - 1) / n;
    case Op::broadcast:
    case Op::sendrecv:
      return 1.0;
  }
  return 1.0;
}

// The tensors of one operation at one size. count: elements of the whole buffer (see above);
// block: elements per rank where the operation has blocks (count / ranks), else count.
struct Buffers {
  Tensor in;
  Tensor out;  // the same tensor as in for broadcast
  std::int64_t count = 0;
  std::int64_t block = 0;
  std::size_t bytes() const { return static_cast<std::size_t>(count) * in.element_size(); }
};

// Element i of rank r's input: small integers, exact in every dtype, whose sums over up to 64
// ranks stay exact (reductions) or which identify the sender (data movement).
inline double input_value(Op op, int r, std::int64_t i) {
  if (reduces(op)) return static_cast<double>((r + i) % 4 + 1);
  return static_cast<double>((r * 31 + i * 7) % 251);
}

// Buffers for op of about `bytes` bytes on device, filled with input_value. count may be 0.
Buffers make_buffers(Op op, std::size_t bytes, DType dtype, const quintet::Device& device, int rank,
                     int ranks);

// Compares out (after the first run) with what op must produce on this rank. Returns "" when
// correct, else a description of the first mismatch and the number of mismatches.
std::string verify(Op op, const Buffers& b, int rank, int ranks);

// Issues op through the Quintet communicator on stream (asynchronous; returns its Work).
quintet::Work issue_ours(quintet::Communicator& comm, Op op, const Buffers& b,
                         const quintet::Stream& stream);

#if QUINTET_HAS_NCCL
// Issues op through raw NCCL calls on comm, on stream (asynchronous).
void issue_raw_nccl(ncclComm_t comm, Op op, const Buffers& b, cudaStream_t stream, int rank,
                    int ranks);
#endif

// Runs op through raw blocking MPI calls on comm. False when a count does not fit an int.
bool run_raw_mpi(MPI_Comm comm, Op op, const Buffers& b, int rank, int ranks);

}  // namespace bench
