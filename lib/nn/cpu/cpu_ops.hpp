// Private: the CPU implementations of the ops of quintet/nn/ops.hpp, called by the dispatch in
// lib/nn/ops.cpp. Same contract as lib/nn/cuda/cuda_ops.hpp (checked arguments, contiguous
// inputs, preallocated contiguous outputs, "accumulate" = += into existing values) except that T
// is f32 or f64 and accumulators are of accum_dtype(T). Synchronous on the calling thread.
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/core/tensor.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn::cpu_ops {

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx);
void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            bool accumulate_dw);
// The grouped linear ops (quintet/nn/grouped_linear.hpp): offsets [G + 1] i64, checked; w and dw
// [G, out, in]. Each group runs the linear kernels above on its rows; rows past offsets[G] of y
// and dx are zeroed. dw is accumulated, or with !accumulate overwritten (an empty group's
// zeroed).
void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& y);
void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dx);
void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, bool accumulate);
// The grouped FP8 products (grouped_linear.hpp): per group fp8_gemm (below) on its slices. x
// [n, in], w [G, out, in], dy [n, out]; wt [in, G out], dyt [out, n], xt [in, n] (the
// transposes); y / dx f32 with the rows past offsets[G] zeroed; dw [G, out, in] f32 accumulated
// (overwritten as above with !accumulate).
void grouped_fp8_linear_forward(const Tensor& x, const Tensor& x_scale, Fp8Format x_format,
                                const Tensor& w, const Tensor& w_scale, Fp8Format w_format,
                                const Tensor& offsets, const Tensor& y);
void grouped_fp8_linear_backward_input(const Tensor& dy, const Tensor& dy_scale,
                                       Fp8Format dy_format, const Tensor& wt, const Tensor& w_scale,
                                       Fp8Format w_format, const Tensor& offsets, const Tensor& dx);
void grouped_fp8_linear_backward_weight(const Tensor& dyt, const Tensor& dy_scale,
                                        Fp8Format dy_format, const Tensor& xt,
                                        const Tensor& x_scale, Fp8Format x_format,
                                        const Tensor& offsets, const Tensor& dw, bool accumulate);

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta);
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                     const Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dgamma);

void gelu_forward(const Tensor& x, const Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup);
void softmax_forward(const Tensor& x, const Tensor& y);
void softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx);

// RoPE (ops.hpp): x and y [B, S, H, D] with any strides (y may be x: in place); positions [S] or
// [B, S] i32/i64 or undefined; inv_freq [D / 2] (rounded to f32 for f32 x); inverse rotates by -a.
void rope(const Tensor& x, const Tensor& y, const Tensor& positions,
          const std::vector<double>& inv_freq, std::int64_t position_offset, bool inverse);

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionOptions& options, const Tensor& out, const Tensor& lse);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv);
void attention_merge_(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                      const Tensor& lse_b);

// Throws InvalidArgument (before writing anything) on an id outside [0, V).
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y);
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable);

// Mixture-of-experts routing and permutation (ops.hpp). counts, prob_sum and z_sum may be
// undefined (not computed). moe_permute throws InvalidArgument for a kept expert outside
// [0, counts.numel()), moe_unpermute for a slot outside rows, before writing any output.
void moe_route_forward(const Tensor& logits, const Tensor& bias, const RouteOptions& options,
                       const Tensor& probs, const Tensor& experts, const Tensor& weights,
                       const Tensor& kept, const Tensor& lse, const Tensor& counts,
                       const Tensor& prob_sum, const Tensor& z_sum);
std::int64_t moe_drop_over_capacity_(const Tensor& probs, const Tensor& experts,
                                     std::int64_t capacity, const Tensor& weights,
                                     const Tensor& kept);
void moe_route_backward(const Tensor& dweights, const Tensor& logits, const Tensor& probs,
                        const Tensor& experts, const Tensor& kept, const Tensor& lse,
                        const Tensor& counts, double aux_scale, double z_scale,
                        const RouteOptions& options, const Tensor& dlogits);
void moe_permute(const Tensor& x, const Tensor& experts, const Tensor& kept, const Tensor& rows,
                 const Tensor& counts, const Tensor& offsets, const Tensor& source,
                 const Tensor& slot);
void moe_unpermute(const Tensor& rows, const Tensor& slot, const Tensor& weights, const Tensor& y);
void moe_unpermute_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                            const Tensor& source, const Tensor& weights, const Tensor& drows,
                            const Tensor& dweights);

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale, const Tensor& param);

void add(const Tensor& a, const Tensor& b, const Tensor& out);
void add_(const Tensor& dst, const Tensor& src, float alpha);
void scale(const Tensor& x, float alpha, const Tensor& out);
// Returns sum(x²) of one tensor of any float dtype, accumulated in double.
double sum_of_squares(const Tensor& x);

// FP8 (quintet/nn/fp8.hpp): x f32 or bf16, q u8, both contiguous of one shape; scale tensors
// f32 [2] {1 / scale, scale}; the arguments as cuda_ops' (lib/nn/cuda/cuda_ops.hpp).
float fp8_amax(const Tensor& x);
void fp8_cast(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& q,
              const Tensor& qt, const Tensor& amax);
// x = float(q) * scale_inv.
void fp8_dequantize(const Tensor& q, float scale_inv, Fp8Format format, const Tensor& x);
void fp8_column_sum(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& db);
void fp8_scale(const Tensor& amax, const Tensor& state, const Tensor& out, Fp8Format format,
               int margin, bool use_amax, bool record);
void fp8_gemm(const Tensor& a, const Tensor& a_scale, Fp8Format a_format, const Tensor& b,
              const Tensor& b_scale, Fp8Format b_format, const Tensor& bias, const Tensor& y,
              bool accumulate, bool fast_accum);

}  // namespace quintet::nn::cpu_ops
