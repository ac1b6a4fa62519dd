// Private helpers for the CUDA parts of core: a device guard and stream selection.
#pragma once

#include "quintet/core/config.hpp"
#include "quintet/core/device.hpp"
#include "quintet/core/stream.hpp"

namespace quintet::detail {

// Makes device current for the scope (for CUDA devices) and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The CUDA stream to run on: stream's handle when it is a CUDA stream, else the legacy default.
inline cudaStream_t cuda_stream_of(const Stream& stream) {
  return stream.device().is_cuda() ? stream.handle() : nullptr;
}

}  // namespace quintet::detail
