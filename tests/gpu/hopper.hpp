// Whether GPU 0 is a Hopper (sm_90), where QUINTET_GROUPED_GEMM=wgmma runs: the grouped GEMM GPU
// tests (a target including this links quintet_device_libs, for the CUDA runtime).
#pragma once

#include <cuda_runtime.h>

#include "support/catch.hpp"

namespace nn_gpu_test {

inline bool hopper() {
  int major = 0, minor = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess);
  return major == 9 && minor == 0;
}

}  // namespace nn_gpu_test
