// GPU timing shared by 09_op_bench's modes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>

#include "quintet/core/stream.hpp"

// Median milliseconds per call of fn on stream: `warmup` untimed calls, then `iters` calls, each
// between its own pair of timing events.
double median_ms(const quintet::Stream& stream, int warmup, int iters,
                 const std::function<void()>& fn);

// Throws std::runtime_error naming `what` and the CUDA error unless e is cudaSuccess.
void check_cuda(cudaError_t e, const char* what);

// The memory bound of the memory-bound modes: a device-to-device cudaMemcpyAsync of `bytes`
// bytes on stream, which reads and writes each byte once; and the GPU's name.
struct CopyBound {
  double ms = 0;    // median of `iters` copies
  double gbps = 0;  // 2 x bytes / ms (1e9 bytes/s)
  std::string gpu;  // cudaDeviceProp::name of the stream's device
};
CopyBound copy_bound(const quintet::Stream& stream, std::int64_t bytes, int warmup, int iters);
