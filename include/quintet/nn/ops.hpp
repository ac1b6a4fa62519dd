// The compute ops of Quintet's models: every op as a free function with an explicit forward and
// backward, taking Tensors and the Stream it runs on, dispatching on the tensors' device.
//
// Devices and dtypes:
//   - CPU: f32 (f64 also accepted, for gradient checks against finite differences); work runs
//     synchronously on the calling thread.
//   - CUDA: activations/weights in bf16 (f32 accepted too) with f32 accumulation; asynchronous on
//     `stream`. All "compute" inputs of one call share one dtype (call it T).
//   - Saved statistics (mean, rstd, log-sum-exp, counts) and parameter gradients (dw, db, dgamma,
//     dbeta, dtable) have dtype accum_dtype(T): f32, or f64 when T is f64. Parameter gradients are
//     ACCUMULATED (+=) into tensors the caller owns, so
//     several microbatches add up and a flat gradient buffer can be written in place. Input
//     gradients (dx, dq, ...) are fresh tensors of dtype T, OVERWRITTEN (returned). Below,
//     "f32" for a statistic or a gradient accumulator means accum_dtype(T).
//   - Every tensor of a call and the stream must be on the same device.
// Shapes are in elements. Inputs may be strided (they are made contiguous on `stream` when
// needed); accumulated outputs must be contiguous. Returned tensors are contiguous, allocated on
// `stream`'s device (in its pool on a GPU). Bad input (shape, dtype, device mismatch, bad option)
// throws quintet::Error(InvalidArgument) before any work is queued. A CUDA tensor in a build
// without the CUDA nn kernels also throws InvalidArgument, never crashes.
//
// This header is C++17-clean (it is included by .cu sources through lib/nn/cuda/cuda_ops.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/core/dtype.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn {

// The dtype of statistics and gradient accumulators for compute dtype T: f64 for f64, else f32.
inline DType accum_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }

// ---- linear: y = x · wᵀ + b ----------------------------------------------------------------
// x [..., in] (T), w [out, in] (T), b [out] (T) or undefined for no bias. Returns y [..., out].
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Stream& stream);
// dx = dy · w: dy [..., out], w [out, in]. Returns dx [..., in] (T).
Tensor linear_backward_input(const Tensor& dy, const Tensor& w, const Stream& stream);
// dw += dyᵀ · x over all leading dims; db += sum of dy over leading dims (skipped when db is
// undefined). dy [..., out], x [..., in], dw [out, in] f32, db [out] f32. Split from
// linear_backward_input so a pipeline schedule can run the weight gradient later.
void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            const Stream& stream);
// The same with accumulate_dw = false: dw = dyᵀ · x, OVERWRITTEN (every element, zeros for no
// rows), db still accumulated: a gradient's first contribution of the step (lazy zeroing,
// quintet/nn/parameter.hpp), bit for bit what accumulating into zeros gives (but for the sign of
// a zero sum).
void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            bool accumulate_dw, const Stream& stream);
// Both of the above: returns dx and accumulates dw, db.
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db, const Stream& stream);

// ---- layernorm / rmsnorm over the last dimension --------------------------------------------
// Each takes an optional residual, for the pre-norm block's `h = x + r; y = norm(h)`: the forward
// then normalises x + residual and returns that sum too; the backward adds dresidual (the
// gradient reaching the sum from elsewhere) into dx. On a GPU the add is fused into the norm's
// kernels; everywhere the result equals the add and the norm run one after the other, bit for
// bit.
struct NormOutput {
  Tensor y;     // like x (T)
  Tensor mean;  // [rows] f32, rows = numel / d; undefined for rmsnorm
  Tensor rstd;  // [rows] f32: 1 / sqrt(var + eps) (layernorm), 1 / sqrt(mean(x²) + eps) (rmsnorm)
  Tensor sum;   // x + residual (like x), what was normalised; undefined without a residual
};
// y = (x - mean) * rstd * gamma + beta. x [..., d], gamma [d] (T), beta [d] (T); eps > 0;
// residual like x, or undefined.
NormOutput layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                             const Stream& stream, const Tensor& residual = Tensor());
// Returns dx (T; + dresidual when defined, like x) and accumulates dgamma [d] f32, dbeta [d] f32
// (either may be undefined to skip). x is what the forward normalised (its sum, with a
// residual); mean and rstd are the forward's saved statistics.
Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                          const Tensor& dbeta, const Stream& stream,
                          const Tensor& dresidual = Tensor());
// y = x * rstd * gamma. x [..., d], gamma [d] (T).
NormOutput rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Stream& stream,
                           const Tensor& residual = Tensor());
// Returns dx (T; + dresidual when defined) and accumulates dgamma [d] f32 (undefined to skip).
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                        const Tensor& dgamma, const Stream& stream,
                        const Tensor& dresidual = Tensor());

// ---- activations ----------------------------------------------------------------------------
// GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))). Any shape.
Tensor gelu_forward(const Tensor& x, const Stream& stream);
Tensor gelu_backward(const Tensor& dy, const Tensor& x, const Stream& stream);  // dx, like x
// SwiGLU: y = silu(gate) * up, silu(a) = a / (1 + exp(-a)). gate and up of one shape.
Tensor swiglu_forward(const Tensor& gate, const Tensor& up, const Stream& stream);
struct SwiGluGrads {
  Tensor dgate;
  Tensor dup;
};
SwiGluGrads swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                            const Stream& stream);
// Softmax over the last dimension (computed in f32, max-subtracted).
Tensor softmax_forward(const Tensor& x, const Stream& stream);
// dx = y * (dy - sum(dy * y)) over the last dimension; y is the forward's output.
Tensor softmax_backward(const Tensor& dy, const Tensor& y, const Stream& stream);

// ---- rotary position embedding (RoPE) -------------------------------------------------------
// Rotates each head's vector by angles proportional to its token's position, in the rotate-half
// convention of Hugging Face's Llama, Qwen and Mixtral code: element i is paired with element
// i + D/2 (not with i + 1), and for i < D/2
//   inv_freq_i = 1 / theta^(2i / D),  a = pos * inv_freq_i,
//   y_i = x_i cos a - x_{i+D/2} sin a,  y_{i+D/2} = x_{i+D/2} cos a + x_i sin a.
// As in Hugging Face's f32 rotary embedding, inv_freq is rounded to f32, the angle is the f32
// product f32(pos) * inv_freq_i and its cosine and sine are taken in f32; the rotation itself is
// computed in f32 and rounded once (f64 inputs on the CPU: everything in f64). The backward of a
// rotation is the rotation by -a.
//
// Positions: token s of batch row b has pos = position_offset + p, where p = positions[b, s] (or
// positions[s], shared by every row) when a positions tensor is given (i32 or i64, on the device
// of x), else p = s. So a rank that holds chunks of a sequence out of order (context parallelism
// with zigzag chunks, sequence-parallel shards) gives each token its true position.
//
// Llama 3's frequency scaling (Hugging Face's rope_type "llama3", Llama 3.1 and later), when
// factor > 0: with L = original_max_position_embeddings and wavelength w_i = 2 pi / inv_freq_i,
// inv_freq_i is kept when w_i < L / high_freq_factor, divided by factor when w_i > L /
// low_freq_factor, and in between (1 - s) inv_freq_i / factor + s inv_freq_i with
// s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
struct RopeScaling {
  double factor = 0.0;  // 0: no scaling; else > 0
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;  // > low_freq_factor
  std::int64_t original_max_position_embeddings = 8192;
};
struct RopeOptions {
  double theta = 10000.0;            // the base, > 0 (rope_theta of the model's config)
  std::int64_t position_offset = 0;  // added to every token's position
  RopeScaling scaling;               // Llama 3's, when scaling.factor > 0
};
// Throws InvalidArgument, naming the field, for a scaling that is on with a factor, frequency
// factors or length out of range (what = the caller, for the message).
void check_rope_scaling(const RopeScaling& scaling, const char* what);
// x [B, S, H, D] (T, any strides: e.g. the q and k heads of a fused qkv projection), D even and
// > 0; positions [S] or [B, S] (i32/i64) or undefined. Returns the rotated x, contiguous.
Tensor rope_forward(const Tensor& x, const Tensor& positions, const RopeOptions& options,
                    const Stream& stream);
// The gradient of rope_forward's input: dy rotated by -a. Same shapes as rope_forward.
Tensor rope_backward(const Tensor& dy, const Tensor& positions, const RopeOptions& options,
                     const Stream& stream);
// The same two in place: x (or dy) is overwritten through its strides, with no copy, so the heads
// of a fused projection are rotated where they lie. Its elements must not overlap (no stride 0).
void rope_forward_(const Tensor& x, const Tensor& positions, const RopeOptions& options,
                   const Stream& stream);
void rope_backward_(const Tensor& dy, const Tensor& positions, const RopeOptions& options,
                    const Stream& stream);

// ---- scaled dot-product self-attention -----------------------------------------------------
// One block of attention over (batch, heads, seq, head_dim). Query row i has global position
// q_offset + i, key row j has global position k_offset + j. With causal = true, query i attends
// key j iff k_offset + j <= q_offset + i; with causal = false every key is visible. So the
// attention of a long sequence can be computed one (query block, key block) pair at a time and
// the blocks merged with their log-sum-exp (context parallelism).
// The CUDA implementation (the CPU ignores it): `cudnn` runs cuDNN's fused flash-attention
// engines through its graph API (builds with cuDNN only; bf16, head_dim 64 or 128, the full mask
// or a causal block with q_offset >= k_offset; any other call with `cudnn` throws
// InvalidArgument saying why); `gemm` computes the scores with tensor-core batched GEMMs (cuBLAS)
// and a fused softmax row kernel, materialising the scores of a bounded chunk of (batch, head)
// pairs at a time; `simt` is the flash-attention-style SIMT kernel (head_dim <= 256, no tensor
// cores, never stores the scores); `automatic` takes `cudnn` where it runs the call, else `gemm`
// when head_dim is a multiple of 16 bytes of the dtype (8 bf16, 4 f32), else `simt`. Every choice
// gives the same results up to rounding, so a forward and a backward may use different ones.
enum class AttentionKernel { automatic, cudnn, gemm, simt };
struct AttentionOptions {
  bool causal = true;
  std::int64_t q_offset = 0;  // >= 0
  std::int64_t k_offset = 0;  // >= 0
  float scale = 0.0f;         // scores = scale * q·k; 0 means 1 / sqrt(head_dim)
  AttentionKernel kernel = AttentionKernel::automatic;
};
struct AttentionOutput {
  Tensor out;  // [B, H, Sq, D] (T)
  Tensor lse;  // [B, H, Sq] f32: log(sum_j exp(score_ij)) over visible keys; -inf for a row that
               // sees no key (its out row is 0)
};
// q [B, H, Sq, D], k and v [B, Hkv, Sk, D], all T. Sq and Sk may differ. Grouped-query attention:
// Hkv divides H and query head h reads key/value head h / (H / Hkv) (Hkv = H: multi-head, Hkv = 1:
// multi-query); K and V are read in place for every query head of their group, never repeated in
// memory. Every tensor operand of
// the attention ops may be a strided view, such as the heads of a fused [B, S, 3, H, D]
// projection (transposed to [B, H, S, D]): on a GPU, cuDNN reads and writes such views in place
// when head_dim is contiguous and each row starts 16-byte aligned; other kernels and the CPU work
// on contiguous copies.
AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionOptions& options, const Stream& stream);
// The same, writing the output into out [B, H, Sq, D] (T, any strides: e.g. o.transpose(1, 2) of
// an o [B, Sq, H, D], so that merging the heads back needs no copy); returns the lse.
Tensor attention_forward_into(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionOptions& options, const Tensor& out,
                              const Stream& stream);
struct AttentionGrads {
  Tensor dq;  // [B, H, Sq, D] (T)
  Tensor dk;  // [B, Hkv, Sk, D] (T): summed over the query heads of each group
  Tensor dv;  // [B, Hkv, Sk, D] (T)
};
// Gradients of one block. out and lse are the outputs the loss saw: for a single block those of
// attention_forward; for a merged multi-block attention, the MERGED out and lse (flash-attention
// form: P = exp(score - lse), dS = P * (dout·vᵀ - rowsum(dout * out))), so the per-block grads
// add up to the grads of the whole. Same options as the forward.
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const AttentionOptions& options, const Stream& stream);
// The same, writing the gradients into dq [B, H, Sq, D] and dk, dv [B, Hkv, Sk, D] (T, any strides:
// e.g. the heads of one fused [B, S, 3, H, D] gradient).
void attention_backward_into(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                             const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Stream& stream);

// Attention over the heads of a fused projection, read in place: qkv [B, S, 3, H, D] (T,
// contiguous; q, k and v head groups along dim 2) -> out [B, S, H, D] (contiguous, ready for the
// output projection) and lse [B, H, S]. The backward takes dout [B, S, H, D] and returns dqkv
// [B, S, 3, H, D]. The same math as attention_forward / attention_backward on the split heads.
struct FusedQkvAttention {
  Tensor out;  // [B, S, H, D]
  Tensor lse;  // [B, H, S] f32
};
FusedQkvAttention fused_qkv_attention_forward(const Tensor& qkv, const AttentionOptions& options,
                                              const Stream& stream);
Tensor fused_qkv_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, const AttentionOptions& options,
                                    const Stream& stream);
// Head group i (0: q, 1: k, 2: v) of qkv [B, S, 3, H, D] as a [B, H, S, D] view (no copy).
Tensor fused_qkv_heads(const Tensor& qkv, int i);

// Merges one more block into a running multi-block attention, in place (context parallelism: the
// blocks of one query chunk against each key chunk): with L = log(exp(lse) + exp(lse_b)),
// out = out * exp(lse - L) + out_b * exp(lse_b - L) and lse = L, row by row, in f32 (f64 for
// f64). A row that sees no key in either (both -inf) stays out 0, lse -inf. out [B, H, S, D] (T,
// contiguous) and lse [B, H, S] (f32, contiguous) as attention_forward returns them; out_b and
// lse_b the same shapes and dtypes.
void attention_merge_(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                      const Tensor& lse_b, const Stream& stream);

// ---- embedding ------------------------------------------------------------------------------
// y[..., :] = table[ids[...], :]. ids [...] i32 or i64, table [V, D] (T); returns y [..., D].
// An id outside [0, V) throws on the CPU; on a GPU (where checking would synchronise) its row of
// y is zero and its gradient is dropped.
Tensor embedding_forward(const Tensor& ids, const Tensor& table, const Stream& stream);
// dtable[ids[...], :] += dy[..., :] (scatter-add; repeated ids add up). dtable [V, D] f32.
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                        const Stream& stream);

// ---- cross-entropy fused with the softmax over the vocabulary -------------------------------
struct CrossEntropyOutput {
  Tensor loss;         // scalar (shape []) f32: mean over valid tokens of lse - logit[target];
                       // 0 when no token is valid
  Tensor lse;          // [N] f32 per-token log-sum-exp of the logits (saved for backward)
  Tensor valid_count;  // scalar f32: number of tokens whose target != ignore_index
};
// logits [..., V] (T), targets [...] i32 or i64 (N = numel of targets). A target equal to
// ignore_index is skipped; any other target outside [0, V) throws on the CPU, and on a GPU counts
// as ignored. Computed as the vocabulary-parallel cross-entropy (vocab_parallel_ops.hpp) of one
// shard holding the whole vocabulary: the same kernels, so the two agree.
CrossEntropyOutput cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                         std::int64_t ignore_index, const Stream& stream);
// dlogits = dloss * (softmax(logits) - onehot(target)) / max(valid_count, 1), zero rows for
// ignored tokens. lse and valid_count come from the forward; dloss is the gradient of the loss
// (1 for a plain mean, 1/k to average k microbatches). Returns dlogits like logits (T).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& valid_count, float dloss, std::int64_t ignore_index,
                              const Stream& stream);

// ---- mixture-of-experts routing and permutation ---------------------------------------------
// The router of an MoE layer in one pass over its logits, and the permutation of the tokens' rows
// into expert order and back (the MoE layer of quintet/parallel/expert composes them). T tokens,
// E experts, k experts per token (1 <= k <= min(8, E)); assignment a = t k + j is token t's j-th
// choice.
//
// Scores: probs = softmax(logits) over the E experts, or sigmoid(logits) elementwise. Selection:
// the k experts with the largest probs + bias (bias: the auxiliary-loss-free balancing bias, for
// selection only), in order of decreasing selection score, ties to the lower expert index.
// Weights: probs at the selected experts; with renormalize, divided by their sum over the k.
// Statistics, over `groups` equal groups of consecutive tokens (the aux loss's: the MoE layer uses
// one per sequence): per group and expert, the selected assignments and the sum of probs; and the
// sum over tokens of lse² (the z loss's), lse = logsumexp(logits row).
// On a GPU, one kernel routes a tile of tokens per block (a warp per token: the scores, k rounds
// of a warp argmax, the weights and the tile's statistics) and a second one sums the tiles'
// statistics in a fixed order, so a run repeats bit for bit. The CPU computes the scores in f64
// and rounds them to f32.
enum class RouteScore { softmax, sigmoid };
struct RouteOptions {
  int top_k = 2;
  RouteScore score = RouteScore::softmax;
  bool renormalize = true;
  std::int64_t groups = 0;  // > 0: the aux statistics over that many groups (divides T); 0: none
  double z_scale = 0.0;     // z_sum += z_scale * sum_t lse_t², when z_sum is defined
};
struct RouteOutput {
  Tensor probs;     // [T, E] f32
  Tensor experts;   // [T, k] i32
  Tensor weights;   // [T, k] f32
  Tensor kept;      // [T, k] u8, all 1 (moe_drop_over_capacity_ clears them)
  Tensor lse;       // [T] f32: logsumexp of each logits row
  Tensor counts;    // [groups, E] f32: selected assignments (undefined for groups = 0)
  Tensor prob_sum;  // [groups, E] f32: sums of probs (undefined for groups = 0)
};
// logits [T, E] f32; bias [E] f32 or undefined (none); z_sum [1] f64 or undefined: accumulates
// z_scale * sum of lse² (no host wait). E <= 4096 on a GPU. NaN logits give an unspecified
// routing, with every expert index still in [0, E).
RouteOutput moe_route_forward(const Tensor& logits, const Tensor& bias, const RouteOptions& options,
                              const Tensor& z_sum, const Stream& stream);
// The capacity rule: each expert takes at most `capacity` (>= 1) of its assignments, those of the
// largest probs (ties: the earlier assignment); the others get kept = 0 and weight 0, in place.
// probs [T, E], experts [T, k], weights and kept [T, k] as moe_route_forward returns them.
// Returns the assignments dropped on the CPU; -1 on a GPU (count kept = 0 there, e.g. through
// moe_permute's counts), which would have to wait for the device.
std::int64_t moe_drop_over_capacity_(const Tensor& probs, const Tensor& experts,
                                     std::int64_t capacity, const Tensor& weights,
                                     const Tensor& kept, const Stream& stream);
// The gradient of the router's logits, [T, E] f32, from the loss
//   sum_a dweights[a] * weights[a]  (kept assignments only: a dropped weight is 0)
//   + aux_scale * sum_{t, e} counts[group of t, e] * probs[t, e]  (counts undefined: no term)
//   + z_scale * sum_t lse_t²
// (the counts are whole-group statistics, summed over the ranks holding parts of a group; the
// counts' rows G divide T). logits, probs, experts, kept and lse are the forward's (kept after the
// capacity). One warp per token on a GPU.
Tensor moe_route_backward(const Tensor& dweights, const Tensor& logits, const Tensor& probs,
                          const Tensor& experts, const Tensor& kept, const Tensor& lse,
                          const Tensor& counts, double aux_scale, double z_scale,
                          const RouteOptions& options, const Stream& stream);

// The permutation of the kept assignments into expert order (then by assignment: token, then
// choice), stable and deterministic, fused with the gather of their token rows: sorted row i (i <
// the kept assignments) is x[source[i] / k], the rows past them are zero.
struct PermuteOutput {
  Tensor rows;     // [T k, d] (like x): the token rows in expert order
  Tensor counts;   // [E] i64: kept assignments per expert
  Tensor offsets;  // [E + 1] i64: expert e's rows are [offsets[e], offsets[e + 1]) (on the device:
                   // an expert GEMM reads them without a host synchronisation)
  Tensor source;   // [T k] i32: the assignment of each sorted row, -1 past the kept ones
  Tensor slot;     // [T, k] i32: each assignment's sorted row, -1 when dropped
};
// x [T, d] (T), experts [T, k] i32 (in [0, num_experts): not checked on a GPU), kept [T, k] u8.
PermuteOutput moe_permute(const Tensor& x, const Tensor& experts, const Tensor& kept,
                          std::int64_t num_experts, const Stream& stream);
// The un-permutation fused with the weighted combine: y [T, d] with y[t] = sum over t's kept
// assignments of weights[t, j] * rows[slot[t, j]] (weights [T, k] f32, or undefined: 1, which is
// moe_permute's backward: d(x) from d(rows)), accumulated in f32. rows [R, d] with R above every
// slot (the first R sorted rows).
Tensor moe_unpermute(const Tensor& rows, const Tensor& slot, const Tensor& weights,
                     const Stream& stream);
// The same, writing y into out [T, d] (like rows, contiguous: e.g. a block of rows of a larger
// output, so that chunks of tokens land in place without a copy).
void moe_unpermute_into(const Tensor& rows, const Tensor& slot, const Tensor& weights,
                        const Tensor& out, const Stream& stream);
struct UnpermuteGrads {
  Tensor drows;     // [R, d] like rows: weights[a] * dy[t] at sorted row slot[a], 0 on other rows
  Tensor dweights;  // [T, k] f32: dy[t] . rows[slot[a]], 0 where dropped
};
// The backward of moe_unpermute with weights: dy [T, d]; source and slot from moe_permute
// (R <= T k).
UnpermuteGrads moe_unpermute_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                                      const Tensor& source, const Tensor& weights,
                                      const Stream& stream);

// ---- AdamW (decoupled weight decay, bias correction) -----------------------------------------
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};
// One fused update of one tensor, in f32, for step t >= 1 (the first step is t = 1):
//   g = grad * grad_scale;  p -= lr * weight_decay * p
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g²
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// master (the f32 master weights), grad, exp_avg (m), exp_avg_sq (v): f32 (or all f64 on the
// CPU), one shape, contiguous;
// master, exp_avg and exp_avg_sq are updated in place. When param (same shape, any float dtype,
// contiguous) is defined, the updated master is also written into it, converted (the
// compute-dtype copy the model uses). grad_scale folds gradient clipping into the update.
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale, const Tensor& param, const Stream& stream);

// One AdamW update of many tensors at once, with the clip factor computed where the norm is:
// grad_scale = clip_scale(sqrt(sum_sq), max_grad_norm) for every tensor, so the host never reads
// the norm (on a GPU: one kernel launch per 64 tensors, no host synchronisation; adamw_step
// would be one launch per tensor and a host read of the norm first). sum_sq: a scalar f32 tensor
// on the tensors' device, the global sum of squares of the gradients (sum_of_squares,
// all-reduced over the ranks that share the norm). When it is inf or nan nothing is updated.
// Each entry is checked as adamw_step checks its tensors; the defined params share one dtype.
// hyper.weight_decay applies to the entries whose weight_decay is set.
struct AdamWTensors {
  Tensor master, grad, exp_avg, exp_avg_sq, param;
  bool weight_decay = true;
};
void adamw_step_many(const std::vector<AdamWTensors>& tensors, const AdamWHyper& hyper,
                     std::int64_t step, const Tensor& sum_sq, float max_grad_norm,
                     const Stream& stream);
// The factor the gradients are multiplied by for a global norm: max_grad_norm / (norm + 1e-6)
// when max_grad_norm > 0 and norm > max_grad_norm, else 1.
float clip_scale(double norm, float max_grad_norm);

// ---- element-wise and reductions ------------------------------------------------------------
// Backward of these is trivial and needs no function: add's gradient is dy for both inputs,
// scale's is scale(dy, alpha), cast's is cast(dy, x.dtype()).
// out = a + b (same shape, dtype, device).
Tensor add(const Tensor& a, const Tensor& b, const Stream& stream);
// dst += alpha * src in place (dst contiguous; dst may be f32 while src is T, for accumulating
// gradients). Same shape.
void add_(const Tensor& dst, const Tensor& src, float alpha, const Stream& stream);
// out = alpha * x.
Tensor scale(const Tensor& x, float alpha, const Stream& stream);
// x *= alpha in place (x contiguous).
void scale_(const Tensor& x, float alpha, const Stream& stream);
// A copy of x converted to dtype (x itself when already of dtype).
Tensor cast(const Tensor& x, DType dtype, const Stream& stream);
// sum over all tensors of sum(x²), computed in f32, as a scalar f32 tensor on their device; no
// host synchronisation (so it can be all-reduced before the square root). The tensors may differ
// in shape and dtype but share one device; an empty list gives a CPU 0.
Tensor sum_of_squares(const std::vector<Tensor>& tensors, const Stream& stream);
// sqrt(sum_of_squares(tensors)) read back to the host: synchronises stream.
double global_norm(const std::vector<Tensor>& tensors, const Stream& stream);

}  // namespace quintet::nn
