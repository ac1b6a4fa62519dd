// Private: the CPU and CUDA implementations of quintet/nn/vocab_parallel_ops.hpp, called by the
// dispatch in lib/nn/vocab_parallel_ops.cpp. Same contract as cpu_ops.hpp / cuda_ops.hpp: the
// dispatch has checked shapes, dtypes and devices; inputs are contiguous with leading dims
// flattened (rows = N); outputs are preallocated and contiguous; statistics are accum_dtype(T).
// C++17-clean (included by lib/nn/cuda/vocab_parallel.cu).
#pragma once

#include <cstdint>

#include "quintet/core/config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn::cpu_ops {

// ids [N], table [V_local, D] -> y [N, D].
void vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table,
                                      std::int64_t vocab_start, std::int64_t vocab_size,
                                      const Tensor& y);
// dy [N, D], ids [N]; accumulate dtable [V_local, D].
void vocab_parallel_embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                                       std::int64_t vocab_start);
// logits [N, V_local], targets [N] -> partials [3, N] (or [1, 3, N]). Throws InvalidArgument,
// naming op, on a target outside [0, vocab_size) that is not ignore_index.
void vocab_parallel_ce_partials(const char* op, const Tensor& logits, const Tensor& targets,
                                std::int64_t vocab_start, std::int64_t vocab_size,
                                std::int64_t ignore_index, const Tensor& partials);
// gathered [R, 3, N], targets [N] -> loss [], lse [N], valid_count [].
void vocab_parallel_ce_combine(const Tensor& gathered, const Tensor& targets,
                               std::int64_t vocab_size, std::int64_t ignore_index,
                               const Tensor& loss, const Tensor& lse, const Tensor& valid_count);
// logits [N, V_local] -> dlogits [N, V_local].
void vocab_parallel_ce_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& valid_count, float dloss, std::int64_t vocab_start,
                                std::int64_t vocab_size, std::int64_t ignore_index,
                                const Tensor& dlogits);

}  // namespace quintet::nn::cpu_ops

#if QUINTET_HAS_CUDA
namespace quintet::nn::cuda_ops {

// As the CPU functions above, queued on stream (no host synchronisation).
void vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table,
                                      std::int64_t vocab_start, std::int64_t vocab_size,
                                      const Tensor& y, const Stream& stream);
void vocab_parallel_embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                                       std::int64_t vocab_start, const Stream& stream);
void vocab_parallel_ce_partials(const Tensor& logits, const Tensor& targets,
                                std::int64_t vocab_start, std::int64_t vocab_size,
                                std::int64_t ignore_index, const Tensor& partials,
                                const Stream& stream);
void vocab_parallel_ce_combine(const Tensor& gathered, const Tensor& targets,
                               std::int64_t vocab_size, std::int64_t ignore_index,
                               const Tensor& loss, const Tensor& lse, const Tensor& valid_count,
                               const Stream& stream);
void vocab_parallel_ce_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& valid_count, float dloss, std::int64_t vocab_start,
                                std::int64_t vocab_size, std::int64_t ignore_index,
                                const Tensor& dlogits, const Stream& stream);

}  // namespace quintet::nn::cuda_ops
#endif
