// The device dispatch of the mixture-of-experts ops of quintet/nn/ops.hpp: the fused router and
// the permutation / un-permutation of the token rows. Same scheme as ops.cpp.
#include <algorithm>
#include <cmath>

#include "nn/op_checks.hpp"
#include "nn/op_dispatch.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn {

using detail::OpChecker;

namespace {

// The most experts the GPU router takes: one warp's shared statistics of 2 E floats fit in 48 KiB.
constexpr std::int64_t kMaxGpuExperts = 4096;

// t: a [rows, cols] tensor of dtype on the stream's device (rows < 0: any); returns it contiguous.
Tensor matrix(const OpChecker& c, const char* name, const Tensor& t, DType dtype, std::int64_t rows,
              std::int64_t cols, const Stream& stream) {
  c.on_device(name, t);
  QUINTET_CHECK(t.dtype() == dtype && t.dim() == 2 && (rows < 0 || t.size(0) == rows) &&
                    (cols < 0 || t.size(1) == cols),
                "{}: {} must be a [{}, {}] {} tensor, got {}", c.op(), name,
                rows < 0 ? std::string("rows") : std::to_string(rows),
                cols < 0 ? std::string("cols") : std::to_string(cols), dtype_name(dtype), t.str());
  return t.contiguous(stream);
}

void check_route_options(const OpChecker& c, const RouteOptions& o, std::int64_t tokens,
                         std::int64_t experts) {
  QUINTET_CHECK(o.top_k >= 1 && o.top_k <= 8 && o.top_k <= experts,
                "{}: top_k = {} must be between 1 and min(8, experts = {})", c.op(), o.top_k,
                experts);
  QUINTET_CHECK(o.score == RouteScore::softmax || o.score == RouteScore::sigmoid,
                "{}: unknown score function {}", c.op(), static_cast<int>(o.score));
  QUINTET_CHECK(o.groups >= 0 && (o.groups == 0 || tokens % o.groups == 0),
                "{}: {} tokens do not split into groups = {} equal groups", c.op(), tokens,
                o.groups);
  QUINTET_CHECK(std::isfinite(o.z_scale), "{}: z_scale = {} must be finite", c.op(), o.z_scale);
  QUINTET_CHECK(!c.on_cuda() || experts <= kMaxGpuExperts,
                "{}: {} experts; the GPU router takes at most {}", c.op(), experts, kMaxGpuExperts);
}

}  // namespace

// ---- routing --------------------------------------------------------------------------------

RouteOutput moe_route_forward(const Tensor& logits, const Tensor& bias, const RouteOptions& options,
                              const Tensor& z_sum, const Stream& stream) {
  const OpChecker c("moe_route_forward", stream);
  const Tensor lg = matrix(c, "logits", logits, DType::f32, -1, -1, stream);
  const std::int64_t T = lg.size(0), E = lg.size(1);
  QUINTET_CHECK(E >= 1, "moe_route_forward: logits {} have no expert", lg.str());
  check_route_options(c, options, T, E);
  Tensor b;
  if (bias.defined()) {
    c.on_device("bias", bias);
    QUINTET_CHECK(bias.dtype() == DType::f32 && bias.numel() == E,
                  "moe_route_forward: bias must be a [{}] f32 tensor, got {}", E, bias.str());
    b = bias.contiguous(stream).view({E});
  }
  if (z_sum.defined()) {
    c.on_device("z_sum", z_sum);
    QUINTET_CHECK(z_sum.dtype() == DType::f64 && z_sum.numel() == 1 && z_sum.is_contiguous(),
                  "moe_route_forward: z_sum must be a contiguous [1] f64 tensor, got {}",
                  z_sum.str());
  }
  const int k = options.top_k;
  const Device dev = c.device();
  RouteOutput r;
  r.probs = Tensor::empty({T, E}, DType::f32, dev, stream);
  r.experts = Tensor::empty({T, k}, DType::i32, dev, stream);
  r.weights = Tensor::empty({T, k}, DType::f32, dev, stream);
  r.kept = Tensor::empty({T, k}, DType::u8, dev, stream);
  r.lse = Tensor::empty({T}, DType::f32, dev, stream);
  if (options.groups > 0) {
    r.counts = Tensor::empty({options.groups, E}, DType::f32, dev, stream);
    r.prob_sum = Tensor::empty({options.groups, E}, DType::f32, dev, stream);
  }
  QUINTET_NN_DISPATCH(c, stream, moe_route_forward, lg, b, options, r.probs, r.experts, r.weights,
                      r.kept, r.lse, r.counts, r.prob_sum, z_sum);
  return r;
}

std::int64_t moe_drop_over_capacity_(const Tensor& probs, const Tensor& experts,
                                     std::int64_t capacity, const Tensor& weights,
                                     const Tensor& kept, const Stream& stream) {
  const OpChecker c("moe_drop_over_capacity_", stream);
  const Tensor p = matrix(c, "probs", probs, DType::f32, -1, -1, stream);
  const std::int64_t T = p.size(0);
  const Tensor ex = matrix(c, "experts", experts, DType::i32, T, -1, stream);
  const std::int64_t k = ex.size(1);
  matrix(c, "weights", weights, DType::f32, T, k, stream);
  matrix(c, "kept", kept, DType::u8, T, k, stream);
  QUINTET_CHECK(weights.is_contiguous() && kept.is_contiguous(),
                "moe_drop_over_capacity_: weights and kept must be contiguous (written in place)");
  QUINTET_CHECK(capacity >= 1, "moe_drop_over_capacity_: capacity = {} must be >= 1", capacity);
  if (c.on_cuda()) {  // OpChecker has rejected a CUDA stream in a build without the kernels
#if QUINTET_NN_HAS_CUDA_OPS
    const DeviceGuard guard(c.device());
    cuda_ops::moe_drop_over_capacity_(p, ex, capacity, weights, kept, stream);
#endif
    return -1;
  }
  return cpu_ops::moe_drop_over_capacity_(p, ex, capacity, weights, kept);
}

Tensor moe_route_backward(const Tensor& dweights, const Tensor& logits, const Tensor& probs,
                          const Tensor& experts, const Tensor& kept, const Tensor& lse,
                          const Tensor& counts, double aux_scale, double z_scale,
                          const RouteOptions& options, const Stream& stream) {
  const OpChecker c("moe_route_backward", stream);
  const Tensor lg = matrix(c, "logits", logits, DType::f32, -1, -1, stream);
  const std::int64_t T = lg.size(0), E = lg.size(1);
  check_route_options(c, options, T, E);
  const int k = options.top_k;
  const Tensor dw = matrix(c, "dweights", dweights, DType::f32, T, k, stream);
  const Tensor p = matrix(c, "probs", probs, DType::f32, T, E, stream);
  const Tensor ex = matrix(c, "experts", experts, DType::i32, T, k, stream);
  const Tensor kp = matrix(c, "kept", kept, DType::u8, T, k, stream);
  c.on_device("lse", lse);
  QUINTET_CHECK(lse.dtype() == DType::f32 && lse.numel() == T,
                "moe_route_backward: lse must be a [{}] f32 tensor, got {}", T, lse.str());
  const Tensor ls = lse.contiguous(stream).view({T});
  Tensor cn;
  if (counts.defined()) {
    cn = matrix(c, "counts", counts, DType::f32, -1, E, stream);
    QUINTET_CHECK(cn.size(0) >= 1 && T % cn.size(0) == 0,
                  "moe_route_backward: {} tokens do not split into the counts' {} groups", T,
                  cn.size(0));
  }
  QUINTET_CHECK(std::isfinite(aux_scale) && std::isfinite(z_scale),
                "moe_route_backward: aux_scale = {} and z_scale = {} must be finite", aux_scale,
                z_scale);
  Tensor dlogits = Tensor::empty({T, E}, DType::f32, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, moe_route_backward, dw, lg, p, ex, kp, ls, cn, aux_scale, z_scale,
                      options, dlogits);
  return dlogits;
}

// ---- permutation ----------------------------------------------------------------------------

PermuteOutput moe_permute(const Tensor& x, const Tensor& experts, const Tensor& kept,
                          std::int64_t num_experts, const Stream& stream) {
  const OpChecker c("moe_permute", stream);
  const DType t = c.compute("x", x);
  QUINTET_CHECK(x.dim() == 2, "moe_permute: x must be [tokens, d], got {}", x.str());
  const std::int64_t T = x.size(0), d = x.size(1);
  const Tensor ex = matrix(c, "experts", experts, DType::i32, T, -1, stream);
  const std::int64_t k = ex.size(1);
  const Tensor kp = matrix(c, "kept", kept, DType::u8, T, k, stream);
  QUINTET_CHECK(num_experts >= 1 && num_experts <= (std::int64_t{1} << 30),
                "moe_permute: num_experts = {} must be between 1 and 2^30", num_experts);
  const Device dev = c.device();
  PermuteOutput p;
  p.rows = Tensor::empty({T * k, d}, t, dev, stream);
  p.counts = Tensor::empty({num_experts}, DType::i64, dev, stream);
  p.offsets = Tensor::empty({num_experts + 1}, DType::i64, dev, stream);
  p.source = Tensor::empty({T * k}, DType::i32, dev, stream);
  p.slot = Tensor::empty({T, k}, DType::i32, dev, stream);
  QUINTET_NN_DISPATCH(c, stream, moe_permute, x.contiguous(stream), ex, kp, p.rows, p.counts,
                      p.offsets, p.source, p.slot);
  return p;
}

void moe_unpermute_into(const Tensor& rows, const Tensor& slot, const Tensor& weights,
                        const Tensor& out, const Stream& stream) {
  const OpChecker c("moe_unpermute", stream);
  const DType t = c.compute("rows", rows);
  QUINTET_CHECK(rows.dim() == 2, "moe_unpermute: rows must be [R, d], got {}", rows.str());
  const Tensor sl = matrix(c, "slot", slot, DType::i32, -1, -1, stream);
  const std::int64_t T = sl.size(0), k = sl.size(1);
  const Tensor w =
      weights.defined() ? matrix(c, "weights", weights, DType::f32, T, k, stream) : Tensor();
  c.compute_as("out", out, t);
  c.shape("out", out, {T, rows.size(1)});
  QUINTET_CHECK(out.is_contiguous(), "moe_unpermute: out must be contiguous (written in place)");
  QUINTET_NN_DISPATCH(c, stream, moe_unpermute, rows.contiguous(stream), sl, w, out);
}

Tensor moe_unpermute(const Tensor& rows, const Tensor& slot, const Tensor& weights,
                     const Stream& stream) {
  QUINTET_CHECK(rows.defined() && rows.dim() == 2 && slot.defined() && slot.dim() == 2,
                "moe_unpermute: rows [R, d] and slot [T, k] expected, got {} and {}", rows.str(),
                slot.str());
  Tensor y = Tensor::empty({slot.size(0), rows.size(1)}, rows.dtype(), stream.device(), stream);
  moe_unpermute_into(rows, slot, weights, y, stream);
  return y;
}

UnpermuteGrads moe_unpermute_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                                      const Tensor& source, const Tensor& weights,
                                      const Stream& stream) {
  const OpChecker c("moe_unpermute_backward", stream);
  const DType t = c.compute("dy", dy);
  c.compute_as("rows", rows, t);
  QUINTET_CHECK(dy.dim() == 2 && rows.dim() == 2 && rows.size(1) == dy.size(1),
                "moe_unpermute_backward: dy [T, d] and rows [R, d] expected, got {} and {}",
                dy.str(), rows.str());
  const std::int64_t T = dy.size(0);
  const Tensor sl = matrix(c, "slot", slot, DType::i32, T, -1, stream);
  const std::int64_t k = sl.size(1);
  const Tensor w = matrix(c, "weights", weights, DType::f32, T, k, stream);
  c.on_device("source", source);
  QUINTET_CHECK(source.dtype() == DType::i32 && source.dim() == 1 && source.numel() == T * k &&
                    rows.size(0) <= T * k,
                "moe_unpermute_backward: source must be a [{}] i32 tensor and rows at most {}, "
                "got {} and {}",
                T * k, T * k, source.str(), rows.str());
  UnpermuteGrads g;
  g.drows = Tensor::empty(rows.shape(), t, c.device(), stream);
  g.dweights = Tensor::empty({T, k}, DType::f32, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, moe_unpermute_backward, dy.contiguous(stream),
                      rows.contiguous(stream), sl, source.contiguous(stream), w, g.drows,
                      g.dweights);
  return g;
}

}  // namespace quintet::nn
