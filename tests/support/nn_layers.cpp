// Linear, norms, MLP, Embedding and the transformer block (attention is in attention_layer.cpp).
#include "support/nn_layers.hpp"

namespace quintet::nn {

namespace {
ParameterAttributes no_decay() {
  ParameterAttributes a;
  a.weight_decay = false;
  return a;
}
}  // namespace

// ---- Linear ---------------------------------------------------------------------------------

Linear::Linear(std::int64_t in, std::int64_t out, const LinearOptions& options)
    : in_(in), out_(out) {
  QUINTET_CHECK(in > 0 && out > 0, "Linear({}, {}): sizes must be > 0", in, out);
  weight_ = &add_parameter("weight", {out, in}, ParameterInit::normal(options.init_std));
  if (options.bias) bias_ = &add_parameter("bias", {out}, ParameterInit::zeros(), no_decay());
}

Tensor Linear::forward(Context& ctx, const Tensor& x) {
  const Tensor y = linear_forward(x, weight_->use(ctx.stream()),
                                  bias_ ? bias_->use(ctx.stream()) : Tensor(), ctx.stream());
  ctx.save(*this, {x});
  return y;
}

Tensor Linear::backward(Context& ctx, const Tensor& dy) {
  const Tensor x = ctx.take(*this).at(0);
  accumulate_gradients(
      ctx, {weight_, bias_},
      [dy, x](const std::vector<Tensor>& g, const Stream& st) {
        linear_backward_weight(dy, x, g[0], g[1], st);
      },
      GradTiming::deferrable);
  return linear_backward_input(dy, weight_->data(), ctx.stream());
}

// ---- norms ----------------------------------------------------------------------------------

LayerNorm::LayerNorm(std::int64_t dim, float eps) : eps_(eps) {
  weight_ = &add_parameter("weight", {dim}, ParameterInit::ones(), no_decay());
  bias_ = &add_parameter("bias", {dim}, ParameterInit::zeros(), no_decay());
}

Tensor LayerNorm::forward(Context& ctx, const Tensor& x) {
  NormOutput o = layernorm_forward(x, weight_->use(ctx.stream()), bias_->use(ctx.stream()), eps_,
                                   ctx.stream());
  ctx.save(*this, {x, o.mean, o.rstd});
  return o.y;
}

Tensor LayerNorm::backward(Context& ctx, const Tensor& dy) {
  const auto s = ctx.take(*this);
  Tensor dx;
  accumulate_gradients(
      ctx, {weight_, bias_},
      [&](const std::vector<Tensor>& g, const Stream& st) {
        dx = layernorm_backward(dy, s[0], weight_->data(), s[1], s[2], g[0], g[1], st);
      },
      GradTiming::now);
  return dx;
}

RMSNorm::RMSNorm(std::int64_t dim, float eps) : eps_(eps) {
  weight_ = &add_parameter("weight", {dim}, ParameterInit::ones(), no_decay());
}

Tensor RMSNorm::forward(Context& ctx, const Tensor& x) {
  NormOutput o = rmsnorm_forward(x, weight_->use(ctx.stream()), eps_, ctx.stream());
  ctx.save(*this, {x, o.rstd});
  return o.y;
}

Tensor RMSNorm::backward(Context& ctx, const Tensor& dy) {
  const auto s = ctx.take(*this);
  Tensor dx;
  accumulate_gradients(
      ctx, {weight_},
      [&](const std::vector<Tensor>& g, const Stream& st) {
        dx = rmsnorm_backward(dy, s[0], weight_->data(), s[1], g[0], st);
      },
      GradTiming::now);
  return dx;
}

// ---- MLP ------------------------------------------------------------------------------------

MLP::MLP(std::int64_t dim, std::int64_t hidden, Activation activation, float init_std,
         float proj_init_std)
    : activation_(activation) {
  const bool bias = activation == Activation::gelu;
  fc_ = &add_module("fc", std::make_unique<Linear>(dim, hidden, LinearOptions{bias, init_std}));
  if (activation == Activation::swiglu) {
    up_ = &add_module("up", std::make_unique<Linear>(dim, hidden, LinearOptions{false, init_std}));
  }
  proj_ = &add_module("proj",
                      std::make_unique<Linear>(hidden, dim, LinearOptions{bias, proj_init_std}));
}

Tensor MLP::forward(Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  const Tensor a = fc_->forward(ctx, x);
  Tensor h;
  if (activation_ == Activation::gelu) {
    h = gelu_forward(a, s);
    ctx.save(*this, {a});
  } else {
    const Tensor u = up_->forward(ctx, x);
    h = swiglu_forward(a, u, s);
    ctx.save(*this, {a, u});
  }
  return proj_->forward(ctx, h);
}

Tensor MLP::backward(Context& ctx, const Tensor& dy) {
  const Stream& s = ctx.stream();
  const Tensor dh = proj_->backward(ctx, dy);
  const auto saved = ctx.take(*this);
  if (activation_ == Activation::gelu) {
    return fc_->backward(ctx, gelu_backward(dh, saved[0], s));
  }
  const SwiGluGrads g = swiglu_backward(dh, saved[0], saved[1], s);
  const Tensor dx_up = up_->backward(ctx, g.dup);  // reverse order of the forwards
  Tensor dx = fc_->backward(ctx, g.dgate);
  add_(dx, dx_up, 1.0f, s);
  return dx;
}

// ---- Embedding ------------------------------------------------------------------------------

Embedding::Embedding(std::int64_t vocab, std::int64_t dim, float init_std, std::int64_t max_len)
    : vocab_(vocab), max_len_(max_len) {
  QUINTET_CHECK(vocab > 0 && dim > 0, "Embedding({}, {}): sizes must be > 0", vocab, dim);
  weight_ = &add_parameter("weight", {vocab, dim}, ParameterInit::normal(init_std));
}

Tensor Embedding::forward(Context& ctx, const Tensor& ids) {
  QUINTET_CHECK(max_len_ == 0 || (ids.dim() >= 1 && ids.size(ids.dim() - 1) <= max_len_),
                "Embedding: ids of shape {} have a sequence longer than the {} positions this "
                "embedding has; shorten the sequence or build it with a larger max_len",
                shape_str(ids.shape()), max_len_);
  const Tensor y = embedding_forward(ids, weight_->use(ctx.stream()), ctx.stream());
  ctx.save(*this, {ids});
  return y;
}

Tensor Embedding::backward(Context& ctx, const Tensor& dy) {
  const Tensor ids = ctx.take(*this).at(0);
  accumulate_gradients(
      ctx, {weight_},
      [dy, ids](const std::vector<Tensor>& g, const Stream& st) {
        embedding_backward(dy, ids, g[0], st);
      },
      GradTiming::deferrable);
  return Tensor();
}

// ---- TransformerBlock -----------------------------------------------------------------------

namespace {
std::unique_ptr<Module> make_norm(NormKind kind, std::int64_t dim, float eps) {
  if (kind == NormKind::rmsnorm) return std::make_unique<RMSNorm>(dim, eps);
  return std::make_unique<LayerNorm>(dim, eps);
}
}  // namespace

TransformerBlock::TransformerBlock(const TransformerBlockConfig& c) {
  norm1_ = &add_module("norm1", make_norm(c.norm, c.dim, c.eps));
  attn_ = &add_module(
      "attn", std::make_unique<CausalSelfAttention>(
                  c.dim, c.heads, c.max_seq_len,
                  AttentionLayerOptions{
                      .bias = c.bias, .init_std = c.init_std, .proj_init_std = c.proj_init_std}));
  norm2_ = &add_module("norm2", make_norm(c.norm, c.dim, c.eps));
  mlp_ = &add_module(
      "mlp", std::make_unique<MLP>(c.dim, c.hidden, c.activation, c.init_std, c.proj_init_std));
}

Tensor TransformerBlock::forward(Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  const Tensor h = add(x, attn_->forward(ctx, norm1_->forward(ctx, x)), s);
  return add(h, mlp_->forward(ctx, norm2_->forward(ctx, h)), s);
}

Tensor TransformerBlock::backward(Context& ctx, const Tensor& dy) {
  const Stream& s = ctx.stream();
  Tensor dh = norm2_->backward(ctx, mlp_->backward(ctx, dy));
  add_(dh, dy, 1.0f, s);
  Tensor dx = norm1_->backward(ctx, attn_->backward(ctx, dh));
  add_(dx, dh, 1.0f, s);
  return dx;
}

}  // namespace quintet::nn
