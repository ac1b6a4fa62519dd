// Private: the CUDA implementations of the ops of quintet/nn/ops.hpp, one function per op, called
// by the device dispatch in lib/nn/ops.cpp for CUDA tensors.
//
// OWNERSHIP: written with the op interface; the CUDA engineer takes this header over and
// implements every declaration in lib/nn/cuda/*.cu. When all of them are implemented, set
// QUINTET_NN_CUDA_OPS below to 1 in the same commit that adds the .cu files: ops.cpp only calls
// these functions when it is 1 (and QUINTET_HAS_CUDA), and otherwise rejects CUDA tensors with
// InvalidArgument, so the library links before the kernels exist.
//
// Contract for every function here (the dispatch guarantees it, the kernels may rely on it):
//   - shapes, dtypes and devices are already checked as ops.hpp documents; all tensors are on
//     stream.device(), which is current (a DeviceGuard is held); work is queued on `stream`
//     (stream.handle(), nullptr = legacy default) and must not synchronise the host;
//   - every input is contiguous; outputs are preallocated, contiguous, and uninitialised unless
//     said "accumulate" (then += into existing f32 values);
//   - T is the compute dtype, bf16 or f32; statistics and parameter grads are f32;
//   - leading dims are flattened: "rows" = numel / last dim.
// Must stay C++17-clean: .cu files include it.
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/core/config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/nn/ops.hpp"

// 1 once lib/nn/cuda/*.cu implement every function below (see OWNERSHIP).
#define QUINTET_NN_CUDA_OPS 1

#if QUINTET_HAS_CUDA
namespace quintet::nn::cuda_ops {

// x [M, in], w [out, in], b [out] or undefined -> y [M, out].
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                    const Stream& stream);
// dy [M, out], w [out, in] -> dx [M, in].
void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx,
                           const Stream& stream);
// dy [M, out], x [M, in]; accumulate dw [out, in] f32 (overwrite it when !accumulate_dw),
// db [out] f32 (undefined: skip).
void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            bool accumulate_dw, const Stream& stream);
// The grouped linear ops' kernels (quintet/nn/grouped_linear.hpp, lib/nn/cuda/grouped_gemm.cu):
// one launch each over every group, offsets [G + 1] i64 read on the device; w [G, out, in].
// x [n, in] -> y [n, out]; dy [n, out] -> dx [n, in] (rows past offsets[G] zeroed); accumulate
// dw [G, out, in] f32 from dy [n, out] and x [n, in]. wgmma: bf16 shapes the tensor cores take run
// the Hopper kernel (lib/nn/cuda/grouped_gemm_sm90a.cu; throws on a GPU that is not sm_90).
void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& y, bool wgmma, const Stream& stream);
void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dx, bool wgmma, const Stream& stream);
void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, bool wgmma, const Stream& stream);
// The grouped FP8 products (grouped_linear.hpp), one launch each, every operand K-contiguous:
//   forward: a = x [n, in], b = w [G, out, in], c = y [n, out] (f32 or bf16);
//   dgrad:   a = dy [n, out], b = wᵀ [in, G out] (group g: columns [g out, (g + 1) out)),
//            c = dx [n, in] (f32 or bf16);
//   wgrad:   a = dyᵀ [out, n], b = xᵀ [in, n] (group g: columns [o_g, o_{g+1})), c = dw
//            [G, out, in] f32, accumulated.
// c = (a_scale[0] b_scale[0]) · a_g · b_gᵀ summed in f32; rows of y / dx past offsets[G] zeroed.
// wgmma: the formats and shapes the FP8 tensor-core kernel takes run the Hopper kernel
// (lib/nn/cuda/grouped_gemm_sm90a.cu; throws on a GPU that is not sm_90).
enum class GroupedFp8Product { forward, dgrad, wgrad };
void grouped_fp8_gemm(GroupedFp8Product product, const Tensor& a, const Tensor& a_scale,
                      Fp8Format a_format, const Tensor& b, const Tensor& b_scale,
                      Fp8Format b_format, const Tensor& offsets, const Tensor& c, bool wgmma,
                      const Stream& stream);

// x [rows, d], gamma/beta [d] -> y [rows, d], mean [rows] f32, rstd [rows] f32. With residual
// (else undefined) the rows normalised are x + residual, written into sum (both [rows, d]).
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd,
                       const Tensor& residual, const Tensor& sum, const Stream& stream);
// -> dx [rows, d] (plus dresidual [rows, d] when defined); accumulate dgamma, dbeta [d] f32 (each
// may be undefined: skip).
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta, const Tensor& dresidual, const Stream& stream);
// x [rows, d], gamma [d] -> y [rows, d], rstd [rows] f32; residual and sum as for layernorm.
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                     const Tensor& rstd, const Tensor& residual, const Tensor& sum,
                     const Stream& stream);
// -> dx (plus dresidual when defined); accumulate dgamma [d] f32 (undefined: skip).
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dgamma, const Tensor& dresidual,
                      const Stream& stream);

// Element-wise, any (flattened) shape.
void gelu_forward(const Tensor& x, const Tensor& y, const Stream& stream);
void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx, const Stream& stream);
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y, const Stream& stream);
void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup, const Stream& stream);
// Over the last dim of [rows, n].
void softmax_forward(const Tensor& x, const Tensor& y, const Stream& stream);
void softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx, const Stream& stream);

// RoPE (ops.hpp): x and y [B, S, H, D] with any strides (y may be x: in place; the one exception
// to "inputs are contiguous"); positions [S] or [B, S] i32/i64 or undefined; inv_freq [D / 2]
// (D / 2 <= 256); inverse rotates by -a.
void rope(const Tensor& x, const Tensor& y, const Tensor& positions,
          const std::vector<double>& inv_freq, std::int64_t position_offset, bool inverse,
          const Stream& stream);

// q [B, H, Sq, D], k/v [B, H, Sk, D] -> out [B, H, Sq, D], lse [B, H, Sq] f32. options.scale is
// already resolved (> 0); offsets >= 0. Rows with no visible key: out 0, lse -inf. Every operand
// but the lse (contiguous) may be strided: cuDNN takes it in place, our own kernels via copies.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionOptions& options, const Tensor& out, const Tensor& lse,
                       const Stream& stream);
// -> dq, dk, dv (overwritten), see ops.hpp for the merged-out/lse contract.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Stream& stream);
// out, lse merged in place with out_b, lse_b (see ops.hpp).
void attention_merge_(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                      const Tensor& lse_b, const Stream& stream);

// ids [N] i32/i64, table [V, D] -> y [N, D]; out-of-range id: zero row.
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y,
                       const Stream& stream);
// accumulate dtable [V, D] f32 from dy [N, D]; out-of-range ids dropped.
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                        const Stream& stream);

// All f32 of one shape except param (any float dtype, or undefined); step >= 1.
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale, const Tensor& param, const Stream& stream);

// adamw_step over every entry (each checked like adamw_step; defined params share one dtype), in
// launches of up to 64 tensors, the clip factor taken on the device from sum_sq (a scalar f32):
// see ops.hpp. Nothing is written when sum_sq is inf or nan.
void adamw_step_many(const std::vector<AdamWTensors>& tensors, const AdamWHyper& hyper,
                     std::int64_t step, const Tensor& sum_sq, float max_grad_norm,
                     const Stream& stream);

// out = a + b (same dtype T).
void add(const Tensor& a, const Tensor& b, const Tensor& out, const Stream& stream);
// dst (f32 or T) += alpha * src (T).
void add_(const Tensor& dst, const Tensor& src, float alpha, const Stream& stream);
// out = alpha * x (out may alias x for the in-place form).
void scale(const Tensor& x, float alpha, const Tensor& out, const Stream& stream);
// accumulate sum(x²) in f32 into out (a scalar f32 tensor) over every x (contiguous, any float
// dtypes), in launches of up to 64 tensors of one dtype.
void sum_of_squares(const std::vector<Tensor>& xs, const Tensor& out, const Stream& stream);

// FP8 (fp8.hpp; lib/nn/cuda/fp8.cu). scale tensors f32 [2] {1 / scale, scale}; x f32 or bf16
// viewed as [rows, cols] (cols its last dimension). fp8_cast: q u8 of x's shape (undefined: the
// amax only, scale then undefined too; fp8_amaxes is the faster amax pass), qt u8 [cols, rows] or
// undefined (only with q), amax f32 [1] or undefined, max'ed with x's amax.
void fp8_cast(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& q,
              const Tensor& qt, const Tensor& amax, const Stream& stream);
// fp8_cast of each (x contiguous; the outputs distinct); the vectorized kernel's casts go in one
// launch per run of up to 4 of one dtype and format (a linear layer's x and w).
struct Fp8CastJob {
  Tensor x, scale;
  Fp8Format format;
  Tensor q, qt, amax;
};
void fp8_casts(const std::vector<Fp8CastJob>& casts, const Stream& stream);
// x (f32 or bf16, q's shape) = float(q) * scale[0].
void fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& x,
                    const Stream& stream);
// db [cols] f32 += column sums of float(q) * scale[0], q [rows, cols].
void fp8_column_sum(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& db,
                    const Stream& stream);
// amax f32 [xs.size()] (contiguous): element i max'ed with xs[i]'s amax (x contiguous, f32 or
// bf16), as fp8_cast's amax; one pass over each tensor, one launch for up to 4 of one dtype.
void fp8_amaxes(const std::vector<Tensor>& xs, const Tensor& amax, const Stream& stream);
// out (a scale tensor) from amax f32 [1] and state f32 [2] (Fp8TensorScale::scale_on_device).
void fp8_scale(const Tensor& amax, const Tensor& state, const Tensor& out, Fp8Format format,
               int margin, bool use_amax, bool record, const Stream& stream);
// fp8_scale of several scales, one launch for up to 4 (Fp8TensorScale::scales_on_device); an
// undefined amax (only where use_amax is false and record too) is not read.
struct Fp8ScaleArgs {
  Tensor amax, state, out;
  Fp8Format format;
  int margin;
  bool use_amax;
};
void fp8_scales(const std::vector<Fp8ScaleArgs>& scales, bool record, const Stream& stream);
// y [n, m] (=, or += with accumulate) a [n, k] · b [m, k]ᵀ with the inverse scales (+ bias [m]).
void fp8_gemm(const Tensor& a, const Tensor& a_scale, Fp8Format a_format, const Tensor& b,
              const Tensor& b_scale, Fp8Format b_format, const Tensor& bias, const Tensor& y,
              bool accumulate, bool fast_accum, const Stream& stream);

// Mixture-of-experts routing and permutation (ops.hpp), in lib/nn/cuda/moe.cu. counts, prob_sum
// and z_sum may be undefined (not computed); the experts indices are not checked (a kept index
// outside [0, E) is the caller's bug).
void moe_route_forward(const Tensor& logits, const Tensor& bias, const RouteOptions& options,
                       const Tensor& probs, const Tensor& experts, const Tensor& weights,
                       const Tensor& kept, const Tensor& lse, const Tensor& counts,
                       const Tensor& prob_sum, const Tensor& z_sum, const Stream& stream);
void moe_drop_over_capacity_(const Tensor& probs, const Tensor& experts, std::int64_t capacity,
                             const Tensor& weights, const Tensor& kept, const Stream& stream);
void moe_route_backward(const Tensor& dweights, const Tensor& logits, const Tensor& probs,
                        const Tensor& experts, const Tensor& kept, const Tensor& lse,
                        const Tensor& counts, double aux_scale, double z_scale,
                        const RouteOptions& options, const Tensor& dlogits, const Stream& stream);
void moe_permute(const Tensor& x, const Tensor& experts, const Tensor& kept, const Tensor& rows,
                 const Tensor& counts, const Tensor& offsets, const Tensor& source,
                 const Tensor& slot, const Stream& stream);
void moe_unpermute(const Tensor& rows, const Tensor& slot, const Tensor& weights, const Tensor& y,
                   const Stream& stream);
void moe_unpermute_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                            const Tensor& source, const Tensor& weights, const Tensor& drows,
                            const Tensor& dweights, const Stream& stream);

}  // namespace quintet::nn::cuda_ops
#endif  // QUINTET_HAS_CUDA
