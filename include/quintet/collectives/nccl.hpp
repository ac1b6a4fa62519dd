// How the NCCL backend moves Quintet tensors: the NCCL datatype and element count of a dtype, for
// programs that issue NCCL calls on Quintet tensors themselves (a benchmark's raw baseline, a
// custom kernel's communication). Only in a Quintet built with NCCL (QUINTET_HAS_NCCL).
#pragma once

#include <cstddef>
#include <cstdint>

#include "quintet/core/config.hpp"
#include "quintet/core/dtype.hpp"

#if !QUINTET_HAS_NCCL
#error "quintet/collectives/nccl.hpp needs a Quintet built with NCCL (QUINTET_HAS_NCCL)"
#endif

#include <nccl.h>

namespace quintet {

// The NCCL datatype that carries dtype. u16, which NCCL lacks, travels as two ncclUint8 per
// element (see nccl_count) and cannot be reduced.
ncclDataType_t nccl_datatype(DType dtype);

// The count to pass to NCCL for numel elements of dtype: numel, or 2 * numel for u16.
inline std::size_t nccl_count(DType dtype, std::int64_t numel) {
  return static_cast<std::size_t>(numel) * (dtype == DType::u16 ? 2 : 1);
}

}  // namespace quintet
