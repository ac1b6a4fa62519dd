// Private to core: the CUDA stream handle that core's CUDA calls run on.
#pragma once

#include "quintet/core/stream.hpp"

namespace quintet::detail {

// The CUDA stream to run on: stream's handle when it is a CUDA stream, else the legacy default.
inline cudaStream_t cuda_stream_of(const Stream& stream) {
  return stream.device().is_cuda() ? stream.handle() : nullptr;
}

}  // namespace quintet::detail
