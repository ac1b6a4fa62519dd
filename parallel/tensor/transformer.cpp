// Parallel attention, MLP and transformer block: the math of nn's CausalSelfAttention, MLP and
// TransformerBlock (lib/nn/attention_layer.cpp, lib/nn/layers.cpp) on this rank's heads and
// hidden features.
#include "parallel/tensor/internal/regions.hpp"
#include "quintet/parallel/tensor/transformer.hpp"

namespace quintet {

// ---- ParallelAttention ------------------------------------------------------------------------

namespace {
std::int64_t checked_local_heads(std::int64_t dim, std::int64_t heads, int tp) {
  QUINTET_CHECK(dim > 0 && heads > 0 && dim % heads == 0,
                "ParallelAttention: dim = {} must be a positive multiple of heads = {}", dim,
                heads);
  check_divisible("ParallelAttention: heads", heads, tp);
  return heads / tp;
}
}  // namespace

ParallelAttention::ParallelAttention(Communicator& tp, std::int64_t dim, std::int64_t heads,
                                     std::int64_t max_seq_len, bool bias, float init_std,
                                     float proj_init_std, bool sequence_parallel)
    : tp_size_(tp.size()),
      dim_(dim),
      local_heads_(checked_local_heads(dim, heads, tp.size())),
      head_dim_(dim / heads),
      max_seq_len_(max_seq_len),
      sp_(sequence_parallel) {
  QUINTET_CHECK(max_seq_len > 0, "ParallelAttention: max_seq_len = {} must be > 0", max_seq_len);
  qkv_ = &add_module("qkv", std::make_unique<ColumnParallelLinear>(tp, dim, 3 * dim, bias, init_std,
                                                                   sequence_parallel, 3));
  proj_ = &add_module("proj", std::make_unique<RowParallelLinear>(tp, dim, dim, bias, proj_init_std,
                                                                  sequence_parallel));
}

Tensor ParallelAttention::forward(nn::Context& ctx, const Tensor& x) {
  QUINTET_CHECK(x.defined() && x.dim() == 3 && x.size(2) == dim_,
                "ParallelAttention: x has shape {}, expected [batch, seq{}, {}]",
                x.defined() ? shape_str(x.shape()) : std::string("undefined"), sp_ ? "/tp" : "",
                dim_);
  const std::int64_t seq = sp_ ? x.size(1) * tp_size_ : x.size(1);
  QUINTET_CHECK(seq <= max_seq_len_,
                "ParallelAttention: sequence of {} tokens is longer than the causal mask allows "
                "(max_seq_len = {}); shorten it or build the layer with a larger max_seq_len",
                seq, max_seq_len_);
  const Stream& st = ctx.stream();
  const std::int64_t b = x.size(0), h = local_heads_, hd = head_dim_;
  const Tensor qkv = qkv_->forward(ctx, x).view({b, seq, 3, h, hd});
  auto head = [&](int i) {
    return qkv.narrow(2, i, 1).transpose(1, 3).contiguous(st).view({b, h, seq, hd});
  };
  const Tensor q = head(0), k = head(1), v = head(2);
  nn::AttentionOptions opt;
  opt.causal = true;
  const nn::AttentionOutput a = nn::attention_forward(q, k, v, opt, st);
  ctx.save(*this, {q, k, v, a.out, a.lse});
  const Tensor merged = a.out.transpose(1, 2).contiguous(st).view({b, seq, h * hd});
  return proj_->forward(ctx, merged);
}

Tensor ParallelAttention::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& st = ctx.stream();
  const Tensor dmerged = proj_->backward(ctx, dy);
  const auto sv = ctx.take(*this);
  const Tensor &q = sv[0], &k = sv[1], &v = sv[2], &out = sv[3], &lse = sv[4];
  const std::int64_t b = q.size(0), h = q.size(1), s = q.size(2), hd = q.size(3);
  const Tensor dout = dmerged.view({b, s, h, hd}).transpose(1, 2).contiguous(st);
  nn::AttentionOptions opt;
  opt.causal = true;
  const nn::AttentionGrads g = nn::attention_backward(dout, q, k, v, out, lse, opt, st);
  Tensor dqkv = Tensor::empty({b, s, 3, h, hd}, q.dtype(), q.device(), st);
  const Tensor* parts[3] = {&g.dq, &g.dk, &g.dv};
  for (int i = 0; i < 3; ++i) {
    dqkv.narrow(2, i, 1).transpose(1, 3).copy_(parts[i]->view({b, h, 1, s, hd}), st);
  }
  return qkv_->backward(ctx, dqkv.view({b, s, 3 * h * hd}));
}

// ---- ParallelMLP ------------------------------------------------------------------------------

ParallelMLP::ParallelMLP(Communicator& tp, std::int64_t dim, std::int64_t hidden,
                         nn::Activation activation, float init_std, float proj_init_std,
                         bool sequence_parallel)
    : tp_(&tp), activation_(activation), sp_(sequence_parallel) {
  check_divisible("ParallelMLP: hidden", hidden, tp.size());
  const bool gelu = activation == nn::Activation::gelu;
  // SwiGLU's gate and up share one entry into the tp region (done here, not by each linear).
  fc_ = &add_module("fc", std::make_unique<ColumnParallelLinear>(tp, dim, hidden, gelu, init_std,
                                                                 sequence_parallel, 1, gelu));
  if (!gelu) {
    up_ = &add_module("up", std::make_unique<ColumnParallelLinear>(tp, dim, hidden, false, init_std,
                                                                   sequence_parallel, 1, false));
  }
  proj_ = &add_module("proj", std::make_unique<RowParallelLinear>(
                                  tp, hidden, dim, gelu, proj_init_std, sequence_parallel));
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
    const Tensor a = fc_->forward(ctx, xin);
    const Tensor u = up_->forward(ctx, xin);
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
  return sp_ ? tp_detail::start_reduce_scatter_sequence(dx, *tp_, s).finish(s)
             : tp_detail::start_all_reduce(dx, *tp_, s).finish(s);
}

// ---- ParallelTransformerBlock -----------------------------------------------------------------

std::unique_ptr<nn::Module> make_parallel_norm(nn::NormKind kind, std::int64_t dim, float eps,
                                               bool sequence_parallel) {
  if (kind == nn::NormKind::rmsnorm) {
    return std::make_unique<ParallelRMSNorm>(dim, eps, sequence_parallel);
  }
  return std::make_unique<ParallelLayerNorm>(dim, eps, sequence_parallel);
}

ParallelTransformerBlock::ParallelTransformerBlock(Communicator& tp,
                                                   const ParallelTransformerConfig& c) {
  const bool sp = c.sequence_parallel;
  norm1_ = &add_module("norm1", make_parallel_norm(c.norm, c.dim, c.eps, sp));
  attn_ = &add_module("attn",
                      std::make_unique<ParallelAttention>(tp, c.dim, c.heads, c.max_seq_len, c.bias,
                                                          c.init_std, c.proj_init_std, sp));
  norm2_ = &add_module("norm2", make_parallel_norm(c.norm, c.dim, c.eps, sp));
  mlp_ = &add_module("mlp", std::make_unique<ParallelMLP>(tp, c.dim, c.hidden, c.activation,
                                                          c.init_std, c.proj_init_std, sp));
}

Tensor ParallelTransformerBlock::forward(nn::Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  const Tensor h = nn::add(x, attn_->forward(ctx, norm1_->forward(ctx, x)), s);
  return nn::add(h, mlp_->forward(ctx, norm2_->forward(ctx, h)), s);
}

Tensor ParallelTransformerBlock::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& s = ctx.stream();
  Tensor dh = norm2_->backward(ctx, mlp_->backward(ctx, dy));
  nn::add_(dh, dy, 1.0f, s);
  Tensor dx = norm1_->backward(ctx, attn_->backward(ctx, dh));
  nn::add_(dx, dh, 1.0f, s);
  return dx;
}

}  // namespace quintet
