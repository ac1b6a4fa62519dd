// The MLP split along its hidden size: the math of the tests' single-rank nn::MLP
// (tests/support/nn_layers.cpp) on this rank's hidden features.
#include "quintet/parallel/tensor_parallel/mlp.hpp"

#include "parallel/tensor_parallel/internal/regions.hpp"
#include "quintet/parallel/tensor_parallel/regions.hpp"

namespace quintet::tensor_parallel {

ParallelMLP::ParallelMLP(Communicator& tp, std::int64_t dim, std::int64_t hidden,
                         const ParallelMLPOptions& options)
    : tp_(&tp), activation_(options.activation), sp_(options.sequence_parallel) {
  check_divisible("ParallelMLP: hidden", hidden, tp.size());
  const bool gelu = options.activation == nn::Activation::gelu;
  // GELU has biases, SwiGLU none. SwiGLU's gate and up share one entry into the tp region (done
  // here, not by each linear).
  const ColumnParallelOptions column{.bias = gelu,
                                     .init_std = options.init_std,
                                     .sequence_parallel = options.sequence_parallel,
                                     .enter_region = gelu,
                                     .overlap_chunks = gelu ? options.overlap_chunks : 1,
                                     .fp8 = options.fp8};
  fc_ = &add_module("fc", std::make_unique<ColumnParallelLinear>(tp, dim, hidden, column));
  if (!gelu) {
    up_ = &add_module("up", std::make_unique<ColumnParallelLinear>(tp, dim, hidden, column));
  }
  proj_ = &add_module("proj", std::make_unique<RowParallelLinear>(
                                  tp, hidden, dim,
                                  RowParallelOptions{.bias = gelu,
                                                     .init_std = options.proj_init_std,
                                                     .sequence_parallel = options.sequence_parallel,
                                                     .overlap_chunks = options.overlap_chunks,
                                                     .fp8 = options.fp8}));
}

Tensor ParallelMLP::forward(nn::Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  Tensor h;
  if (activation_ == nn::Activation::gelu) {
    const Tensor a = fc_->forward(ctx, x);
    h = nn::gelu_forward(a, s);
    ctx.save(*this, {a});
  } else {
    const Tensor xin = sp_ ? gather_sequence(x, *tp_, s) : x;
    // One FP8 cast of xin for both where they scale it alike.
    const auto [a, u] = ColumnParallelLinear::forward_shared_input(ctx, *fc_, *up_, xin);
    h = nn::swiglu_forward(a, u, s);
    ctx.save(*this, {a, u});
  }
  return proj_->forward(ctx, h);
}

Tensor ParallelMLP::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& s = ctx.stream();
  const Tensor dh = proj_->backward(ctx, dy);
  const auto saved = ctx.take(*this);
  if (activation_ == nn::Activation::gelu) {
    return fc_->backward(ctx, nn::gelu_backward(dh, saved[0], s));
  }
  const nn::SwiGluGrads g = nn::swiglu_backward(dh, saved[0], saved[1], s);
  const Tensor dx_up = up_->backward(ctx, g.dup);
  Tensor dx = fc_->backward(ctx, g.dgate);
  nn::add_(dx, dx_up, 1.0f, s);
  return sp_ ? detail::start_reduce_scatter_sequence(dx, *tp_, s).finish(s)
             : detail::start_all_reduce(dx, *tp_, s).finish(s);
}

}  // namespace quintet::tensor_parallel
