// Private: the registry of cuDNN handles, one per (device, stream), used by the cuDNN graph-API
// attention (attention_cudnn.cpp). Like the cuBLAS handles of lib/nn/cuda/cublas_handles.hpp:
// created on first use, bound to the stream (cudnnSetStream), never destroyed (a handle belongs to
// its CUDA context, and destroying it during static destruction would race the CUDA runtime's own
// teardown). Thread-safe. The caller has made stream's device current.
#pragma once

#include <cudnn.h>

#include "quintet/core/error.hpp"
#include "quintet/core/stream.hpp"

// Throws Cuda naming the call, cuDNN's status and cuDNN's last error message unless call returns
// CUDNN_STATUS_SUCCESS.
#define QUINTET_CUDNN_CHECK(call)                                                    \
  do {                                                                               \
    const cudnnStatus_t quintet_cudnn_status_ = (call);                              \
    if (quintet_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                             \
      ::quintet::nn::cudnn_backend::throw_cudnn_error(quintet_cudnn_status_, #call); \
    }                                                                                \
  } while (0)

namespace quintet::nn::cudnn_backend {

// Throws Error(Cuda) "<call> failed: <status name> (<cuDNN's last error message>)".
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call);

// The cuDNN handle of stream, bound to it.
cudnnHandle_t cudnn_handle(const Stream& stream);

}  // namespace quintet::nn::cudnn_backend
