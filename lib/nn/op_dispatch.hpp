// Private: QUINTET_NN_DISPATCH, the one place that picks the CPU or the CUDA implementation of an
// op (see the top of lib/nn/ops.cpp for how CUDA is switched on).
#pragma once

#include "nn/cpu/cpu_ops.hpp"
#include "nn/cuda/cuda_ops.hpp"
#include "quintet/core/config.hpp"

#if QUINTET_HAS_CUDA && QUINTET_NN_CUDA_OPS
#include "quintet/core/device_guard.hpp"
#define QUINTET_NN_HAS_CUDA_OPS 1
#else
#define QUINTET_NN_HAS_CUDA_OPS 0
#endif

namespace quintet::nn::detail {
// Throws InvalidArgument: op was called on a CUDA device in a build without the CUDA nn kernels.
[[noreturn]] void throw_no_cuda_ops(const char* op, const Device& device);
}  // namespace quintet::nn::detail

// QUINTET_NN_DISPATCH(checker, stream, fn, args...): calls cuda_ops::fn(args..., stream) for a
// CUDA device (with the device made current), else cpu_ops::fn(args...). OpChecker's constructor
// has already rejected a CUDA device when the kernels are not built.
#if QUINTET_NN_HAS_CUDA_OPS
#define QUINTET_NN_DISPATCH(checker, stream, fn, ...)                  \
  do {                                                                 \
    if ((checker).on_cuda()) {                                         \
      const ::quintet::DeviceGuard quintet_guard_((checker).device()); \
      ::quintet::nn::cuda_ops::fn(__VA_ARGS__, (stream));              \
    } else {                                                           \
      ::quintet::nn::cpu_ops::fn(__VA_ARGS__);                         \
    }                                                                  \
  } while (0)
// QUINTET_NN_DISPATCH_ARGS(checker, fn, (cpu args...), (cuda args...)): the same where the two
// implementations take different arguments (the CUDA one fuses more); the CUDA list ends with
// the stream.
#define QUINTET_NN_DISPATCH_ARGS(checker, fn, cpu_args, cuda_args)     \
  do {                                                                 \
    if ((checker).on_cuda()) {                                         \
      const ::quintet::DeviceGuard quintet_guard_((checker).device()); \
      ::quintet::nn::cuda_ops::fn cuda_args;                           \
    } else {                                                           \
      ::quintet::nn::cpu_ops::fn cpu_args;                             \
    }                                                                  \
  } while (0)
#else
#define QUINTET_NN_DISPATCH_ARGS(checker, fn, cpu_args, cuda_args)                  \
  do {                                                                              \
    if ((checker).on_cuda()) {                                                      \
      ::quintet::nn::detail::throw_no_cuda_ops((checker).op(), (checker).device()); \
    }                                                                               \
    ::quintet::nn::cpu_ops::fn cpu_args;                                            \
  } while (0)
#define QUINTET_NN_DISPATCH(checker, stream, fn, ...)                               \
  do {                                                                              \
    if ((checker).on_cuda()) {                                                      \
      ::quintet::nn::detail::throw_no_cuda_ops((checker).op(), (checker).device()); \
    }                                                                               \
    (void)(stream);                                                                 \
    ::quintet::nn::cpu_ops::fn(__VA_ARGS__);                                        \
  } while (0)
#endif
