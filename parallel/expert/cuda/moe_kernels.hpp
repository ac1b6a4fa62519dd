// Private: the CUDA kernels of the router's step-by-step functions (router.cpp; the MoE layer runs
// the fused nn ops instead) and of the MoE layer's permutation and combine (permute.cpp),
// implemented in parallel/expert/cuda/moe_kernels.cu. Each function queues work on `stream` (its
// device current) and never synchronises the host. Tensors are contiguous and on stream.device();
// shapes and dtypes are checked by the callers. T = bf16 or f32 where a function takes token rows;
// everything else is f32 (scores), i32 (experts, slots, rows), u8 (kept) and i64 (counts).
// C++17-clean: the .cu file includes it.
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
// dlogits += factor * 2 * lse_t * softmax(logits_t).
void add_z_loss_grad(const Tensor& logits, double factor, const Tensor& dlogits,
                     const Stream& stream);

// The permutation of permute.hpp from experts / kept [n, k]: counts [E] i64 (kept per expert),
// rows_of [n k] i32 (the token of each sorted row; -1 past the kept ones), slot [n k] i32.
void permute(const Tensor& experts, const Tensor& kept, std::int64_t num_experts,
             const Tensor& counts, const Tensor& rows_of, const Tensor& slot, const Stream& stream);
// out [n, d] = sum_j w[t, j] * rows[slot[t, j]] over slot >= 0 (weights undefined: 1), in f32.
void combine(const Tensor& rows, const Tensor& slot, const Tensor& weights, const Tensor& out,
             const Stream& stream);
// drows[slot] = w * dy[t] (rows no assignment points at are left as they are); dweights [n, k]
// = dy[t] . rows[slot] (0 where slot < 0).
void combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                      const Tensor& weights, const Tensor& drows, const Tensor& dweights,
                      const Stream& stream);

}  // namespace quintet::expert::cuda
#endif  // QUINTET_HAS_CUDA
