// CausalSelfAttention: the fused qkv projection, the split into heads, the attention op and the
// output projection.
#include "support/nn_layers.hpp"

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
  // The heads are read where the projection wrote them, and the output is written ready for the
  // output projection (fused_qkv_attention_forward).
  AttentionOptions opt;
  opt.causal = true;
  const FusedQkvAttention a = fused_qkv_attention_forward(qkv, opt, st);
  ctx.save(*this, {qkv, a.out, a.lse});
  return proj_->forward(ctx, a.out.view({b, s, dim_}));
}

Tensor CausalSelfAttention::backward(Context& ctx, const Tensor& dy) {
  const Stream& st = ctx.stream();
  const Tensor dmerged = proj_->backward(ctx, dy);
  const auto sv = ctx.take(*this);
  const Tensor &qkv = sv[0], &out = sv[1], &lse = sv[2];
  AttentionOptions opt;
  opt.causal = true;
  const Tensor dqkv = fused_qkv_attention_backward(dmerged.contiguous(st).view(out.shape()), qkv,
                                                   out, lse, opt, st);
  return qkv_->backward(ctx, dqkv.view({qkv.size(0), qkv.size(1), 3 * dim_}));
}

}  // namespace quintet::nn
