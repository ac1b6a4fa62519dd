// Private: the one registry of cuBLAS and cuBLASLt handles and their workspaces, used by the
// linear op's cuBLASLt matmul (cublaslt.cu) and the tensor-core attention's batched GEMMs
// (attention_gemm.cu).
//
// Per (device, stream): one workspace of kCublasWorkspaceBytes, allocated on that stream by the
// caching allocator (quintet::cuda_allocate), so it is only ever used in that stream's order, and
// one cuBLAS handle bound to that stream and workspace. Per device: one cuBLASLt handle (cuBLASLt
// handles are not bound to a stream; a matmul on stream s passes s's workspace). Calls queued on
// one stream run one after the other, so cuBLAS and cuBLASLt share the stream's workspace.
// Everything is created on first use and never destroyed: the handles belong to CUDA contexts
// and the workspaces are pooled device memory, and freeing either during static destruction
// would race the CUDA runtime's own teardown. Thread-safe. The caller has made stream's device
// current. C++17.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>

#include "quintet/core/error.hpp"
#include "quintet/core/stream.hpp"

// Throws Cuda naming the call and cuBLAS's status unless call returns CUBLAS_STATUS_SUCCESS
// (cuBLAS and cuBLASLt share the status type).
#define QUINTET_CUBLAS_CHECK(call)                                  \
  do {                                                              \
    const cublasStatus_t quintet_cublas_status_ = (call);           \
    if (quintet_cublas_status_ != CUBLAS_STATUS_SUCCESS) {          \
      QUINTET_THROW(Cuda, "{} failed: {} ({})", #call,              \
                    cublasGetStatusName(quintet_cublas_status_),    \
                    cublasGetStatusString(quintet_cublas_status_)); \
    }                                                               \
  } while (0)

namespace quintet::nn::cuda_ops::detail {

// 32 MiB: what NVIDIA recommends for cuBLAS and cuBLASLt on Hopper; enough for split-K.
inline constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

// The cuBLAS handle of stream: bound to it, with its workspace.
cublasHandle_t cublas_handle(const Stream& stream);
// The cuBLASLt handle of stream's device.
cublasLtHandle_t cublaslt_handle(const Stream& stream);
// The workspace of stream: kCublasWorkspaceBytes of device memory, used in stream's order only.
void* cublas_workspace(const Stream& stream);

}  // namespace quintet::nn::cuda_ops::detail
