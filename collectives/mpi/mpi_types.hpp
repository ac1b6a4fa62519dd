// Private to the MPI backend: the second half of avg. The dtype and reduction tables
// (mpi_datatype, mpi_op) are public, in quintet/collectives/mpi.hpp.
#pragma once

#include <cstdint>

#include "quintet/collectives/mpi.hpp"

namespace quintet::detail {

// data[i] /= divisor for the count elements of a floating dtype (the second half of avg).
void divide_by(void* data, DType dtype, std::int64_t count, int divisor);

}  // namespace quintet::detail
