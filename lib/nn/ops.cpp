// The device dispatch of the nn ops (quintet/nn/ops.hpp): check every argument, allocate the
// outputs, then call the CPU implementation (lib/nn/cpu/, cpu_ops.hpp) or the CUDA one
// (lib/nn/cuda/, cuda_ops.hpp). The ops of training (embedding, cross-entropy, AdamW, element-wise,
// norms of tensor sets) are dispatched in ops_train.cpp the same way.
//
// How CUDA is switched on: the CUDA kernels are called only when the build has CUDA
// (QUINTET_HAS_CUDA, from quintet/core/config.hpp) AND lib/nn/cuda/cuda_ops.hpp defines
// QUINTET_NN_CUDA_OPS to 1, which its owner does in the commit that adds lib/nn/cuda/*.cu.
// Otherwise a call on a CUDA stream is rejected with InvalidArgument before anything is allocated
// (detail::OpChecker, op_checks.hpp), and the library links without any CUDA nn symbol. The
// switch itself is QUINTET_NN_DISPATCH in op_dispatch.hpp.
#include "quintet/nn/ops.hpp"

#include <cmath>
#include <numbers>
#include <vector>

#include "nn/cpu/cpu_ops.hpp"
#include "nn/cuda/cuda_ops.hpp"
#include "nn/op_checks.hpp"
#include "nn/op_dispatch.hpp"

namespace quintet::nn {

using detail::as_rows;
using detail::OpChecker;
using detail::rows_of;
using detail::with_last;

// ---- linear ---------------------------------------------------------------------------------

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Stream& stream) {
  const OpChecker c("linear_forward", stream);
  const DType t = c.compute("x", x);
  const std::int64_t in = c.last_dim("x", x);
  c.compute_as("w", w, t);
  QUINTET_CHECK(w.dim() == 2 && w.size(1) == in,
                "linear_forward: w has shape {}, expected [out, {}] for x of shape {}",
                shape_str(w.shape()), in, shape_str(x.shape()));
  const std::int64_t out = w.size(0);
  if (b.defined()) {
    c.compute_as("b", b, t);
    c.shape("b", b, {out});
  }
  const Tensor x2 = as_rows(x, stream);
  const Tensor w2 = w.contiguous(stream);
  const Tensor b2 = b.defined() ? b.contiguous(stream) : Tensor();
  Tensor y = Tensor::empty({x2.size(0), out}, t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, linear_forward, x2, w2, b2, y);
  return y.view(with_last(x.shape(), out));
}

Tensor linear_backward_input(const Tensor& dy, const Tensor& w, const Stream& stream) {
  const OpChecker c("linear_backward_input", stream);
  const DType t = c.compute("dy", dy);
  c.compute_as("w", w, t);
  const std::int64_t out = c.last_dim("dy", dy);
  QUINTET_CHECK(w.dim() == 2 && w.size(0) == out,
                "linear_backward_input: w has shape {}, expected [{}, in] for dy of shape {}",
                shape_str(w.shape()), out, shape_str(dy.shape()));
  const Tensor dy2 = as_rows(dy, stream);
  const Tensor w2 = w.contiguous(stream);
  Tensor dx = Tensor::empty({dy2.size(0), w.size(1)}, t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, linear_backward_input, dy2, w2, dx);
  return dx.view(with_last(dy.shape(), w.size(1)));
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            const Stream& stream) {
  linear_backward_weight(dy, x, dw, db, true, stream);
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            bool accumulate_dw, const Stream& stream) {
  const OpChecker c("linear_backward_weight", stream);
  const DType t = c.compute("dy", dy);
  c.compute_as("x", x, t);
  const std::int64_t out = c.last_dim("dy", dy), in = c.last_dim("x", x);
  QUINTET_CHECK(with_last(dy.shape(), in) == x.shape(),
                "linear_backward_weight: dy {} and x {} must have the same leading dimensions",
                shape_str(dy.shape()), shape_str(x.shape()));
  c.accumulator("dw", dw, t, {out, in});
  if (db.defined()) c.accumulator("db", db, t, {out});
  const Tensor dy2 = as_rows(dy, stream), x2 = as_rows(x, stream);
  QUINTET_NN_DISPATCH(c, stream, linear_backward_weight, dy2, x2, dw, db, accumulate_dw);
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db, const Stream& stream) {
  linear_backward_weight(dy, x, dw, db, stream);
  return linear_backward_input(dy, w, stream);
}

// ---- norms ----------------------------------------------------------------------------------

namespace {
// Checks x [..., d] and a [d] weight; returns the compute dtype.
DType check_norm_input(const OpChecker& c, const Tensor& x, const Tensor& gamma, float eps) {
  const DType t = c.compute("x", x);
  const std::int64_t d = c.last_dim("x", x);
  QUINTET_CHECK(d > 0, "{}: x has shape {}; the normalised (last) dimension must be > 0", c.op(),
                shape_str(x.shape()));
  c.compute_as("gamma", gamma, t);
  c.shape("gamma", gamma, {d});
  QUINTET_CHECK(eps > 0.0f && std::isfinite(eps), "{}: eps = {} must be a positive number", c.op(),
                eps);
  return t;
}
// Checks dy like x and a saved statistic of one value per row.
void check_norm_grad(const OpChecker& c, const Tensor& dy, const Tensor& x, const Tensor& stat,
                     const char* stat_name) {
  c.compute_as("dy", dy, x.dtype());
  c.shape("dy", dy, x.shape());
  c.on_device(stat_name, stat);
  QUINTET_CHECK(stat.dtype() == accum_dtype(x.dtype()) && stat.numel() == rows_of(x),
                "{}: {} is {} of {} with {} elements; expected the forward's {} with one value "
                "per row ({})",
                c.op(), stat_name, stat.str(), dtype_name(stat.dtype()), stat.numel(),
                dtype_name(accum_dtype(x.dtype())), rows_of(x));
}
// Checks a residual (or its gradient) like x; undefined passes.
void check_residual(const OpChecker& c, const char* name, const Tensor& r, const Tensor& x) {
  if (!r.defined()) return;
  c.compute_as(name, r, x.dtype());
  c.shape(name, r, x.shape());
}

// The residual gradient as the fused GPU kernel takes it (rows), or undefined where the add is
// separate (the CPU).
Tensor fused_residual(const OpChecker& c, const Tensor& dresidual, const Stream& stream) {
  return dresidual.defined() && c.on_cuda() ? as_rows(dresidual, stream) : Tensor();
}
// dx + dresidual where the kernel did not add it (the CPU); dx itself otherwise.
Tensor add_residual_grad(const OpChecker& c, const Tensor& dx, const Tensor& dresidual,
                         const Stream& stream) {
  if (dresidual.defined() && !c.on_cuda()) add_(dx, dresidual, 1.0f, stream);
  return dx;
}

// The residual forms on a GPU fuse the add into the norm's row kernels; the CPU runs the add and
// the norm one after the other (the same numbers, see lib/nn/cuda/norm.cu). norm(x2) runs the
// CPU op on rows.
template <class Norm>
NormOutput norm_of_sum(const OpChecker& c, const Tensor& x, const Tensor& residual,
                       const Stream& stream, Norm&& norm) {
  if (!residual.defined() || !c.on_cuda()) {
    const Tensor s = residual.defined() ? add(x, residual, stream) : x;
    NormOutput o = norm(as_rows(s, stream), Tensor(), Tensor());
    if (residual.defined()) o.sum = s;
    o.y = o.y.view(x.shape());
    return o;
  }
  const Tensor sum = Tensor::empty(x.shape(), x.dtype(), c.device(), stream);
  NormOutput o = norm(as_rows(x, stream), as_rows(residual, stream), as_rows(sum, stream));
  o.sum = sum;
  o.y = o.y.view(x.shape());
  return o;
}
}  // namespace

NormOutput layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                             const Stream& stream, const Tensor& residual) {
  const OpChecker c("layernorm_forward", stream);
  const DType t = check_norm_input(c, x, gamma, eps);
  c.compute_as("beta", beta, t);
  c.shape("beta", beta, gamma.shape());
  check_residual(c, "residual", residual, x);
  const Tensor g = gamma.contiguous(stream), be = beta.contiguous(stream);
  return norm_of_sum(
      c, x, residual, stream, [&](const Tensor& x2, const Tensor& r2, const Tensor& sum2) {
        NormOutput o;
        o.y = Tensor::empty(x2.shape(), t, c.device(), stream);
        o.mean = Tensor::empty({x2.size(0)}, accum_dtype(t), c.device(), stream);
        o.rstd = Tensor::empty({x2.size(0)}, accum_dtype(t), c.device(), stream);
        QUINTET_NN_DISPATCH_ARGS(c, layernorm_forward, (x2, g, be, eps, o.y, o.mean, o.rstd),
                                 (x2, g, be, eps, o.y, o.mean, o.rstd, r2, sum2, stream));
        return o;
      });
}

Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                          const Tensor& dbeta, const Stream& stream, const Tensor& dresidual) {
  const OpChecker c("layernorm_backward", stream);
  const DType t = check_norm_input(c, x, gamma, 1.0f);
  check_norm_grad(c, dy, x, mean, "mean");
  check_norm_grad(c, dy, x, rstd, "rstd");
  if (dgamma.defined()) c.accumulator("dgamma", dgamma, t, gamma.shape());
  if (dbeta.defined()) c.accumulator("dbeta", dbeta, t, gamma.shape());
  const Tensor x2 = as_rows(x, stream), dy2 = as_rows(dy, stream);
  const Tensor g = gamma.contiguous(stream);
  const Tensor m = mean.contiguous(stream), r = rstd.contiguous(stream);
  check_residual(c, "dresidual", dresidual, x);
  const Tensor dr = fused_residual(c, dresidual, stream);
  Tensor dx = Tensor::empty(x2.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH_ARGS(c, layernorm_backward, (dy2, x2, g, m, r, dx, dgamma, dbeta),
                           (dy2, x2, g, m, r, dx, dgamma, dbeta, dr, stream));
  return add_residual_grad(c, dx.view(x.shape()), dresidual, stream);
}

NormOutput rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Stream& stream,
                           const Tensor& residual) {
  const OpChecker c("rmsnorm_forward", stream);
  const DType t = check_norm_input(c, x, gamma, eps);
  check_residual(c, "residual", residual, x);
  const Tensor g = gamma.contiguous(stream);
  return norm_of_sum(c, x, residual, stream,
                     [&](const Tensor& x2, const Tensor& r2, const Tensor& sum2) {
                       NormOutput o;
                       o.y = Tensor::empty(x2.shape(), t, c.device(), stream);
                       o.rstd = Tensor::empty({x2.size(0)}, accum_dtype(t), c.device(), stream);
                       QUINTET_NN_DISPATCH_ARGS(c, rmsnorm_forward, (x2, g, eps, o.y, o.rstd),
                                                (x2, g, eps, o.y, o.rstd, r2, sum2, stream));
                       return o;
                     });
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                        const Tensor& dgamma, const Stream& stream, const Tensor& dresidual) {
  const OpChecker c("rmsnorm_backward", stream);
  const DType t = check_norm_input(c, x, gamma, 1.0f);
  check_norm_grad(c, dy, x, rstd, "rstd");
  if (dgamma.defined()) c.accumulator("dgamma", dgamma, t, gamma.shape());
  const Tensor x2 = as_rows(x, stream), dy2 = as_rows(dy, stream);
  const Tensor g = gamma.contiguous(stream), r = rstd.contiguous(stream);
  check_residual(c, "dresidual", dresidual, x);
  const Tensor dr = fused_residual(c, dresidual, stream);
  Tensor dx = Tensor::empty(x2.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH_ARGS(c, rmsnorm_backward, (dy2, x2, g, r, dx, dgamma),
                           (dy2, x2, g, r, dx, dgamma, dr, stream));
  return add_residual_grad(c, dx.view(x.shape()), dresidual, stream);
}

// ---- activations ----------------------------------------------------------------------------

Tensor gelu_forward(const Tensor& x, const Stream& stream) {
  const OpChecker c("gelu_forward", stream);
  const DType t = c.compute("x", x);
  const Tensor xc = x.contiguous(stream);
  Tensor y = Tensor::empty(x.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, gelu_forward, xc, y);
  return y;
}

Tensor gelu_backward(const Tensor& dy, const Tensor& x, const Stream& stream) {
  const OpChecker c("gelu_backward", stream);
  const DType t = c.compute("x", x);
  c.compute_as("dy", dy, t);
  c.shape("dy", dy, x.shape());
  const Tensor xc = x.contiguous(stream), dyc = dy.contiguous(stream);
  Tensor dx = Tensor::empty(x.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, gelu_backward, dyc, xc, dx);
  return dx;
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, const Stream& stream) {
  const OpChecker c("swiglu_forward", stream);
  const DType t = c.compute("gate", gate);
  c.compute_as("up", up, t);
  c.shape("up", up, gate.shape());
  const Tensor g = gate.contiguous(stream), u = up.contiguous(stream);
  Tensor y = Tensor::empty(gate.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, swiglu_forward, g, u, y);
  return y;
}

SwiGluGrads swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                            const Stream& stream) {
  const OpChecker c("swiglu_backward", stream);
  const DType t = c.compute("gate", gate);
  c.compute_as("up", up, t);
  c.compute_as("dy", dy, t);
  c.shape("up", up, gate.shape());
  c.shape("dy", dy, gate.shape());
  const Tensor g = gate.contiguous(stream), u = up.contiguous(stream), d = dy.contiguous(stream);
  SwiGluGrads o{Tensor::empty(gate.shape(), t, c.device(), stream),
                Tensor::empty(gate.shape(), t, c.device(), stream)};
  QUINTET_NN_DISPATCH(c, stream, swiglu_backward, d, g, u, o.dgate, o.dup);
  return o;
}

Tensor softmax_forward(const Tensor& x, const Stream& stream) {
  const OpChecker c("softmax_forward", stream);
  const DType t = c.compute("x", x);
  c.last_dim("x", x);
  const Tensor x2 = as_rows(x, stream);
  Tensor y = Tensor::empty(x2.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, softmax_forward, x2, y);
  return y.view(x.shape());
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y, const Stream& stream) {
  const OpChecker c("softmax_backward", stream);
  const DType t = c.compute("y", y);
  c.last_dim("y", y);
  c.compute_as("dy", dy, t);
  c.shape("dy", dy, y.shape());
  const Tensor y2 = as_rows(y, stream), dy2 = as_rows(dy, stream);
  Tensor dx = Tensor::empty(y2.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, softmax_backward, dy2, y2, dx);
  return dx.view(y.shape());
}

// ---- RoPE -----------------------------------------------------------------------------------

void check_rope_scaling(const RopeScaling& s, const char* what) {
  if (s.factor == 0.0) return;
  QUINTET_CHECK(s.factor > 0.0 && std::isfinite(s.factor) && s.low_freq_factor > 0.0 &&
                    std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor &&
                    s.original_max_position_embeddings > 0,
                "{}: Llama 3 RoPE scaling factor = {}, low_freq_factor = {}, high_freq_factor = "
                "{}, original_max_position_embeddings = {}: expected factor > 0, 0 < "
                "low_freq_factor < high_freq_factor and a length > 0",
                what, s.factor, s.low_freq_factor, s.high_freq_factor,
                s.original_max_position_embeddings);
}

namespace {
// Checks x (named name) [B, S, H, D] (D even), the positions and the options; returns inv_freq [D /
// 2].
std::vector<double> check_rope(const OpChecker& c, const char* name, const Tensor& x,
                               const Tensor& positions, const RopeOptions& options) {
  c.compute(name, x);
  QUINTET_CHECK(x.dim() == 4, "{}: {} has shape {}, expected [batch, seq, heads, head_dim]", c.op(),
                name, shape_str(x.shape()));
  const std::int64_t d = x.size(3);
  QUINTET_CHECK(d > 0 && d % 2 == 0,
                "{}: head_dim = {} ({} {}) must be even and > 0: RoPE rotates the pairs (i, i + "
                "head_dim/2)",
                c.op(), d, name, shape_str(x.shape()));
  QUINTET_CHECK(options.theta > 0.0 && std::isfinite(options.theta),
                "{}: theta = {} must be a positive number (rope_theta, e.g. 10000)", c.op(),
                options.theta);
  if (positions.defined()) {
    c.ids("positions", positions);
    const bool ok =
        (positions.dim() == 1 && positions.size(0) == x.size(1)) ||
        (positions.dim() == 2 && positions.size(0) == x.size(0) && positions.size(1) == x.size(1));
    QUINTET_CHECK(ok,
                  "{}: positions have shape {}, expected [{}] or [{}, {}] (one per token of {} {})",
                  c.op(), shape_str(positions.shape()), x.size(1), x.size(0), x.size(1), name,
                  shape_str(x.shape()));
  }
  check_rope_scaling(options.scaling, c.op());
  const RopeScaling& s = options.scaling;
  std::vector<double> inv_freq(static_cast<std::size_t>(d / 2));
  for (std::size_t i = 0; i < inv_freq.size(); ++i) {
    double f = 1.0 / std::pow(options.theta, static_cast<double>(2 * i) / static_cast<double>(d));
    if (s.factor > 0.0) {  // Llama 3's scaling (ops.hpp), in Hugging Face's order of operations
      const double L = static_cast<double>(s.original_max_position_embeddings);
      const double wavelen = 2.0 * std::numbers::pi / f;
      const double scaled = wavelen > L / s.low_freq_factor ? f / s.factor : f;
      const double smooth =
          (L / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      const bool medium = !(wavelen < L / s.high_freq_factor) && !(wavelen > L / s.low_freq_factor);
      f = medium ? (1.0 - smooth) * scaled / s.factor + smooth * scaled : scaled;
    }
    inv_freq[i] = f;
  }
  return inv_freq;
}

// Rotates x into y (y may be x); name is x's name in error messages.
void rope_into(const char* op, const char* name, const Tensor& x, const Tensor& y,
               const Tensor& positions, const RopeOptions& options, bool inverse,
               const Stream& stream) {
  const OpChecker c(op, stream);
  const std::vector<double> inv_freq = check_rope(c, name, x, positions, options);
  if (x.shares_storage(y)) {
    for (int i = 0; i < x.dim(); ++i) {
      QUINTET_CHECK(x.size(i) <= 1 || x.stride(i) != 0,
                    "{}: {} has stride 0 in dimension {} (strides {}); an in-place rotation "
                    "needs distinct elements",
                    op, name, i, shape_str(x.strides()));
    }
  }
  if (x.numel() == 0) return;
  QUINTET_NN_DISPATCH(c, stream, rope, x, y, positions, inv_freq, options.position_offset, inverse);
}

// Rotates x into a new contiguous tensor.
Tensor rope_copy(const char* op, const char* name, const Tensor& x, const Tensor& positions,
                 const RopeOptions& options, bool inverse, const Stream& stream) {
  const OpChecker c(op, stream);
  c.compute(name, x);
  const Tensor y = Tensor::empty(x.shape(), x.dtype(), c.device(), stream);
  rope_into(op, name, x, y, positions, options, inverse, stream);
  return y;
}
}  // namespace

Tensor rope_forward(const Tensor& x, const Tensor& positions, const RopeOptions& options,
                    const Stream& stream) {
  return rope_copy("rope_forward", "x", x, positions, options, false, stream);
}

Tensor rope_backward(const Tensor& dy, const Tensor& positions, const RopeOptions& options,
                     const Stream& stream) {
  return rope_copy("rope_backward", "dy", dy, positions, options, true, stream);
}

void rope_forward_(const Tensor& x, const Tensor& positions, const RopeOptions& options,
                   const Stream& stream) {
  rope_into("rope_forward_", "x", x, x, positions, options, false, stream);
}

void rope_backward_(const Tensor& dy, const Tensor& positions, const RopeOptions& options,
                    const Stream& stream) {
  rope_into("rope_backward_", "dy", dy, dy, positions, options, true, stream);
}

// ---- attention ------------------------------------------------------------------------------

namespace {
// Checks q, k, v and the options; returns the options with the scale resolved.
AttentionOptions check_attention(const OpChecker& c, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const AttentionOptions& options) {
  const DType t = c.compute("q", q);
  c.compute_as("k", k, t);
  c.compute_as("v", v, t);
  QUINTET_CHECK(q.dim() == 4, "{}: q has shape {}, expected [batch, heads, seq, head_dim]", c.op(),
                shape_str(q.shape()));
  QUINTET_CHECK(k.dim() == 4 && k.size(0) == q.size(0) && k.size(3) == q.size(3),
                "{}: k has shape {}, expected [{}, kv_heads, seq_k, {}] to match q {}", c.op(),
                shape_str(k.shape()), q.size(0), q.size(3), shape_str(q.shape()));
  QUINTET_CHECK(k.size(1) > 0 ? q.size(1) % k.size(1) == 0 : q.size(1) == 0,
                "{}: k has shape {} with {} heads, which must divide q's {} heads (grouped-query "
                "attention: each key/value head serves heads / kv_heads query heads; q {})",
                c.op(), shape_str(k.shape()), k.size(1), q.size(1), shape_str(q.shape()));
  c.shape("v", v, k.shape());
  QUINTET_CHECK(q.size(3) > 0, "{}: head_dim must be > 0, q has shape {}", c.op(),
                shape_str(q.shape()));
  QUINTET_CHECK(options.q_offset >= 0 && options.k_offset >= 0,
                "{}: q_offset = {} and k_offset = {} must be >= 0 (positions in the sequence)",
                c.op(), options.q_offset, options.k_offset);
  QUINTET_CHECK(options.scale >= 0.0f && std::isfinite(options.scale),
                "{}: scale = {} must be >= 0 (0 = 1/sqrt(head_dim))", c.op(), options.scale);
  AttentionOptions o = options;
  if (o.scale == 0.0f) o.scale = static_cast<float>(1.0 / std::sqrt(double(q.size(3))));
  return o;
}
}  // namespace

namespace {
// The GPU ops take strided operands (cuDNN reads them in place, our own kernels copy); the CPU
// ones take contiguous tensors: attention_in and attention_out_slot give them those, and
// attention_copy_out writes a slot back into its strided output.
Tensor attention_in(const OpChecker& c, const Tensor& t, const Stream& stream) {
  return c.on_cuda() ? t : t.contiguous(stream);
}
Tensor attention_out_slot(const OpChecker& c, const Tensor& out, const Stream& stream) {
  if (c.on_cuda() || out.is_contiguous()) return out;
  return Tensor::empty(out.shape(), out.dtype(), out.device(), stream);
}
void attention_copy_out(const Tensor& slot, const Tensor& out, const Stream& stream) {
  if (!slot.shares_storage(out)) Tensor(out).copy_(slot, stream);  // a handle: writes out's storage
}
}  // namespace

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionOptions& options, const Stream& stream) {
  AttentionOutput r;
  r.out = Tensor::empty(q.shape(), q.dtype(), q.device(), stream);
  r.lse = attention_forward_into(q, k, v, options, r.out, stream);
  return r;
}

Tensor attention_forward_into(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionOptions& options, const Tensor& out,
                              const Stream& stream) {
  const OpChecker c("attention_forward", stream);
  const AttentionOptions o = check_attention(c, q, k, v, options);
  c.compute_as("out", out, q.dtype());
  c.shape("out", out, q.shape());
  const Tensor lse =
      Tensor::empty({q.size(0), q.size(1), q.size(2)}, accum_dtype(q.dtype()), c.device(), stream);
  const Tensor slot = attention_out_slot(c, out, stream);
  QUINTET_NN_DISPATCH(c, stream, attention_forward, attention_in(c, q, stream),
                      attention_in(c, k, stream), attention_in(c, v, stream), o, slot, lse);
  attention_copy_out(slot, out, stream);
  return lse;
}

Tensor fused_qkv_heads(const Tensor& qkv, int i) {
  QUINTET_CHECK(qkv.defined() && qkv.dim() == 5 && qkv.size(2) == 3 && i >= 0 && i < 3,
                "fused_qkv_heads: qkv has shape {}, expected [batch, seq, 3, heads, head_dim] "
                "(group {} of 3)",
                qkv.defined() ? shape_str(qkv.shape()) : std::string("undefined"), i);
  // [b, s, 3, h, d] -> [3, s, b, h, d] -> [s, b, h, d] -> [b, s, h, d] -> [b, h, s, d]
  return qkv.transpose(0, 2).select(i).transpose(0, 1).transpose(1, 2);
}

FusedQkvAttention fused_qkv_attention_forward(const Tensor& qkv, const AttentionOptions& options,
                                              const Stream& stream) {
  const Tensor q = fused_qkv_heads(qkv, 0);
  FusedQkvAttention r;
  r.out = Tensor::empty({qkv.size(0), qkv.size(1), qkv.size(3), qkv.size(4)}, qkv.dtype(),
                        qkv.device(), stream);
  r.lse = attention_forward_into(q, fused_qkv_heads(qkv, 1), fused_qkv_heads(qkv, 2), options,
                                 r.out.transpose(1, 2), stream);
  return r;
}

Tensor fused_qkv_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, const AttentionOptions& options,
                                    const Stream& stream) {
  const Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device(), stream);
  QUINTET_CHECK(dout.defined() && dout.dim() == 4,
                "fused_qkv_attention_backward: dout has shape {}, expected [batch, seq, heads, "
                "head_dim]",
                dout.defined() ? shape_str(dout.shape()) : std::string("undefined"));
  attention_backward_into(dout.transpose(1, 2), fused_qkv_heads(qkv, 0), fused_qkv_heads(qkv, 1),
                          fused_qkv_heads(qkv, 2), out.transpose(1, 2), lse, options,
                          fused_qkv_heads(dqkv, 0), fused_qkv_heads(dqkv, 1),
                          fused_qkv_heads(dqkv, 2), stream);
  return dqkv;
}

void attention_merge_(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                      const Tensor& lse_b, const Stream& stream) {
  const OpChecker c("attention_merge_", stream);
  const DType t = c.compute("out", out);
  QUINTET_CHECK(out.dim() == 4, "attention_merge_: out has shape {}, expected [B, H, S, D]",
                shape_str(out.shape()));
  c.compute_as("out_b", out_b, t);
  c.shape("out_b", out_b, out.shape());
  const Shape rows{out.size(0), out.size(1), out.size(2)};
  for (const auto& [name, l] : {std::pair{"lse", &lse}, std::pair{"lse_b", &lse_b}}) {
    c.on_device(name, *l);
    QUINTET_CHECK(l->dtype() == accum_dtype(t), "attention_merge_: {} has dtype {}, expected {}",
                  name, dtype_name(l->dtype()), dtype_name(accum_dtype(t)));
    c.shape(name, *l, rows);
  }
  QUINTET_CHECK(out.is_contiguous() && lse.is_contiguous(),
                "attention_merge_: out and lse are merged in place and must be contiguous");
  const Tensor ob = out_b.contiguous(stream), lb = lse_b.contiguous(stream);
  QUINTET_NN_DISPATCH(c, stream, attention_merge_, out, lse, ob, lb);
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const AttentionOptions& options, const Stream& stream) {
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype(), q.device(), stream),
                   Tensor::empty(k.shape(), k.dtype(), k.device(), stream),
                   Tensor::empty(k.shape(), k.dtype(), k.device(), stream)};
  attention_backward_into(dout, q, k, v, out, lse, options, g.dq, g.dk, g.dv, stream);
  return g;
}

void attention_backward_into(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                             const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Stream& stream) {
  const OpChecker c("attention_backward", stream);
  const AttentionOptions o = check_attention(c, q, k, v, options);
  c.compute_as("dout", dout, q.dtype());
  c.shape("dout", dout, q.shape());
  c.compute_as("out", out, q.dtype());
  c.shape("out", out, q.shape());
  c.on_device("lse", lse);
  QUINTET_CHECK(lse.dtype() == accum_dtype(q.dtype()),
                "attention_backward: lse has dtype {}, expected {} (the forward's lse)",
                dtype_name(lse.dtype()), dtype_name(accum_dtype(q.dtype())));
  c.shape("lse", lse, {q.size(0), q.size(1), q.size(2)});
  c.compute_as("dq", dq, q.dtype());
  c.shape("dq", dq, q.shape());
  for (const auto& [name, g] : {std::pair{"dk", &dk}, std::pair{"dv", &dv}}) {
    c.compute_as(name, *g, q.dtype());
    c.shape(name, *g, k.shape());
  }
  const Tensor lc = lse.contiguous(stream);
  const Tensor gq = attention_out_slot(c, dq, stream), gk = attention_out_slot(c, dk, stream),
               gv = attention_out_slot(c, dv, stream);
  QUINTET_NN_DISPATCH(c, stream, attention_backward, attention_in(c, dout, stream),
                      attention_in(c, q, stream), attention_in(c, k, stream),
                      attention_in(c, v, stream), attention_in(c, out, stream), lc, o, gq, gk, gv);
  attention_copy_out(gq, dq, stream);
  attention_copy_out(gk, dk, stream);
  attention_copy_out(gv, dv, stream);
}

}  // namespace quintet::nn
