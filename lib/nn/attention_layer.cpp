// CausalSelfAttention: the fused qkv projection, the split into heads, the attention op and the
// output projection.
#include "quintet/nn/layers.hpp"

namespace quintet::nn {

CausalSelfAttention::CausalSelfAttention(std::int64_t dim, std::int64_t heads,
                                         std::int64_t max_seq_len,
                                         const AttentionLayerOptions& options)
    : dim_(dim), heads_(heads), max_seq_len_(max_seq_len) {
  QUINTET_CHECK(dim > 0 && heads > 0 && dim % heads == 0,
                "CausalSelfAttention: dim = {} must be a positive multiple of heads = {}", dim,
                heads);
  QUINTET_CHECK(max_seq_len > 0, "CausalSelfAttention: max_seq_len = {} must be > 0", max_seq_len);
  qkv_ = &add_module(
      "qkv", std::make_unique<Linear>(dim, 3 * dim, LinearOptions{options.bias, options.init_std}));
  proj_ = &add_module("proj", std::make_unique<Linear>(
                                  dim, dim, LinearOptions{options.bias, options.proj_init_std}));
}

Tensor CausalSelfAttention::forward(Context& ctx, const Tensor& x) {
  QUINTET_CHECK(x.dim() == 3 && x.size(2) == dim_,
                "CausalSelfAttention: x has shape {}, expected [batch, seq, {}]",
                shape_str(x.shape()), dim_);
  const std::int64_t b = x.size(0), s = x.size(1), hd = dim_ / heads_;
  QUINTET_CHECK(s <= max_seq_len_,
                "CausalSelfAttention: sequence of {} tokens is longer than the causal mask allows "
                "(max_seq_len = {}); shorten it or build the layer with a larger max_seq_len",
                s, max_seq_len_);
  const Stream& st = ctx.stream();
  const Tensor qkv = qkv_->forward(ctx, x).view({b, s, 3, heads_, hd});
  // [b, s, 1, h, hd] -> [b, h, 1, s, hd] -> contiguous [b, h, s, hd]
  auto head = [&](int i) {
    return qkv.narrow(2, i, 1).transpose(1, 3).contiguous(st).view({b, heads_, s, hd});
  };
  const Tensor q = head(0), k = head(1), v = head(2);
  AttentionOptions opt;
  opt.causal = true;
  const AttentionOutput a = attention_forward(q, k, v, opt, st);
  ctx.save(*this, {q, k, v, a.out, a.lse});
  const Tensor merged = a.out.transpose(1, 2).contiguous(st).view({b, s, dim_});
  return proj_->forward(ctx, merged);
}

Tensor CausalSelfAttention::backward(Context& ctx, const Tensor& dy) {
  const Stream& st = ctx.stream();
  const Tensor dmerged = proj_->backward(ctx, dy);
  const auto sv = ctx.take(*this);
  const Tensor &q = sv[0], &k = sv[1], &v = sv[2], &out = sv[3], &lse = sv[4];
  const std::int64_t b = q.size(0), s = q.size(2), hd = q.size(3);
  const Tensor dout = dmerged.view({b, s, heads_, hd}).transpose(1, 2).contiguous(st);
  AttentionOptions opt;
  opt.causal = true;
  const AttentionGrads g = attention_backward(dout, q, k, v, out, lse, opt, st);
  Tensor dqkv = Tensor::empty({b, s, 3, heads_, hd}, q.dtype(), q.device(), st);
  const Tensor* parts[3] = {&g.dq, &g.dk, &g.dv};
  for (int i = 0; i < 3; ++i) {
    dqkv.narrow(2, i, 1).transpose(1, 3).copy_(parts[i]->view({b, heads_, 1, s, hd}), st);
  }
  return qkv_->backward(ctx, dqkv.view({b, s, 3 * dim_}));
}

}  // namespace quintet::nn
