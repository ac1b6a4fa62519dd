// Private: the CUDA kernels of the router's step-by-step functions (router.cpp; the MoE layer runs
// the fused nn ops instead), implemented in parallel/expert/cuda/moe_kernels.cu. Each function
// queues work on `stream` (its device current) and never synchronises the host. Tensors are
// contiguous and on stream.device(); shapes and dtypes are checked by the callers: f32 (scores),
// i32 (experts), u8 (kept). C++17-clean: the .cu file includes it.
#pragma once

#include <cstdint>

#include "quintet/core/config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

#if QUINTET_HAS_CUDA
namespace quintet::expert::cuda {

// d(probs) [T, E] (overwritten) from d(weights) [T, k], as router.hpp's weights_backward.
void weights_backward(const Tensor& probs, const Tensor& experts, const Tensor& kept,
                      const Tensor& dweights, bool renormalize, const Tensor& dprobs,
                      const Stream& stream);
// d(logits) [T, E] (overwritten) from d(probs) through the softmax or the sigmoid.
void scores_backward(const Tensor& probs, const Tensor& dprobs, bool softmax, const Tensor& dlogits,
                     const Stream& stream);

// counts, prob_sum [G, E] (overwritten) over G groups of consecutive tokens.
void aux_stats(const Tensor& probs, const Tensor& experts, const Tensor& counts,
               const Tensor& prob_sum, const Stream& stream);
// acc [1] f64 += coeff * E / G * sum_ge counts * prob_sum / (n^2 k).
void aux_loss(const Tensor& counts, const Tensor& prob_sum, double group_tokens, int top_k,
              double coeff, const Tensor& acc, const Stream& stream);
// dprobs[t, e] += factor * counts[t / (T / G), e].
void add_aux_loss_grad(const Tensor& counts, double factor, const Tensor& dprobs,
                       const Stream& stream);
// acc [1] f64 += coeff * mean_t lse_t^2 (T > 0).
void z_loss(const Tensor& logits, double coeff, const Tensor& acc, const Stream& stream);
// acc [E] f64 += counts [E] i64 (a step's load per expert, from moe_permute's counts).
void add_counts(const Tensor& counts, const Tensor& acc, const Stream& stream);
// dlogits += factor * 2 * lse_t * softmax(logits_t).
void add_z_loss_grad(const Tensor& logits, double factor, const Tensor& dlogits,
                     const Stream& stream);

}  // namespace quintet::expert::cuda
#endif  // QUINTET_HAS_CUDA
