// DeviceGuard: makes a device the calling thread's current CUDA device for a scope, then restores
// the one that was current before.
//
// The CUDA runtime (and cuBLAS, NCCL) allocate and launch on the thread's current device; code
// that calls them for a Quintet Device holds a guard around the calls. A guard for a CUDA device
// that is already current changes nothing; a guard for the CPU does nothing. Every layer may use
// it (core, nn's kernels, the NCCL backend). Lives on one thread's stack: neither copyable nor
// movable. Needs no CUDA header.
#pragma once

#include "quintet/core/device.hpp"

namespace quintet {

class DeviceGuard {
 public:
  // Throws InvalidArgument when device is cuda:N and N is not a visible GPU (or Quintet was built
  // without CUDA), Cuda when the runtime cannot switch devices.
  explicit DeviceGuard(const Device& device);
  // Restores the previous device; ignores CUDA errors (it may run during CUDA's teardown).
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // the device to restore; -1 when the guard changed nothing
};

}  // namespace quintet
