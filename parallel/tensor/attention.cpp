// Causal self-attention with heads split over tp: the math of nn::CausalSelfAttention
// (lib/nn/attention_layer.cpp) on this rank's heads.
#include "quintet/parallel/tensor/attention.hpp"

#include "quintet/parallel/tensor/regions.hpp"

namespace quintet {

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
                                     std::int64_t max_seq_len,
                                     const ParallelAttentionOptions& options)
    : tp_size_(tp.size()),
      dim_(dim),
      local_heads_(checked_local_heads(dim, heads, tp.size())),
      head_dim_(dim / heads),
      max_seq_len_(max_seq_len),
      sp_(options.sequence_parallel),
      cp_(options.cp != nullptr && options.cp->size() > 1 ? options.cp : nullptr),
      cp_kind_(options.cp_kind) {
  QUINTET_CHECK(cp_ == nullptr || cp_kind_ != context::ContextParallelKind::all_to_all ||
                    local_heads_ % cp_->size() == 0,
                "ParallelAttention: all-to-all context parallelism splits the {} heads of each "
                "tp rank (heads {} / tp {}) over cp {}, which does not divide them; use ring "
                "attention or a head count divisible by tp x cp",
                local_heads_, heads, tp.size(), cp_ == nullptr ? 1 : cp_->size());
  QUINTET_CHECK(max_seq_len > 0, "ParallelAttention: max_seq_len = {} must be > 0", max_seq_len);
  qkv_ =
      &add_module("qkv", std::make_unique<ColumnParallelLinear>(
                             tp, dim, 3 * dim,
                             ColumnParallelOptions{.bias = options.bias,
                                                   .init_std = options.init_std,
                                                   .sequence_parallel = options.sequence_parallel,
                                                   .fused_parts = 3,
                                                   .overlap_chunks = options.overlap_chunks}));
  proj_ = &add_module("proj", std::make_unique<RowParallelLinear>(
                                  tp, dim, dim,
                                  RowParallelOptions{.bias = options.bias,
                                                     .init_std = options.proj_init_std,
                                                     .sequence_parallel = options.sequence_parallel,
                                                     .overlap_chunks = options.overlap_chunks}));
}

Tensor ParallelAttention::forward(nn::Context& ctx, const Tensor& x) {
  QUINTET_CHECK(x.defined() && x.dim() == 3 && x.size(2) == dim_,
                "ParallelAttention: x has shape {}, expected [batch, seq{}, {}]",
                x.defined() ? shape_str(x.shape()) : std::string("undefined"), sp_ ? "/tp" : "",
                dim_);
  const std::int64_t seq = sp_ ? x.size(1) * tp_size_ : x.size(1);  // this cp rank's tokens
  const std::int64_t total = cp_ != nullptr ? seq * cp_->size() : seq;
  QUINTET_CHECK(total <= max_seq_len_,
                "ParallelAttention: sequence of {} tokens is longer than the causal mask allows "
                "(max_seq_len = {}); shorten it or build the layer with a larger max_seq_len",
                total, max_seq_len_);
  const Stream& st = ctx.stream();
  const std::int64_t b = x.size(0), h = local_heads_, hd = head_dim_;
  const Tensor qkv = qkv_->forward(ctx, x).view({b, seq, 3, h, hd});
  if (cp_ == nullptr) {  // the heads read in place, the output written ready for the projection
    nn::AttentionOptions opt;
    opt.causal = true;
    const nn::FusedQkvAttention a = nn::fused_qkv_attention_forward(qkv, opt, st);
    ctx.save(*this, {qkv, a.out, a.lse});
    return proj_->forward(ctx, a.out.view({b, seq, h * hd}));
  }
  auto head = [&](int i) { return nn::fused_qkv_heads(qkv, i).contiguous(st); };
  const Tensor q = head(0), k = head(1), v = head(2);
  Tensor out;
  if (cp_kind_ == context::ContextParallelKind::ring) {
    nn::AttentionOutput a = context::ring_attention_forward(*cp_, q, k, v, {}, st);
    ctx.save(*this, {q, k, v, a.out, a.lse});
    out = std::move(a.out);
  } else {  // all-to-all: keeps the head-split, whole-sequence tensors for backward
    context::UlyssesOutput u = context::ulysses_attention_forward(*cp_, q, k, v, {}, st);
    ctx.save(*this, {u.saved.q, u.saved.k, u.saved.v, u.saved.out, u.saved.lse});
    out = std::move(u.out);
  }
  const Tensor merged = out.transpose(1, 2).contiguous(st).view({b, seq, h * hd});
  return proj_->forward(ctx, merged);
}

Tensor ParallelAttention::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& st = ctx.stream();
  const Tensor dmerged = proj_->backward(ctx, dy);
  const auto sv = ctx.take(*this);
  const std::int64_t b = dmerged.size(0), s = dmerged.size(1), h = local_heads_, hd = head_dim_;
  if (cp_ == nullptr) {
    const Tensor &qkv = sv[0], &out = sv[1], &lse = sv[2];
    nn::AttentionOptions opt;
    opt.causal = true;
    const Tensor dqkv = nn::fused_qkv_attention_backward(dmerged.contiguous(st).view(out.shape()),
                                                         qkv, out, lse, opt, st);
    return qkv_->backward(ctx, dqkv.view({b, s, 3 * h * hd}));
  }
  const Tensor &q = sv[0], &k = sv[1], &v = sv[2], &out = sv[3], &lse = sv[4];
  const Tensor dout = dmerged.view({b, s, h, hd}).transpose(1, 2).contiguous(st);
  nn::AttentionGrads g;
  if (cp_kind_ == context::ContextParallelKind::ring) {
    g = context::ring_attention_backward(*cp_, dout, q, k, v, out, lse, {}, st);
  } else {
    g = context::ulysses_attention_backward(*cp_, dout, {q, k, v, out, lse}, {}, st);
  }
  Tensor dqkv = Tensor::empty({b, s, 3, h, hd}, dout.dtype(), dout.device(), st);
  const Tensor* parts[3] = {&g.dq, &g.dk, &g.dv};
  for (int i = 0; i < 3; ++i) nn::fused_qkv_heads(dqkv, i).copy_(*parts[i], st);
  return qkv_->backward(ctx, dqkv.view({b, s, 3 * h * hd}));
}

}  // namespace quintet
