// Column- and row-parallel linear layers.
#include "quintet/parallel/tensor_parallel/linear.hpp"
#include "parallel/tensor_parallel/internal/chunked_regions.hpp"
#include "parallel/tensor_parallel/internal/regions.hpp"
#include "quintet/parallel/tensor_parallel/regions.hpp"

namespace quintet::tensor_parallel {

using detail::ChunkedPending;
using detail::Pending;

namespace {

nn::ParameterAttributes shard_attrs(int dim, const Shape& full, const Shape& start) {
  nn::ParameterAttributes a;
  a.shard_dim = dim;
  a.shard_axis = Axis::tp;
  a.full_shape = full;
  a.shard_start = start;
  return a;
}

// ---- the FP8 GEMMs on a GPU (Fp8Linear::on_device, no overlap chunks) ----------------------
// Forward casts x and W once each, with their transposes, in one launch (nn::fp8_casts), and
// saves for backward what its GEMMs read: {xᵀ, x's scale, Wᵀ, W's scale} (kFp8Saved tensors; the
// emulation saves one).
constexpr std::size_t kFp8Saved = 4;

// x [..., in] as the forward GEMM reads it: [rows, in] in E4M3 with its transpose.
nn::Fp8CastArgs input_cast(const Tensor& x, std::int64_t in, const Fp8Linear::Scale& scale,
                           const Stream& s) {
  return {x.contiguous(s).view({-1, in}), scale.scale, nn::Fp8Format::e4m3, true, scale.amax};
}
// W [out, in] likewise.
nn::Fp8CastArgs weight_cast(const Tensor& w, const Fp8Linear::Scale& scale) {
  return {w, scale.scale, nn::Fp8Format::e4m3, true, scale.amax};
}

// y [..., out] = q(x) · q(W)ᵀ + b for x [..., in] (x_shape, dtype) and W [out, in], cast as qx
// and qw.
Tensor fp8_forward_gemm(const nn::Fp8Tensor& qx, const nn::Fp8Tensor& qw, const Shape& x_shape,
                        DType dtype, const Tensor& b, std::vector<Tensor>& saved, const Stream& s) {
  const std::int64_t out = qw.data.size(0);
  const Tensor y = Tensor::empty({qx.data.size(0), out}, dtype, qw.data.device(), s);
  // Fast accumulation (Hopper's FP8 accumulator promoted less often) where the output is bf16,
  // whose rounding dwarfs it, as Transformer Engine's forward does; never in backward.
  nn::fp8_gemm(qx, qw, b, y, false, dtype == DType::bf16, s);
  saved = {qx.transposed, qx.scale, qw.transposed, qw.scale};
  Shape shape = x_shape;
  shape.back() = out;
  return y.view(shape);
}

// y [..., out] = q(x) · q(W)ᵀ + b for x [..., in], W [out, in].
Tensor fp8_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                   const Fp8Linear::Scales& scales, std::vector<Tensor>& saved, const Stream& s) {
  const std::vector<nn::Fp8Tensor> q =
      nn::fp8_casts({input_cast(x, w.size(1), scales.x, s), weight_cast(w, scales.w)}, s);
  return fp8_forward_gemm(q[0], q[1], x.shape(), x.dtype(), b, saved, s);
}

// Backward: dx = q(dy) · q(Wᵀ)ᵀ now; the weight gradient dW += q(dyᵀ) · q(xᵀ)ᵀ (dW = with
// overwrite: the step's first contribution, see nn::Parameter::grad_for_write) and the bias
// gradient (the column sums of q(dy)) when the gradient protocol runs them.
struct Fp8Backward {
  Tensor dx;
  nn::Fp8Tensor dy;  // [rows, out] and its transpose
  nn::Fp8Tensor xt;  // xᵀ [in, rows]
  void weight_grad(const Tensor& dw, const Tensor& db, bool overwrite, const Stream& st) const {
    nn::fp8_gemm(nn::Fp8Tensor{dy.transposed, Tensor(), dy.scale, dy.format}, xt, Tensor(), dw,
                 !overwrite, false, st);
    if (db.defined()) nn::fp8_column_sum(dy, db, st);
  }
};
Fp8Backward fp8_backward(const Tensor& dy, const Fp8Linear::Scale& dy_scale,
                         const std::vector<Tensor>& saved, const Stream& s) {
  const std::int64_t out = dy.size(dy.dim() - 1);
  const Tensor dy2 = dy.contiguous(s).view({-1, out});
  Fp8Backward f;
  f.dy = nn::fp8_cast(dy2, dy_scale.scale, nn::Fp8Format::e5m2, true, dy_scale.amax, s);
  f.xt = nn::Fp8Tensor{saved[0], Tensor(), saved[1], nn::Fp8Format::e4m3};
  const nn::Fp8Tensor wt{saved[2], Tensor(), saved[3], nn::Fp8Format::e4m3};
  const std::int64_t in = wt.data.size(0);
  const Tensor dx = Tensor::empty({dy2.size(0), in}, dy.dtype(), dy.device(), s);
  nn::fp8_gemm(f.dy, wt, Tensor(), dx, false, false, s);
  Shape shape = dy.shape();
  shape.back() = in;
  f.dx = dx.view(shape);
  return f;
}

}  // namespace

// ---- ColumnParallelLinear ---------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(Communicator& tp, std::int64_t in, std::int64_t out,
                                           const ColumnParallelOptions& options)
    : tp_(&tp),
      in_(in),
      sp_(options.sequence_parallel),
      enter_region_(options.enter_region),
      chunks_(options.overlap_chunks) {
  const int n = tp.size(), r = tp.rank();
  QUINTET_CHECK(chunks_ >= 1, "ColumnParallelLinear: overlap_chunks = {} must be >= 1", chunks_);
  const std::int64_t fused_parts = options.fused_parts;
  const float init_std = options.init_std;
  QUINTET_CHECK(in > 0 && out > 0 && fused_parts > 0 && out % fused_parts == 0,
                "ColumnParallelLinear({}, {}, fused_parts = {}): sizes must be > 0 and out a "
                "multiple of fused_parts",
                in, out, fused_parts);
  const int replicas = options.replicas;
  QUINTET_CHECK(
      replicas >= 1 && n % replicas == 0 && (replicas == 1 || !enter_region_),
      "ColumnParallelLinear: replicas = {} must be >= 1 and divide tp = {}, and more than "
      "1 only with enter_region = false (the caller sums the replicas' gradients)",
      replicas, n);
  const std::int64_t part = out / fused_parts;
  const int blocks = n / replicas, block = r / replicas;
  check_divisible(fused_parts == 1 ? "ColumnParallelLinear: out"
                                   : "ColumnParallelLinear: out / "
                                     "fused_parts",
                  part, replicas == 1 ? n : 1);
  QUINTET_CHECK(part % blocks == 0,
                "ColumnParallelLinear: out / fused_parts = {} does not split into tp {} / replicas "
                "{} = {} blocks",
                part, n, replicas, blocks);
  const std::int64_t lpart = part / blocks;
  local_out_ = lpart * fused_parts;
  nn::ParameterAttributes w_attrs, b_attrs;
  if (fused_parts == 1) {
    w_attrs = shard_attrs(0, {out, in}, {block * lpart, 0});
    b_attrs = shard_attrs(0, {out}, {block * lpart});
  } else {
    w_attrs = shard_attrs(1, {fused_parts, part, in}, {0, block * lpart, 0});
    b_attrs = shard_attrs(1, {fused_parts, part}, {0, block * lpart});
  }
  w_attrs.tp_replicas = b_attrs.tp_replicas = replicas;
  weight_ =
      &add_parameter("weight", fused_parts == 1 ? Shape{lpart, in} : Shape{fused_parts, lpart, in},
                     nn::ParameterInit::normal(init_std), w_attrs);
  if (options.bias) {
    b_attrs.weight_decay = false;
    bias_ = &add_parameter("bias", fused_parts == 1 ? Shape{lpart} : Shape{fused_parts, lpart},
                           nn::ParameterInit::zeros(), b_attrs);
  }
  declare_fp8(options.fp8);
}

void ColumnParallelLinear::declare_fp8(const nn::Fp8Recipe& recipe) {
  if (recipe.mode != nn::Fp8Mode::hybrid) return;
  // One statement each: registered in this order (function arguments have none).
  nn::Fp8TensorScale& x = add_fp8_scale("fp8_x", nn::Fp8Format::e4m3, recipe);
  nn::Fp8TensorScale& w = add_fp8_scale("fp8_w", nn::Fp8Format::e4m3, recipe);
  fp8_ = Fp8Linear(x, w, add_fp8_scale("fp8_dy", nn::Fp8Format::e5m2, recipe));
}

ColumnParallelLinear::ColumnParallelLinear(Communicator& tp, nn::Parameter& shared_weight,
                                           const SharedWeightOptions& options)
    : tp_(&tp), sp_(options.sequence_parallel), enter_region_(true), ready_(options.ready) {
  QUINTET_CHECK(shared_weight.shape().size() == 2,
                "ColumnParallelLinear: a shared weight must be [out/tp, in], found {} ({})",
                shape_str(shared_weight.shape()), shared_weight.name());
  local_out_ = shared_weight.shape()[0];
  in_ = shared_weight.shape()[1];
  weight_ = &shared_weight;
  declare_fp8(options.fp8);
}

void ColumnParallelLinear::check_input(const Tensor& x) const {
  QUINTET_CHECK(x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == in_,
                "ColumnParallelLinear: x is {}, expected [..., {}]",
                x.defined() ? shape_str(x.shape()) : std::string("undefined"), in_);
}

Tensor ColumnParallelLinear::forward(nn::Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  check_input(x);
  // Checked here also without SP (whose chunks are dx's, in backward): before any communication.
  if (enter_region_ && chunked_here()) detail::check_chunks("ColumnParallelLinear", x, chunks_);
  const bool chunked = enter_region_ && sp_ && chunked_here();
  if (fp8_.on_device(x) && !chunked_here()) {  // the GEMM in FP8 (x cast after the gather)
    const Tensor w = weight_->use(s).view({local_out_, in_});
    const Tensor b = bias_ ? bias_->use(s).view({local_out_}) : Tensor();
    const Fp8Linear::Scales scales = fp8_.forward_scales(x, w, *tp_, ctx.counts_statistics(), s);
    const Tensor xin = enter_region_ && sp_ ? gather_sequence(x, *tp_, s) : x;
    std::vector<Tensor> saved;
    const Tensor y = fp8_forward(xin, w, b, scales, saved, s);
    ctx.save(*this, std::move(saved));
    return y;
  }
  // With FP8, x and w as the FP8 GEMM sees them (x rounded before the gather, element-wise).
  const Fp8Linear::Inputs in =
      fp8_.forward(x, weight_->use(s).view({local_out_, in_}), *tp_, ctx.counts_statistics(), s);
  const Tensor& w = in.w;
  const Tensor b = bias_ ? bias_->use(s).view({local_out_}) : Tensor();
  if (!chunked) {
    const Tensor xin = enter_region_ && sp_ ? gather_sequence(in.x, *tp_, s) : in.x;
    const Tensor y = nn::linear_forward(xin, w, b, s);
    ctx.save(*this, {xin});
    return y;
  }
  Tensor xin;
  const Tensor y = detail::gather_then_map(
      in.x, *tp_, chunks_, [&](const Tensor& rows) { return nn::linear_forward(rows, w, b, s); }, s,
      &xin);
  ctx.save(*this, {xin});
  return y;
}

std::pair<Tensor, Tensor> ColumnParallelLinear::forward_shared_input(nn::Context& ctx,
                                                                     ColumnParallelLinear& a,
                                                                     ColumnParallelLinear& b,
                                                                     const Tensor& x) {
  const bool shared = a.tp_ == b.tp_ && a.in_ == b.in_ && !a.enter_region_ && !b.enter_region_ &&
                      !a.chunked_here() && !b.chunked_here() && a.fp8_.on_device(x) &&
                      b.fp8_.on_device(x) && Fp8Linear::same_x_scale(a.fp8_, b.fp8_);
  if (!shared) {
    Tensor ya = a.forward(ctx, x);
    return {std::move(ya), b.forward(ctx, x)};
  }
  a.check_input(x);
  const Stream& s = ctx.stream();
  const Tensor wa = a.weight_->use(s).view({a.local_out_, a.in_});
  const Tensor ba = a.bias_ ? a.bias_->use(s).view({a.local_out_}) : Tensor();
  const Tensor wb = b.weight_->use(s).view({b.local_out_, b.in_});
  const Tensor bb = b.bias_ ? b.bias_->use(s).view({b.local_out_}) : Tensor();
  const Fp8Linear::SharedScales sc = Fp8Linear::shared_forward_scales(
      a.fp8_, b.fp8_, x, wa, wb, *a.tp_, ctx.counts_statistics(), s);
  // x once, both weights, one launch.
  const std::vector<nn::Fp8Tensor> q = nn::fp8_casts(
      {input_cast(x, a.in_, sc.x, s), weight_cast(wa, sc.wa), weight_cast(wb, sc.wb)}, s);
  if (sc.x_also.defined()) nn::fp8_amaxes_into({sc.x.amax}, sc.x_also, s);  // b's x records it
  std::vector<Tensor> saved;
  Tensor ya = fp8_forward_gemm(q[0], q[1], x.shape(), x.dtype(), ba, saved, s);
  ctx.save(a, std::move(saved));
  Tensor yb = fp8_forward_gemm(q[0], q[2], x.shape(), x.dtype(), bb, saved, s);
  ctx.save(b, std::move(saved));
  return {std::move(ya), std::move(yb)};
}

Tensor ColumnParallelLinear::backward(nn::Context& ctx, const Tensor& dy_in) {
  const Stream& s = ctx.stream();
  const std::vector<Tensor> saved = ctx.take(*this);
  const Shape w_shape{local_out_, in_};
  const Shape b_shape{local_out_};
  if (saved.size() == kFp8Saved) {  // the GEMMs in FP8; dx leaves the region under the wgrad
    const Fp8Backward f = fp8_backward(dy_in, fp8_.output_grad_scale(dy_in, *tp_, s), saved, s);
    Pending started{f.dx, Work()};
    if (enter_region_) {
      started = sp_ ? detail::start_reduce_scatter_sequence(f.dx, *tp_, s)
                    : detail::start_all_reduce(f.dx, *tp_, s);
    }
    nn::accumulate_gradients(
        ctx, {weight_, bias_},
        [f, w_shape, b_shape](const std::vector<Tensor>& g, bool overwrite, const Stream& st) {
          f.weight_grad(g[0].view(w_shape), g[1].defined() ? g[1].view(b_shape) : Tensor(),
                        overwrite, st);
        },
        nn::GradTiming::deferrable, ready_);
    return started.finish(s);
  }
  const Tensor xin = saved.at(0);
  const Tensor dy = fp8_.output_grad(dy_in, *tp_, s);  // dy_in itself without FP8
  const Tensor w = fp8_.weight(weight_->data().view({local_out_, in_}), s);
  // dx leaves the region (all-reduce, or reduce-scatter with SP) while the weight gradient runs;
  // in chunks, also while the later chunks' dx GEMMs run.
  ChunkedPending reduced;
  if (enter_region_ && chunked_here()) {
    const auto dx_rows = [&](const Tensor& rows) { return nn::linear_backward_input(rows, w, s); };
    reduced = sp_ ? detail::map_then_reduce_scatter(dy, *tp_, chunks_, dx_rows, s)
                  : detail::map_then_all_reduce(dy, *tp_, chunks_, dx_rows, s);
  } else {
    const Tensor dx = nn::linear_backward_input(dy, w, s);
    Pending started{dx, Work()};
    if (enter_region_) {
      started = sp_ ? detail::start_reduce_scatter_sequence(dx, *tp_, s)
                    : detail::start_all_reduce(dx, *tp_, s);
    }
    reduced.value = started.value;
    reduced.sent.add(0, started.work, {});
  }
  nn::accumulate_gradients(
      ctx, {weight_, bias_},
      [dy, xin, w_shape, b_shape](const std::vector<Tensor>& g, bool overwrite, const Stream& st) {
        nn::linear_backward_weight(dy, xin, g[0].view(w_shape),
                                   g[1].defined() ? g[1].view(b_shape) : Tensor(), !overwrite, st);
      },
      nn::GradTiming::deferrable, ready_);
  return reduced.finish(s);
}

// ---- RowParallelLinear ------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(Communicator& tp, std::int64_t in, std::int64_t out,
                                     const RowParallelOptions& options)
    : tp_(&tp), out_(out), sp_(options.sequence_parallel), chunks_(options.overlap_chunks) {
  const int n = tp.size(), r = tp.rank();
  QUINTET_CHECK(in > 0 && out > 0, "RowParallelLinear({}, {}): sizes must be > 0", in, out);
  QUINTET_CHECK(chunks_ >= 1, "RowParallelLinear: overlap_chunks = {} must be >= 1", chunks_);
  check_divisible("RowParallelLinear: in", in, n);
  local_in_ = in / n;
  weight_ = &add_parameter("weight", {out, local_in_}, nn::ParameterInit::normal(options.init_std),
                           shard_attrs(1, {out, in}, {0, r * local_in_}));
  if (options.bias) {
    nn::ParameterAttributes a;
    a.weight_decay = false;
    bias_ = &add_parameter("bias", {out}, nn::ParameterInit::zeros(), a);
  }
  if (options.fp8.mode == nn::Fp8Mode::hybrid) {  // x, w, dy in this order (as above)
    nn::Fp8TensorScale& x = add_fp8_scale("fp8_x", nn::Fp8Format::e4m3, options.fp8);
    nn::Fp8TensorScale& w = add_fp8_scale("fp8_w", nn::Fp8Format::e4m3, options.fp8);
    fp8_ = Fp8Linear(x, w, add_fp8_scale("fp8_dy", nn::Fp8Format::e5m2, options.fp8));
  }
}

Tensor RowParallelLinear::forward(nn::Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  QUINTET_CHECK(x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == local_in_,
                "RowParallelLinear: x is {}, expected [..., {}] (this rank's input features)",
                x.defined() ? shape_str(x.shape()) : std::string("undefined"), local_in_);
  if (sp_) detail::check_sequence("RowParallelLinear", x, tp_->size());
  const bool chunked = chunked_here();
  if (chunked) {
    if (sp_) {
      detail::check_sequence_chunks("RowParallelLinear", x, tp_->size(), chunks_);
    } else {
      detail::check_chunks("RowParallelLinear", x, chunks_);
    }
  }
  // The bias is added once, by tp rank 0, so the reduction sums it in exactly once.
  const Tensor b = bias_ && tp_->rank() == 0 ? bias_->use(s) : Tensor();
  if (bias_ && tp_->rank() != 0) bias_->use(s);  // same before-use hooks on every rank
  if (fp8_.on_device(x) && !chunked) {           // the GEMM in FP8
    const Tensor w = weight_->use(s);
    const Fp8Linear::Scales scales = fp8_.forward_scales(x, w, *tp_, ctx.counts_statistics(), s);
    std::vector<Tensor> saved;
    const Tensor partial = fp8_forward(x, w, b, scales, saved, s);
    ctx.save(*this, std::move(saved));
    return sp_ ? detail::start_reduce_scatter_sequence(partial, *tp_, s).finish(s)
               : detail::start_all_reduce(partial, *tp_, s).finish(s);
  }
  // With FP8, x and w as the FP8 GEMM sees them.
  const Fp8Linear::Inputs in = fp8_.forward(x, weight_->use(s), *tp_, ctx.counts_statistics(), s);
  const Tensor& w = in.w;
  ctx.save(*this, {in.x});
  if (chunked) {
    const auto rows_out = [&](const Tensor& rows) { return nn::linear_forward(rows, w, b, s); };
    return (sp_ ? detail::map_then_reduce_scatter(in.x, *tp_, chunks_, rows_out, s)
                : detail::map_then_all_reduce(in.x, *tp_, chunks_, rows_out, s))
        .finish(s);
  }
  const Tensor partial = nn::linear_forward(in.x, w, b, s);
  return sp_ ? detail::start_reduce_scatter_sequence(partial, *tp_, s).finish(s)
             : detail::start_all_reduce(partial, *tp_, s).finish(s);
}

Tensor RowParallelLinear::backward(nn::Context& ctx, const Tensor& dy_in) {
  const Stream& s = ctx.stream();
  const std::vector<Tensor> saved = ctx.take(*this);
  if (saved.size() == kFp8Saved) {  // the GEMMs in FP8 (dy cast after the gather)
    const Fp8Linear::Scale scale = fp8_.output_grad_scale(dy_in, *tp_, s);
    const Fp8Backward f =
        fp8_backward(sp_ ? gather_sequence(dy_in, *tp_, s) : dy_in, scale, saved, s);
    nn::accumulate_gradients(
        ctx, {weight_, bias_},
        [f](const std::vector<Tensor>& g, bool overwrite, const Stream& st) {
          f.weight_grad(g[0], g[1], overwrite, st);
        },
        nn::GradTiming::deferrable);
    return f.dx;
  }
  const Tensor x = saved.at(0);
  // With FP8, dy and w as the FP8 GEMMs see them (dy rounded before the gather, element-wise).
  const Tensor dy = fp8_.output_grad(dy_in, *tp_, s);
  const Tensor w = fp8_.weight(weight_->data(), s);
  Tensor dy_full = dy, dx;
  if (sp_ && chunked_here()) {  // dy arrives in chunks, each chunk's dx GEMM under the next's
    dx = detail::gather_then_map(
        dy, *tp_, chunks_,
        [&](const Tensor& rows) { return nn::linear_backward_input(rows, w, s); }, s, &dy_full);
  } else if (sp_) {
    dy_full = gather_sequence(dy, *tp_, s);
  }
  nn::accumulate_gradients(
      ctx, {weight_, bias_},
      [dy_full, x](const std::vector<Tensor>& g, bool overwrite, const Stream& st) {
        nn::linear_backward_weight(dy_full, x, g[0], g[1], !overwrite, st);
      },
      nn::GradTiming::deferrable);
  return dx.defined() ? dx : nn::linear_backward_input(dy_full, w, s);
}

}  // namespace quintet::tensor_parallel
