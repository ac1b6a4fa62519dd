// Mapping of Quintet dtypes and reductions onto MPI datatypes and ops, including the user-defined
// MPI ops that reduce bf16 and f16 (MPI has no 16-bit floating types).
#pragma once

#include <mpi.h>

#include <cstdint>

#include "quintet/collectives/communicator.hpp"

namespace quintet::detail {

// The MPI datatype that moves one element of dtype (bf16/f16 travel as MPI_UINT16_T).
MPI_Datatype mpi_datatype(DType dtype);
// The MPI op computing op over dtype (avg maps to the sum; divide with divide_by afterwards).
// Creates the bf16/f16 user-defined ops on first use. Needs an initialised MPI.
MPI_Op mpi_op(DType dtype, ReduceOp op);
// data[i] /= divisor for the count elements of a floating dtype (the second half of avg).
void divide_by(void* data, DType dtype, std::int64_t count, int divisor);

}  // namespace quintet::detail
