// Private: the communication of the tp region boundaries, started asynchronously so a layer can
// overlap it with compute that does not need its result (the weight gradient while dx is being
// reduced). Public blocking forms are in quintet/parallel/tensor_parallel/regions.hpp.
#pragma once

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::tensor_parallel::detail {

// A tensor whose value is final once work has completed: finish() makes stream wait for it.
struct Pending {
  Tensor value;
  Work work;
  Tensor finish(const Stream& stream) const {
    work.wait(stream);
    return value;
  }
};

// Sums x over tp in place. x must be contiguous and owned by the caller (a fresh op output).
Pending start_all_reduce(const Tensor& x, Communicator& tp, const Stream& stream);
// [B, S, ...] -> [B, S/tp, ...] summed over tp (see reduce_scatter_sequence).
Pending start_reduce_scatter_sequence(const Tensor& x, Communicator& tp, const Stream& stream);
// Checks x is [B, S, ...] with S divisible by tp (before any communication).
void check_sequence(const char* what, const Tensor& x, int tp);

}  // namespace quintet::tensor_parallel::detail
