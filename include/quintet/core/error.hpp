// quintet::Error, the one exception type of Quintet, and the checking macros that build it.
//
// Every failure the library reports is a quintet::Error carrying an ErrorCode that says whose
// fault it was (bad input, a CUDA/NCCL/MPI failure, the system, a timeout, another rank) and a
// message naming the call or condition, file:line, and what was expected. The library never
// calls exit() or abort(); destructors never throw.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace quintet {

enum class ErrorCode {
  InvalidArgument,  // the caller passed something wrong; the message says how to fix it
  Cuda,             // a CUDA runtime or library call failed
  Nccl,             // an NCCL call failed
  Mpi,              // an MPI call failed
  System,           // the operating system (files, sockets, memory) failed
  Timeout,          // an operation did not finish in time
  Remote,           // another rank failed, and this one fails because of it
  Aborted,          // the operation was cancelled (communicator aborted, loader stopped)
};

// Name of a code, e.g. "InvalidArgument".
std::string_view to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
// Builds the message "<what> [<code>] at <file>:<line>: <detail>" and throws.
[[noreturn]] void throw_error(ErrorCode code, const char* file, int line, std::string_view what,
                              const std::string& detail);
// Library error strings; these exist in every build (they say "CUDA not built" without CUDA).
[[noreturn]] void throw_cuda_error(int status, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(int status, const char* call, const char* file, int line);
[[noreturn]] void throw_mpi_error(int status, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace quintet

// QUINTET_CHECK(cond, "format {}", args...): throws InvalidArgument when cond is false.
#define QUINTET_CHECK(cond, ...)                                                                \
  do {                                                                                          \
    if (!(cond)) [[unlikely]] {                                                                 \
      ::quintet::detail::throw_error(::quintet::ErrorCode::InvalidArgument, __FILE__, __LINE__, \
                                     "check failed: " #cond, ::fmt::format(__VA_ARGS__));       \
    }                                                                                           \
  } while (0)

// QUINTET_THROW(code, "format {}", args...): throws an Error with the given ErrorCode.
#define QUINTET_THROW(code, ...)                                                          \
  ::quintet::detail::throw_error(::quintet::ErrorCode::code, __FILE__, __LINE__, "error", \
                                 ::fmt::format(__VA_ARGS__))

// QUINTET_CUDA_CHECK(cudaMemcpy(...)): throws Cuda with cudaGetErrorString on failure.
#define QUINTET_CUDA_CHECK(call)                                                       \
  do {                                                                                 \
    const int quintet_status_ = static_cast<int>(call);                                \
    if (quintet_status_ != 0) [[unlikely]] {                                           \
      ::quintet::detail::throw_cuda_error(quintet_status_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

// QUINTET_NCCL_CHECK(ncclAllReduce(...)): throws Nccl with ncclGetErrorString on failure.
// ncclInProgress (7, non-blocking communicators) is not a failure and is let through.
#define QUINTET_NCCL_CHECK(call)                                                       \
  do {                                                                                 \
    const int quintet_status_ = static_cast<int>(call);                                \
    if (quintet_status_ != 0 && quintet_status_ != 7) [[unlikely]] {                   \
      ::quintet::detail::throw_nccl_error(quintet_status_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

// QUINTET_MPI_CHECK(MPI_Allreduce(...)): throws Mpi with MPI_Error_string on failure.
#define QUINTET_MPI_CHECK(call)                                                       \
  do {                                                                                \
    const int quintet_status_ = (call);                                               \
    if (quintet_status_ != 0) [[unlikely]] {                                          \
      ::quintet::detail::throw_mpi_error(quintet_status_, #call, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
