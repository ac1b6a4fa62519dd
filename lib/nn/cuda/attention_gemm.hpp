// Private: the tensor-core attention of lib/nn/cuda/attention_gemm.cu (batched cuBLAS GEMMs with a
// fused softmax row kernel), called by the dispatch in lib/nn/cuda/attention.cu. Same contract as
// cuda_ops::attention_forward / attention_backward (cuda_ops.hpp): inputs contiguous, outputs
// preallocated, options.scale resolved, work queued on stream. Any head_dim and sequence lengths.
// C++17.
#pragma once

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn::cuda_ops {

// True when AttentionKernel::automatic picks the GEMM path for q (head_dim a multiple of 16 bytes).
bool attention_gemm_preferred(const Tensor& q);

void attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionOptions& options, const Tensor& out, const Tensor& lse,
                            const Stream& stream);
void attention_backward_gemm(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                             const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Stream& stream);

}  // namespace quintet::nn::cuda_ops
