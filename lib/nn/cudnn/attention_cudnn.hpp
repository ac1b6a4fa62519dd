// Private: scaled dot-product attention through cuDNN's fused flash-attention engines (its
// graph API, lib/nn/cudnn/attention_cudnn.cpp), called by the dispatch in lib/nn/cuda/attention.cu
// before the kernels of our own. Built only with cuDNN (QUINTET_HAS_CUDNN). Same contract as
// cuda_ops::attention_forward / attention_backward (cuda_ops.hpp): outputs preallocated,
// options.scale resolved, work queued on stream, no host synchronisation. The operands (all but
// the lse) may have any strides whose head_dim is contiguous and whose rows start 16-byte
// aligned — such as the heads of a fused [B, S, 3, H, D] projection, read and written in place;
// plans are built per layout.
//
// What cuDNN runs: bf16 q, k, v with head_dim 64 or 128, as many or fewer key/value heads than
// query heads (grouped-query attention, K and V never repeated in memory), any sequence lengths,
// the full mask or the causal one with q_offset >= k_offset (the diagonal shifted by q_offset -
// k_offset, so every query sees at least one key: the blocks ring attention computes). Anything
// else, or a shape for which cuDNN offers no engine, returns false and the caller runs its own
// kernels. The log-sum-exp is ours (natural log of the sum of exp of the scaled scores over visible
// keys): cuDNN's softmax statistics are built in the graph as exactly that. Execution plans are
// cached per (device, stream, shape, mask kind); thread-safe. C++17.
#pragma once

#include <string>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn::cuda_ops {

// Queues the forward through cuDNN and returns true; or returns false having queued nothing and,
// when why is not null, sets *why to the reason (dtype, head_dim, offsets, no cuDNN engine).
bool attention_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& options, const Tensor& out, const Tensor& lse,
                             const Stream& stream, std::string* why);
// The same for the backward (dq, dk, dv overwritten).
bool attention_backward_cudnn(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                              const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Stream& stream, std::string* why);

}  // namespace quintet::nn::cuda_ops
