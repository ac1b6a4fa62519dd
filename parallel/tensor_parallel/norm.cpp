// Norms on sequence-split activations: nn's LayerNorm/RMSNorm math, with parameters marked for a
// gradient reduction over tp under sequence parallelism.
#include "quintet/parallel/tensor_parallel/norm.hpp"

namespace quintet::tensor_parallel {

namespace {
nn::ParameterAttributes norm_attrs(bool sequence_parallel) {
  nn::ParameterAttributes a;
  a.weight_decay = false;
  a.reduce_over_tp = sequence_parallel;
  return a;
}
}  // namespace

ParallelLayerNorm::ParallelLayerNorm(std::int64_t dim, const ParallelNormOptions& options)
    : eps_(options.eps) {
  const bool sequence_parallel = options.sequence_parallel;
  QUINTET_CHECK(dim > 0, "ParallelLayerNorm: dim = {} must be > 0", dim);
  weight_ =
      &add_parameter("weight", {dim}, nn::ParameterInit::ones(), norm_attrs(sequence_parallel));
  bias_ = &add_parameter("bias", {dim}, nn::ParameterInit::zeros(), norm_attrs(sequence_parallel));
}

Tensor ParallelLayerNorm::forward(nn::Context& ctx, const Tensor& x) {
  return forward_add(ctx, x, Tensor()).y;
}

ParallelNorm::SumAndNorm ParallelLayerNorm::forward_add(nn::Context& ctx, const Tensor& x,
                                                        const Tensor& residual) {
  const Stream& s = ctx.stream();
  nn::NormOutput o = nn::layernorm_forward(x, weight_->use(s), bias_->use(s), eps_, s, residual);
  const Tensor sum = residual.defined() ? o.sum : x;
  ctx.save(*this, {sum, o.mean, o.rstd});
  return {sum, o.y};
}

Tensor ParallelLayerNorm::backward(nn::Context& ctx, const Tensor& dy) {
  return backward_add(ctx, dy, Tensor());
}

Tensor ParallelLayerNorm::backward_add(nn::Context& ctx, const Tensor& dy,
                                       const Tensor& dresidual) {
  const auto v = ctx.take(*this);
  Tensor dx;
  nn::accumulate_gradients(
      ctx, {weight_, bias_},
      [&](const std::vector<Tensor>& g, const Stream& st) {
        dx = nn::layernorm_backward(dy, v[0], weight_->data(), v[1], v[2], g[0], g[1], st,
                                    dresidual);
      },
      nn::GradTiming::now);
  return dx;
}

ParallelRMSNorm::ParallelRMSNorm(std::int64_t dim, const ParallelNormOptions& options)
    : eps_(options.eps) {
  const bool sequence_parallel = options.sequence_parallel;
  QUINTET_CHECK(dim > 0, "ParallelRMSNorm: dim = {} must be > 0", dim);
  weight_ =
      &add_parameter("weight", {dim}, nn::ParameterInit::ones(), norm_attrs(sequence_parallel));
}

Tensor ParallelRMSNorm::forward(nn::Context& ctx, const Tensor& x) {
  return forward_add(ctx, x, Tensor()).y;
}

ParallelNorm::SumAndNorm ParallelRMSNorm::forward_add(nn::Context& ctx, const Tensor& x,
                                                      const Tensor& residual) {
  const Stream& s = ctx.stream();
  nn::NormOutput o = nn::rmsnorm_forward(x, weight_->use(s), eps_, s, residual);
  const Tensor sum = residual.defined() ? o.sum : x;
  ctx.save(*this, {sum, o.rstd});
  return {sum, o.y};
}

Tensor ParallelRMSNorm::backward(nn::Context& ctx, const Tensor& dy) {
  return backward_add(ctx, dy, Tensor());
}

Tensor ParallelRMSNorm::backward_add(nn::Context& ctx, const Tensor& dy, const Tensor& dresidual) {
  const auto v = ctx.take(*this);
  Tensor dx;
  nn::accumulate_gradients(
      ctx, {weight_},
      [&](const std::vector<Tensor>& g, const Stream& st) {
        dx = nn::rmsnorm_backward(dy, v[0], weight_->data(), v[1], g[0], st, dresidual);
      },
      nn::GradTiming::now);
  return dx;
}

std::unique_ptr<ParallelNorm> make_parallel_norm(nn::NormKind kind, std::int64_t dim,
                                                 const ParallelNormOptions& options) {
  if (kind == nn::NormKind::rmsnorm) return std::make_unique<ParallelRMSNorm>(dim, options);
  return std::make_unique<ParallelLayerNorm>(dim, options);
}

}  // namespace quintet::tensor_parallel
