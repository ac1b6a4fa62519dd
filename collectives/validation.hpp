// Argument checks shared by every Communicator backend (MPI, NCCL, Self), so that every backend
// rejects the same bad input with the same message before anything is sent.
//
// Each validate_<op> throws InvalidArgument naming the operation, the communicator and the
// offending values, or returns normally. Counts are in elements. The device check compares each
// tensor's device with comm.device() (a CUDA tensor on an MPI communicator and the reverse).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "quintet/collectives/communicator.hpp"

namespace quintet::detail {

// True when op is defined for dtype: sum/max/min/prod for every dtype but u16 (NCCL has no
// 16-bit integer type, and both backends accept the same input); avg for floating dtypes only.
bool reduction_supported(DType dtype, ReduceOp op);

// True when the element ranges of a and b (same storage) intersect.
bool tensors_overlap(const Tensor& a, const Tensor& b);
// True when a and b are the same elements (same storage, offset and numel).
bool same_elements(const Tensor& a, const Tensor& b);
// True when part is exactly block `index` of `whole` split into `blocks` equal blocks.
bool is_block_of(const Tensor& part, const Tensor& whole, int blocks, int index);

void validate_all_reduce(const Communicator& c, const Tensor& in, const Tensor& out, ReduceOp op);
void validate_reduce_scatter(const Communicator& c, const Tensor& in, const Tensor& out,
                             ReduceOp op);
void validate_all_gather(const Communicator& c, const Tensor& in, const Tensor& out);
void validate_broadcast(const Communicator& c, const Tensor& inout, int root);
// out is only checked on root (it may be undefined elsewhere).
void validate_reduce(const Communicator& c, const Tensor& in, const Tensor& out, ReduceOp op,
                     int root);
void validate_all_to_all(const Communicator& c, const Tensor& in, const Tensor& out);
void validate_all_to_all_v(const Communicator& c, const Tensor& in,
                           const std::vector<std::int64_t>& send_counts, const Tensor& out,
                           const std::vector<std::int64_t>& recv_counts);
// op_name is "send" or "recv"; peer must be another rank of the group.
void validate_send_recv(const Communicator& c, std::string_view op_name, const Tensor& t, int peer);
void validate_p2p(const Communicator& c, const std::vector<P2POp>& ops);

}  // namespace quintet::detail
