// The device dispatch of quintet/nn/router_ops.hpp: check every argument, allocate the outputs,
// then call the CPU (lib/nn/cpu/router.cpp) or CUDA (lib/nn/cuda/router.cu) implementation, as
// ops.cpp does.
#include "quintet/nn/router_ops.hpp"

#include <string>

#include "nn/op_checks.hpp"
#include "nn/op_dispatch.hpp"
#include "nn/router_ops_impl.hpp"

namespace quintet::nn {

using detail::OpChecker;

namespace {

// A 2-D f32 tensor on the stream's device with `cols` columns (rows < 0: any); returns it
// contiguous.
Tensor f32_matrix(const OpChecker& c, const char* name, const Tensor& t, std::int64_t rows,
                  std::int64_t cols, const Stream& stream) {
  c.on_device(name, t);
  QUINTET_CHECK(t.dtype() == DType::f32 && t.dim() == 2 && (rows < 0 || t.size(0) == rows) &&
                    (cols < 0 || t.size(1) == cols),
                "{}: {} must be a 2-D f32 tensor [{}, {}], got {}", c.op(), name,
                rows < 0 ? std::string("rows") : std::to_string(rows),
                cols < 0 ? std::string("cols") : std::to_string(cols), t.str());
  return t.contiguous(stream);
}

// A weight or its gradient, [E, d] f32 with 1 <= E <= kRouterMaxExperts (d < 0: any).
Tensor weight(const OpChecker& c, const char* name, const Tensor& w, std::int64_t d,
              const Stream& stream) {
  const Tensor wc = f32_matrix(c, name, w, -1, d, stream);
  QUINTET_CHECK(wc.size(0) >= 1 && wc.size(0) <= kRouterMaxExperts,
                "{}: {} has {} experts; the router ops take 1 to {}", c.op(), name, wc.size(0),
                kRouterMaxExperts);
  return wc;
}

// x [T, d] of a compute dtype; returns it contiguous.
Tensor tokens(const OpChecker& c, const Tensor& x, const Stream& stream) {
  c.compute("x", x);
  QUINTET_CHECK(x.dim() == 2, "{}: x has shape {}, expected [tokens, dim]", c.op(),
                shape_str(x.shape()));
  return x.contiguous(stream);
}

}  // namespace

Tensor router_logits_forward(const Tensor& x, const Tensor& w, const Stream& stream) {
  const OpChecker c("router_logits_forward", stream);
  const Tensor xc = tokens(c, x, stream);
  const Tensor wc = weight(c, "w", w, xc.size(1), stream);
  Tensor logits = Tensor::empty({xc.size(0), wc.size(0)}, DType::f32, c.device(), stream);
  if (xc.size(0) > 0) QUINTET_NN_DISPATCH(c, stream, router_logits_forward, xc, wc, logits);
  return logits;
}

Tensor router_logits_backward_input(const Tensor& dlogits, const Tensor& w, DType dtype,
                                    const Stream& stream) {
  const OpChecker c("router_logits_backward_input", stream);
  const bool computes = c.on_cuda() ? (dtype == DType::bf16 || dtype == DType::f32)
                                    : (dtype == DType::f32 || dtype == DType::f64);
  QUINTET_CHECK(computes, "router_logits_backward_input: dx dtype {}; on {} the ops compute in {}",
                dtype_name(dtype), c.device().str(), c.on_cuda() ? "bf16 or f32" : "f32 or f64");
  const Tensor wc = weight(c, "w", w, -1, stream);
  const Tensor dl = f32_matrix(c, "dlogits", dlogits, -1, wc.size(0), stream);
  Tensor dx = Tensor::empty({dl.size(0), wc.size(1)}, dtype, c.device(), stream);
  if (dl.size(0) > 0) QUINTET_NN_DISPATCH(c, stream, router_logits_backward_input, dl, wc, dx);
  return dx;
}

void router_logits_backward_weight(const Tensor& dlogits, const Tensor& x, const Tensor& dw,
                                   const Stream& stream) {
  const OpChecker c("router_logits_backward_weight", stream);
  const Tensor xc = tokens(c, x, stream);
  weight(c, "dw", dw, xc.size(1), stream);
  QUINTET_CHECK(dw.is_contiguous(),
                "router_logits_backward_weight: dw must be contiguous (it is written in place)");
  const Tensor dl = f32_matrix(c, "dlogits", dlogits, xc.size(0), dw.size(0), stream);
  if (xc.size(0) > 0) QUINTET_NN_DISPATCH(c, stream, router_logits_backward_weight, dl, xc, dw);
}

}  // namespace quintet::nn
