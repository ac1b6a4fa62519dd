// Private: the CUDA kernels of the router's functions (router.cpp: the aux loss from its
// statistics, the step's load; routing itself runs as the fused nn ops), implemented in
// parallel/expert/cuda/moe_kernels.cu. Each function queues work on `stream` (its device current)
// and never synchronises the host. Tensors are contiguous and on stream.device(); shapes and
// dtypes are checked by the callers. C++17-clean: the .cu file includes it.
#pragma once

#include <cstdint>

#include "quintet/core/config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

#if QUINTET_HAS_CUDA
namespace quintet::expert::cuda {

// acc [1] f64 += coeff * E / G * sum_ge counts * prob_sum / (n^2 k).
void aux_loss(const Tensor& counts, const Tensor& prob_sum, double group_tokens, int top_k,
              double coeff, const Tensor& acc, const Stream& stream);
// acc [E] f64 += counts [E] i64 (a step's load per expert, from moe_permute's counts).
void add_counts(const Tensor& counts, const Tensor& acc, const Stream& stream);

}  // namespace quintet::expert::cuda
#endif  // QUINTET_HAS_CUDA
