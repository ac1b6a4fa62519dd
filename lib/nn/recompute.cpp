// Activation recomputation of a module (see recompute.hpp).
#include "quintet/nn/recompute.hpp"

#include "quintet/core/error.hpp"

namespace quintet::nn {

Recompute::Recompute(std::unique_ptr<Module> inner) {
  QUINTET_CHECK(inner != nullptr, "Recompute: no module to wrap");
  inner_ = &add_module("", std::move(inner));  // "": the inner names, unprefixed
}

Tensor Recompute::forward(Context& ctx, const Tensor& x) {
  Context scratch(ctx.stream());
  scratch.set_loss_scale(ctx.loss_scale());
  scratch.set_recomputing(ctx.recomputing());
  scratch.set_forward_only(ctx.forward_only());
  Tensor y = inner_->forward(scratch, x);
  ctx.save(*this, {x});
  return y;
}

Tensor Recompute::backward(Context& ctx, const Tensor& dy) {
  const Tensor x = ctx.take(*this).at(0);
  Context scratch(ctx.stream());
  scratch.set_loss_scale(ctx.loss_scale());
  scratch.set_recomputing(true);
  scratch.set_defer_weight_gradients(ctx.defers_weight_gradients());
  (void)inner_->forward(scratch, x);
  Tensor dx = inner_->backward(scratch, dy);
  scratch.move_deferred_to(ctx);
  return dx;
}

}  // namespace quintet::nn
