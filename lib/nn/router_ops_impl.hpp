// Private: the CPU and CUDA implementations of quintet/nn/router_ops.hpp, called by the dispatch
// in lib/nn/router_ops.cpp. The dispatch has checked shapes, dtypes and devices; inputs are
// contiguous 2-D tensors; outputs are preallocated and contiguous. C++17-clean (included by
// lib/nn/cuda/router.cu).
#pragma once

#include "quintet/core/config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn::cpu_ops {

// x [T, d] (f32/f64), w [E, d] f32 -> logits [T, E] f32.
void router_logits_forward(const Tensor& x, const Tensor& w, const Tensor& logits);
// dlogits [T, E] f32, w [E, d] f32 -> dx [T, d] (f32/f64).
void router_logits_backward_input(const Tensor& dlogits, const Tensor& w, const Tensor& dx);
// dlogits [T, E] f32, x [T, d] (f32/f64); dw [E, d] f32 +=.
void router_logits_backward_weight(const Tensor& dlogits, const Tensor& x, const Tensor& dw);

}  // namespace quintet::nn::cpu_ops

#if QUINTET_HAS_CUDA
namespace quintet::nn::cuda_ops {

// As the CPU functions above with x and dx bf16 or f32, queued on stream.
void router_logits_forward(const Tensor& x, const Tensor& w, const Tensor& logits,
                           const Stream& stream);
void router_logits_backward_input(const Tensor& dlogits, const Tensor& w, const Tensor& dx,
                                  const Stream& stream);
void router_logits_backward_weight(const Tensor& dlogits, const Tensor& x, const Tensor& dw,
                                   const Stream& stream);

}  // namespace quintet::nn::cuda_ops
#endif
