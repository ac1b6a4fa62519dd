// The MoE router's logits as fused ops: logits = x · wᵀ with x in its own dtype (bf16 on a GPU)
// and the weight, the products and the sums in f32, without an f32 copy of x. Same results as
// cast(x, f32) then linear_forward / linear_backward_* in f32, up to the order of the f32 sums.
//
// Shapes: x [T, d] (T tokens), w [E, d] (E experts, 1..kRouterMaxExperts), logits and dlogits
// [T, E]. x is a compute tensor of ops.hpp (CPU f32/f64, CUDA bf16/f32); w, logits, dlogits and
// dw are f32 on every device. Every op queues its work on stream (no host synchronisation) and
// throws InvalidArgument for bad input before any work is queued. This header is C++17-clean.
#pragma once

#include <cstdint>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn {

// The most experts the router ops take.
inline constexpr std::int64_t kRouterMaxExperts = 256;

// logits[t, e] = sum_k float(x[t, k]) * w[e, k], accumulated in f32. Returns logits [T, E] f32.
Tensor router_logits_forward(const Tensor& x, const Tensor& w, const Stream& stream);

// dx[t, k] = sum_e dlogits[t, e] * w[e, k], accumulated in f32 and rounded once into dtype (a
// compute dtype of the stream's device, normally x's). Returns dx [T, d] of dtype.
Tensor router_logits_backward_input(const Tensor& dlogits, const Tensor& w, DType dtype,
                                    const Stream& stream);

// dw[e, k] += sum_t dlogits[t, e] * float(x[t, k]): the sum over the tokens in f32, then added
// to dw [E, d] (f32, contiguous, written in place). On a GPU the sum runs in a fixed order
// (per-chunk partials added in chunk order), so it is the same from run to run.
void router_logits_backward_weight(const Tensor& dlogits, const Tensor& x, const Tensor& dw,
                                   const Stream& stream);

}  // namespace quintet::nn
