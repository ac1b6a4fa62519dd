#include "quintet/core/error.hpp"

#include <mpi.h>

#include "quintet/core/config.hpp"
#if QUINTET_HAS_CUDA
#include <cuda_runtime.h>
#endif
#if QUINTET_HAS_NCCL
#include <nccl.h>
#endif

namespace quintet {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return "InvalidArgument";
    case ErrorCode::Cuda:
      return "Cuda";
    case ErrorCode::Nccl:
      return "Nccl";
    case ErrorCode::Mpi:
      return "Mpi";
    case ErrorCode::System:
      return "System";
    case ErrorCode::Timeout:
      return "Timeout";
    case ErrorCode::Remote:
      return "Remote";
    case ErrorCode::Aborted:
      return "Aborted";
  }
  return "Unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

namespace detail {

namespace {
std::string_view basename(const char* file) {
  std::string_view f(file);
  auto pos = f.rfind('/');
  return pos == std::string_view::npos ? f : f.substr(pos + 1);
}
}  // namespace

void throw_error(ErrorCode code, const char* file, int line, std::string_view what,
                 const std::string& detail) {
  // "<detail> [<code>: <what> at <file>:<line>]": the fix first, the provenance after.
  throw Error(code, fmt::format("{} [{}: {} at {}:{}]", detail, to_string(code), what,
                                basename(file), line));
}

void throw_cuda_error(int status, const char* call, const char* file, int line) {
#if QUINTET_HAS_CUDA
  const char* text = cudaGetErrorString(static_cast<cudaError_t>(status));
  const char* name = cudaGetErrorName(static_cast<cudaError_t>(status));
#else
  const char* text = "CUDA is not built into this Quintet";
  const char* name = "?";
#endif
  throw_error(ErrorCode::Cuda, file, line, call,
              fmt::format("CUDA call failed: {} ({}, code {})", text, name, status));
}

void throw_nccl_error(int status, const char* call, const char* file, int line) {
#if QUINTET_HAS_NCCL
  const char* text = ncclGetErrorString(static_cast<ncclResult_t>(status));
#else
  const char* text = "NCCL is not built into this Quintet";
#endif
  throw_error(ErrorCode::Nccl, file, line, call,
              fmt::format("NCCL call failed: {} (code {})", text, status));
}

void throw_mpi_error(int status, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = "unknown MPI error (MPI not initialised)";
  int len = 0, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // OpenMPI aborts the process if MPI_Error_string is called outside MPI_Init..MPI_Finalize.
  if (initialized && !finalized && MPI_Error_string(status, text, &len) != MPI_SUCCESS) {
    text[0] = '\0';
  }
  throw_error(ErrorCode::Mpi, file, line, call,
              fmt::format("MPI call failed: {} (code {})", text, status));
}

}  // namespace detail
}  // namespace quintet
