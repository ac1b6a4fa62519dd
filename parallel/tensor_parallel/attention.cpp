// Causal self-attention with heads split over tp: the math of the tests' single-rank
// nn::CausalSelfAttention (tests/support/nn_attention_layer.cpp) on this rank's heads, with
// grouped-query attention, QK-norm and RoPE as options (attention.hpp).
#include "quintet/parallel/tensor_parallel/attention.hpp"

#include "parallel/tensor_parallel/internal/regions.hpp"
#include "quintet/parallel/tensor_parallel/norm.hpp"
#include "quintet/parallel/tensor_parallel/regions.hpp"

namespace quintet::tensor_parallel {

namespace {
std::int64_t checked_head_dim(std::int64_t dim, std::int64_t heads, std::int64_t head_dim) {
  QUINTET_CHECK(dim > 0 && heads > 0 && head_dim >= 0,
                "ParallelAttention: dim = {} and heads = {} must be > 0, head_dim = {} >= 0", dim,
                heads, head_dim);
  QUINTET_CHECK(head_dim > 0 || dim % heads == 0,
                "ParallelAttention: dim = {} must be a positive multiple of heads = {} (the head "
                "dimension is dim / heads unless head_dim is set)",
                dim, heads);
  return head_dim > 0 ? head_dim : dim / heads;
}

std::int64_t checked_kv_heads(std::int64_t heads, std::int64_t kv_heads, int tp) {
  const std::int64_t kv = kv_heads > 0 ? kv_heads : heads;
  QUINTET_CHECK(kv_heads >= 0 && heads % kv == 0,
                "ParallelAttention: kv_heads = {} must divide heads = {} (each key/value head "
                "serves heads / kv_heads query heads)",
                kv_heads, heads);
  check_divisible("ParallelAttention: heads", heads, tp);
  QUINTET_CHECK(kv % tp == 0 || tp % kv == 0,
                "ParallelAttention: kv_heads = {} and tp = {}: each tp rank holds the key/value "
                "heads of its query heads, split over tp when kv_heads is a multiple of tp and "
                "replicated over tp / kv_heads ranks when tp is a multiple of kv_heads; neither "
                "holds here",
                kv, tp);
  return kv;
}

// Part i of t [B, S, parts, H, D] as a [B, S, H, D] view.
Tensor part(const Tensor& t, int i) { return t.transpose(0, 2).select(i).transpose(0, 1); }

// [B, S, H, D] <-> [B, H, S, D] (a view).
Tensor bhsd(const Tensor& t) { return t.transpose(1, 2); }
}  // namespace

ParallelAttention::ParallelAttention(Communicator& tp, std::int64_t dim, std::int64_t heads,
                                     std::int64_t max_seq_len,
                                     const ParallelAttentionOptions& options)
    : tp_(&tp),
      tp_size_(tp.size()),
      dim_(dim),
      head_dim_(checked_head_dim(dim, heads, options.head_dim)),
      max_seq_len_(max_seq_len),
      sp_(options.sequence_parallel),
      cp_(options.cp != nullptr && options.cp->size() > 1 ? options.cp : nullptr),
      cp_kind_(options.cp_kind),
      use_rope_(options.rope) {
  const std::int64_t kv_heads = checked_kv_heads(heads, options.kv_heads, tp.size());
  local_heads_ = heads / tp.size();
  kv_replicas_ = kv_heads < tp.size() ? static_cast<int>(tp.size() / kv_heads) : 1;
  local_kv_heads_ = kv_heads * kv_replicas_ / tp.size();
  if (cp_ != nullptr && cp_kind_ == context::ContextParallelKind::all_to_all) {
    context::check_ulysses_heads(
        "ParallelAttention", local_heads_, local_kv_heads_, cp_->size(),
        fmt::format("heads {}, kv_heads {}, tp {}", heads, kv_heads, tp.size()));
  }
  QUINTET_CHECK(max_seq_len > 0, "ParallelAttention: max_seq_len = {} must be > 0", max_seq_len);
  QUINTET_CHECK(!options.rope || (head_dim_ % 2 == 0 && options.rope_theta > 0.0),
                "ParallelAttention: RoPE needs an even head_dim (got {}) and rope_theta > 0 (got "
                "{})",
                head_dim_, options.rope_theta);
  nn::check_rope_scaling(options.rope_scaling, "ParallelAttention");
  rope_.theta = options.rope_theta;
  rope_.scaling = options.rope_scaling;
  const std::int64_t attn = heads * head_dim_;
  if (kv_heads == heads) {
    qkv_ =
        &add_module("qkv", std::make_unique<ColumnParallelLinear>(
                               tp, dim, 3 * attn,
                               ColumnParallelOptions{.bias = options.bias,
                                                     .init_std = options.init_std,
                                                     .sequence_parallel = options.sequence_parallel,
                                                     .fused_parts = 3,
                                                     .overlap_chunks = options.overlap_chunks,
                                                     .fp8 = options.fp8}));
  } else {  // q and kv share one entry into the tp region (done here, not by each linear)
    const ColumnParallelOptions column{.bias = options.bias,
                                       .init_std = options.init_std,
                                       .sequence_parallel = options.sequence_parallel,
                                       .enter_region = false,
                                       .fp8 = options.fp8};
    q_ = &add_module("q", std::make_unique<ColumnParallelLinear>(tp, dim, attn, column));
    ColumnParallelOptions kv = column;
    kv.fused_parts = 2;
    kv.replicas = kv_replicas_;
    kv_ = &add_module(
        "kv", std::make_unique<ColumnParallelLinear>(tp, dim, 2 * kv_heads * head_dim_, kv));
  }
  if (options.qk_norm) {
    // Each tp rank normalises its own heads: the weights' gradients are partial sums over tp.
    const ParallelNormOptions norm{.eps = options.qk_norm_eps, .sequence_parallel = true};
    q_norm_ = &add_module("q_norm", std::make_unique<ParallelRMSNorm>(head_dim_, norm));
    k_norm_ = &add_module("k_norm", std::make_unique<ParallelRMSNorm>(head_dim_, norm));
  }
  proj_ = &add_module("proj", std::make_unique<RowParallelLinear>(
                                  tp, attn, dim,
                                  RowParallelOptions{.bias = options.bias && options.proj_bias,
                                                     .init_std = options.proj_init_std,
                                                     .sequence_parallel = options.sequence_parallel,
                                                     .overlap_chunks = options.overlap_chunks,
                                                     .fp8 = options.fp8}));
}

Tensor ParallelAttention::positions(std::int64_t seq, const Tensor& x, const Stream& stream) const {
  if (cp_ == nullptr) return Tensor();  // token s is at position s
  const std::vector<std::int64_t> p =
      context::cp_positions(seq * cp_->size(), cp_->size(), cp_->rank());
  return Tensor::from_vector<std::int64_t>(p, {seq}).to(x.device(), stream);
}

Tensor ParallelAttention::sum_over_replicas(const Tensor& dkv, const Stream& st) const {
  const std::int64_t groups = tp_size_ / kv_replicas_, n = dkv.numel();
  Tensor slots = Tensor::empty({groups, n}, dkv.dtype(), dkv.device(), st);
  slots.fill_(0.0, st);
  Tensor mine = slots.narrow(0, tp_->rank() / kv_replicas_, 1).view(dkv.shape());
  mine.copy_(dkv, st);
  tp_->all_reduce(slots, ReduceOp::sum, st).wait(st);
  return mine;
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
  const std::int64_t b = x.size(0), h = local_heads_, hkv = local_kv_heads_, hd = head_dim_;
  Heads in;  // [B, S, heads, hd] views of the projections' outputs
  if (!grouped()) {
    const Tensor qkv = qkv_->forward(ctx, x).view({b, seq, 3, h, hd});
    in = {part(qkv, 0), part(qkv, 1), part(qkv, 2)};
  } else {
    const Tensor xin = sp_ ? gather_sequence(x, *tp_, st) : x;
    // One FP8 cast of xin for both where they scale it alike.
    const auto [kv_out, q_out] = ColumnParallelLinear::forward_shared_input(ctx, *kv_, *q_, xin);
    const Tensor kv = kv_out.view({b, seq, 2, hkv, hd});
    in = {q_out.view({b, seq, h, hd}), part(kv, 0), part(kv, 1)};
  }
  // QK-norm into new tensors; RoPE in place (on the projection's output when there is no norm:
  // the linear's backward needs its input, not its output).
  Heads a = in;
  if (q_norm_ != nullptr) {
    a.q = q_norm_->forward(ctx, in.q);
    a.k = k_norm_->forward(ctx, in.k);
  }
  if (use_rope_) {
    const Tensor pos = positions(seq, x, st);
    nn::rope_forward_(a.q, pos, rope_, st);
    nn::rope_forward_(a.k, pos, rope_, st);
  }
  nn::AttentionOptions opt;
  opt.causal = true;
  if (cp_ == nullptr) {  // the heads read in place, the output written ready for the projection
    const Tensor out = Tensor::empty({b, seq, h, hd}, x.dtype(), x.device(), st);
    const Tensor lse =
        nn::attention_forward_into(bhsd(a.q), bhsd(a.k), bhsd(a.v), opt, bhsd(out), st);
    ctx.save(*this, {a.q, a.k, a.v, out, lse});
    return proj_->forward(ctx, out.view({b, seq, h * hd}));
  }
  const Tensor q = bhsd(a.q).contiguous(st), k = bhsd(a.k).contiguous(st),
               v = bhsd(a.v).contiguous(st);
  Tensor out;
  if (cp_kind_ == context::ContextParallelKind::ring) {
    nn::AttentionOutput r = context::ring_attention_forward(*cp_, q, k, v, {}, st);
    ctx.save(*this, {q, k, v, r.out, r.lse});
    out = std::move(r.out);
  } else {  // all-to-all: keeps the head-split, whole-sequence tensors for backward
    context::UlyssesOutput u = context::ulysses_attention_forward(*cp_, q, k, v, {}, st);
    ctx.save(*this, {u.saved.q, u.saved.k, u.saved.v, u.saved.out, u.saved.lse});
    out = std::move(u.out);
  }
  const Tensor merged = bhsd(out).contiguous(st).view({b, seq, h * hd});
  return proj_->forward(ctx, merged);
}

Tensor ParallelAttention::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& st = ctx.stream();
  const Tensor dmerged = proj_->backward(ctx, dy);
  const auto sv = ctx.take(*this);
  const std::int64_t b = dmerged.size(0), s = dmerged.size(1), h = local_heads_,
                     hkv = local_kv_heads_, hd = head_dim_;
  const Tensor dout = dmerged.contiguous(st).view({b, s, h, hd});
  // The projections' output gradients, and [B, S, heads, hd] views of them.
  Tensor dqkv, dq, dkv;
  Heads g;
  if (!grouped()) {
    dqkv = Tensor::empty({b, s, 3, h, hd}, dout.dtype(), dout.device(), st);
    g = {part(dqkv, 0), part(dqkv, 1), part(dqkv, 2)};
  } else {
    dq = Tensor::empty({b, s, h, hd}, dout.dtype(), dout.device(), st);
    dkv = Tensor::empty({b, s, 2, hkv, hd}, dout.dtype(), dout.device(), st);
    g = {dq, part(dkv, 0), part(dkv, 1)};
  }
  // The gradients of the q and k that attention saw (after norm and RoPE): written straight into
  // the projections' gradients when nothing comes between.
  Tensor gq = g.q, gk = g.k;
  if (q_norm_ != nullptr) {
    gq = Tensor::empty({b, s, h, hd}, dout.dtype(), dout.device(), st);
    gk = Tensor::empty({b, s, hkv, hd}, dout.dtype(), dout.device(), st);
  }
  nn::AttentionOptions opt;
  opt.causal = true;
  if (cp_ == nullptr) {
    const Tensor &q = sv[0], &k = sv[1], &v = sv[2], &out = sv[3], &lse = sv[4];
    nn::attention_backward_into(bhsd(dout), bhsd(q), bhsd(k), bhsd(v), bhsd(out), lse, opt,
                                bhsd(gq), bhsd(gk), bhsd(g.v), st);
  } else {
    const Tensor &q = sv[0], &k = sv[1], &v = sv[2], &out = sv[3], &lse = sv[4];
    const Tensor dout_bhsd = bhsd(dout).contiguous(st);
    const nn::AttentionGrads r =
        cp_kind_ == context::ContextParallelKind::ring
            ? context::ring_attention_backward(*cp_, dout_bhsd, q, k, v, out, lse, {}, st)
            : context::ulysses_attention_backward(*cp_, dout_bhsd,
                                                  {q, k, v, out, lse, local_kv_heads_}, {}, st);
    Tensor(gq).copy_(bhsd(r.dq), st);
    Tensor(gk).copy_(bhsd(r.dk), st);
    Tensor(g.v).copy_(bhsd(r.dv), st);
  }
  if (use_rope_) {
    const Tensor pos = positions(s, dmerged, st);
    nn::rope_backward_(gq, pos, rope_, st);
    nn::rope_backward_(gk, pos, rope_, st);
  }
  if (q_norm_ != nullptr) {
    Tensor(g.k).copy_(k_norm_->backward(ctx, gk), st);
    Tensor(g.q).copy_(q_norm_->backward(ctx, gq), st);
  }
  if (!grouped()) return qkv_->backward(ctx, dqkv.view({b, s, 3 * h * hd}));
  // Replicated key/value heads: each replica holds its query heads' part of its head's gradient.
  // Summed over the replicas (one all-reduce over tp, each group's sum in its own slot), every
  // replica takes the whole weight gradient, and the first adds the input gradient (reduced over
  // tp below) once.
  if (kv_replicas_ > 1) dkv = sum_over_replicas(dkv, st);
  const Tensor dx_kv = kv_->backward(ctx, dkv.view({b, s, 2 * hkv * hd}));
  const Tensor dx = q_->backward(ctx, dq.view({b, s, h * hd}));
  if (tp_->rank() % kv_replicas_ == 0) nn::add_(dx, dx_kv, 1.0f, st);
  return sp_ ? detail::start_reduce_scatter_sequence(dx, *tp_, st).finish(st)
             : detail::start_all_reduce(dx, *tp_, st).finish(st);
}

}  // namespace quintet::tensor_parallel
