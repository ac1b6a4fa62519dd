// The device dispatch of the training ops of quintet/nn/ops.hpp: embedding, cross-entropy, AdamW,
// element-wise arithmetic and the norm of a set of tensors. Same scheme as ops.cpp.
#include <cmath>

#include "nn/op_checks.hpp"
#include "nn/op_dispatch.hpp"
#include "nn/vocab_parallel_impl.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn {

namespace detail {
void throw_no_cuda_ops(const char* op, const Device& device) {
  QUINTET_THROW(InvalidArgument,
                "{}: called on {}, but this build of Quintet has no CUDA implementation of the nn "
                "ops (built with QUINTET_HAS_CUDA={}); run it on CPU tensors with a CPU stream, "
                "or use a build with the CUDA nn kernels",
                op, device.str(), QUINTET_HAS_CUDA);
}
}  // namespace detail

using detail::OpChecker;
using detail::with_last;

// ---- embedding ------------------------------------------------------------------------------

Tensor embedding_forward(const Tensor& ids, const Tensor& table, const Stream& stream) {
  const OpChecker c("embedding_forward", stream);
  c.ids("ids", ids);
  const DType t = c.compute("table", table);
  QUINTET_CHECK(table.dim() == 2, "embedding_forward: table has shape {}, expected [vocab, dim]",
                shape_str(table.shape()));
  const Tensor idc = ids.contiguous(stream).view({ids.numel()});
  const Tensor tc = table.contiguous(stream);
  Tensor y = Tensor::empty({ids.numel(), table.size(1)}, t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, embedding_forward, idc, tc, y);
  Shape out = ids.shape();
  out.push_back(table.size(1));
  return y.view(out);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                        const Stream& stream) {
  const OpChecker c("embedding_backward", stream);
  c.ids("ids", ids);
  const DType t = c.compute("dy", dy);
  QUINTET_CHECK(dtable.dim() == 2, "embedding_backward: dtable has shape {}, expected [vocab, dim]",
                shape_str(dtable.shape()));
  c.accumulator("dtable", dtable, t, dtable.shape());
  Shape expected = ids.shape();
  expected.push_back(dtable.size(1));
  c.shape("dy", dy, expected);
  const Tensor idc = ids.contiguous(stream).view({ids.numel()});
  const Tensor dyc = dy.contiguous(stream).view({ids.numel(), dtable.size(1)});
  QUINTET_NN_DISPATCH(c, stream, embedding_backward, dyc, idc, dtable);
}

// ---- cross-entropy --------------------------------------------------------------------------

namespace {
void check_logits_targets(const OpChecker& c, const Tensor& logits, const Tensor& targets) {
  c.compute("logits", logits);
  const std::int64_t vocab = c.last_dim("logits", logits);
  QUINTET_CHECK(vocab > 0, "{}: logits {} have an empty vocabulary dimension", c.op(),
                shape_str(logits.shape()));
  check_targets(c, logits, targets);
}
}  // namespace

// The cross-entropy of the whole vocabulary is that of a vocabulary split over one shard, [0, V):
// the kernels of vocab_parallel_ops.hpp (nn/vocab_parallel_impl.hpp), one implementation of each.
CrossEntropyOutput cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                         std::int64_t ignore_index, const Stream& stream) {
  const OpChecker c("cross_entropy_forward", stream);
  check_logits_targets(c, logits, targets);
  const Tensor l2 = detail::as_rows(logits, stream);
  const std::int64_t rows = l2.size(0), vocab = l2.size(1);
  const Tensor tc = targets.contiguous(stream).view({targets.numel()});
  const DType a = accum_dtype(logits.dtype());
  const Tensor partials = Tensor::empty({1, 3, rows}, a, c.device(), stream);
  QUINTET_NN_DISPATCH_ARGS(c, vocab_parallel_ce_partials,
                           (c.op(), l2, tc, 0, vocab, ignore_index, partials),
                           (l2, tc, 0, vocab, ignore_index, partials, stream));
  CrossEntropyOutput o{Tensor::empty({}, a, c.device(), stream),
                       Tensor::empty({rows}, a, c.device(), stream),
                       Tensor::empty({}, a, c.device(), stream)};
  QUINTET_NN_DISPATCH(c, stream, vocab_parallel_ce_combine, partials, tc, vocab, ignore_index,
                      o.loss, o.lse, o.valid_count);
  return o;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& valid_count, float dloss, std::int64_t ignore_index,
                              const Stream& stream) {
  const OpChecker c("cross_entropy_backward", stream);
  check_logits_targets(c, logits, targets);
  const Tensor l2 = detail::as_rows(logits, stream);
  const DType a = accum_dtype(logits.dtype());
  c.on_device("lse", lse);
  c.on_device("valid_count", valid_count);
  QUINTET_CHECK(lse.dtype() == a && lse.numel() == l2.size(0),
                "cross_entropy_backward: lse is {}, expected the forward's {} with {} elements",
                lse.str(), dtype_name(a), l2.size(0));
  QUINTET_CHECK(valid_count.dtype() == a && valid_count.numel() == 1,
                "cross_entropy_backward: valid_count is {}, expected the forward's {} scalar",
                valid_count.str(), dtype_name(a));
  QUINTET_CHECK(std::isfinite(dloss), "cross_entropy_backward: dloss = {} is not finite", dloss);
  const Tensor tc = targets.contiguous(stream).view({targets.numel()});
  const Tensor lc = lse.contiguous(stream), vc = valid_count.contiguous(stream);
  Tensor dl = Tensor::empty(l2.shape(), logits.dtype(), c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, vocab_parallel_ce_backward, l2, tc, lc, vc, dloss, 0, l2.size(1),
                      ignore_index, dl);
  return dl.view(logits.shape());
}

// ---- AdamW ----------------------------------------------------------------------------------

namespace {
// The checks of adamw_step, as op `op` (adamw_step or adamw_step_many).
void check_adamw(const OpChecker& c, const Tensor& master, const Tensor& grad,
                 const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWHyper& hyper,
                 std::int64_t step, float grad_scale, const Tensor& param) {
  c.on_device("master", master);
  const DType d = master.dtype();
  QUINTET_CHECK(d == DType::f32 || (d == DType::f64 && !c.on_cuda()),
                "adamw_step: master has dtype {}, expected f32 master weights (f64 on the CPU)",
                dtype_name(d));
  const struct {
    const char* name;
    const Tensor& t;
  } state[] = {
      {"master", master}, {"grad", grad}, {"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}};
  for (const auto& s : state) {
    c.on_device(s.name, s.t);
    QUINTET_CHECK(s.t.dtype() == d, "adamw_step: {} has dtype {}, expected {} like master", s.name,
                  dtype_name(s.t.dtype()), dtype_name(d));
    c.shape(s.name, s.t, master.shape());
    QUINTET_CHECK(s.t.is_contiguous(), "adamw_step: {} must be contiguous", s.name);
  }
  if (param.defined()) {
    c.on_device("param", param);
    QUINTET_CHECK(is_floating(param.dtype()), "adamw_step: param has dtype {}, expected a float",
                  dtype_name(param.dtype()));
    c.shape("param", param, master.shape());
    QUINTET_CHECK(param.is_contiguous(), "adamw_step: param must be contiguous");
    QUINTET_CHECK(!param.shares_storage(master) || param.dtype() != d,
                  "adamw_step: param must not be master itself; pass an undefined Tensor instead");
  }
  QUINTET_CHECK(step >= 1, "adamw_step: step = {}, expected >= 1 (the first step is 1)", step);
  QUINTET_CHECK(hyper.lr >= 0 && hyper.eps > 0 && hyper.weight_decay >= 0 && hyper.beta1 >= 0 &&
                    hyper.beta1 < 1 && hyper.beta2 >= 0 && hyper.beta2 < 1,
                "adamw_step: bad hyperparameters lr={} beta1={} beta2={} eps={} weight_decay={}; "
                "expected lr >= 0, 0 <= beta < 1, eps > 0, weight_decay >= 0",
                hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay);
  QUINTET_CHECK(std::isfinite(grad_scale) && grad_scale >= 0,
                "adamw_step: grad_scale = {} must be finite and >= 0", grad_scale);
}
}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale, const Tensor& param, const Stream& stream) {
  const OpChecker c("adamw_step", stream);
  check_adamw(c, master, grad, exp_avg, exp_avg_sq, hyper, step, grad_scale, param);
  QUINTET_NN_DISPATCH(c, stream, adamw_step, master, grad, exp_avg, exp_avg_sq, hyper, step,
                      grad_scale, param);
}

float clip_scale(double norm, float max_grad_norm) {
  return max_grad_norm > 0 && norm > max_grad_norm
             ? static_cast<float>(max_grad_norm / (norm + 1e-6))
             : 1.0f;
}

void adamw_step_many(const std::vector<AdamWTensors>& tensors, const AdamWHyper& hyper,
                     std::int64_t step, const Tensor& sum_sq, float max_grad_norm,
                     const Stream& stream) {
  const OpChecker c("adamw_step_many", stream);
  c.on_device("sum_sq", sum_sq);
  QUINTET_CHECK(sum_sq.dtype() == DType::f32 && sum_sq.numel() == 1,
                "adamw_step_many: sum_sq is {}, expected a scalar f32 (sum_of_squares)",
                sum_sq.str());
  const Tensor* param = nullptr;
  for (const AdamWTensors& t : tensors) {
    check_adamw(c, t.master, t.grad, t.exp_avg, t.exp_avg_sq, hyper, step, 1.0f, t.param);
    if (!t.param.defined()) continue;
    QUINTET_CHECK(param == nullptr || param->dtype() == t.param.dtype(),
                  "adamw_step_many: params of dtypes {} and {}; one call takes one param dtype",
                  dtype_name(param->dtype()), dtype_name(t.param.dtype()));
    param = &t.param;
  }
  if (tensors.empty()) return;
  if (c.on_cuda()) {
#if QUINTET_NN_HAS_CUDA_OPS
    const ::quintet::DeviceGuard guard(c.device());
    cuda_ops::adamw_step_many(tensors, hyper, step, sum_sq, max_grad_norm, stream);
#endif
    return;
  }
  const double norm = std::sqrt(sum_sq.flatten().item({0}));
  if (!std::isfinite(norm)) return;
  const float scale = clip_scale(norm, max_grad_norm);
  AdamWHyper no_decay = hyper;
  no_decay.weight_decay = 0.0f;
  for (const AdamWTensors& t : tensors) {
    cpu_ops::adamw_step(t.master, t.grad, t.exp_avg, t.exp_avg_sq,
                        t.weight_decay ? hyper : no_decay, step, scale, t.param);
  }
}

// ---- element-wise ---------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, const Stream& stream) {
  const OpChecker c("add", stream);
  const DType t = c.compute("a", a);
  c.compute_as("b", b, t);
  c.shape("b", b, a.shape());
  const Tensor ac = a.contiguous(stream), bc = b.contiguous(stream);
  Tensor out = Tensor::empty(a.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, add, ac, bc, out);
  return out;
}

void add_(const Tensor& dst, const Tensor& src, float alpha, const Stream& stream) {
  const OpChecker c("add_", stream);
  const DType t = c.compute("src", src);
  c.on_device("dst", dst);
  QUINTET_CHECK(dst.dtype() == t || dst.dtype() == accum_dtype(t),
                "add_: dst has dtype {}, expected {} or {} for src of {}", dtype_name(dst.dtype()),
                dtype_name(t), dtype_name(accum_dtype(t)), dtype_name(t));
  c.shape("dst", dst, src.shape());
  QUINTET_CHECK(dst.is_contiguous(), "add_: dst must be contiguous (it is written in place)");
  const Tensor sc = src.contiguous(stream);
  QUINTET_NN_DISPATCH(c, stream, add_, dst, sc, alpha);
}

Tensor scale(const Tensor& x, float alpha, const Stream& stream) {
  const OpChecker c("scale", stream);
  const DType t = c.compute("x", x);
  const Tensor xc = x.contiguous(stream);
  Tensor out = Tensor::empty(x.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, scale, xc, alpha, out);
  return out;
}

void scale_(const Tensor& x, float alpha, const Stream& stream) {
  const OpChecker c("scale_", stream);
  c.on_device("x", x);
  QUINTET_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64 ||
                    (c.on_cuda() && x.dtype() == DType::bf16),
                "scale_: x has dtype {}; expected a compute or accumulator dtype",
                dtype_name(x.dtype()));
  QUINTET_CHECK(x.is_contiguous(), "scale_: x must be contiguous (it is written in place)");
  QUINTET_NN_DISPATCH(c, stream, scale, x, alpha, x);
}

Tensor cast(const Tensor& x, DType dtype, const Stream& stream) {
  const OpChecker c("cast", stream);
  c.on_device("x", x);
  return x.to(dtype, stream);
}

Tensor sum_of_squares(const std::vector<Tensor>& tensors, const Stream& stream) {
  const OpChecker c("sum_of_squares", stream);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    QUINTET_CHECK(t.defined(), "sum_of_squares: tensor {} is undefined", i);
    QUINTET_CHECK(t.device() == c.device(),
                  "sum_of_squares: tensor {} is on {} but the stream is on {}", i, t.device().str(),
                  c.device().str());
    QUINTET_CHECK(is_floating(t.dtype()),
                  "sum_of_squares: tensor {} has dtype {}, expected a float", i,
                  dtype_name(t.dtype()));
  }
  Tensor out = Tensor::empty({}, DType::f32, c.device(), stream);
  out.fill_(0.0, stream);
  if (!c.on_cuda()) {
    double sum = 0.0;
    for (const Tensor& t : tensors) sum += cpu_ops::sum_of_squares(t.contiguous());
    out.at<float>({}) = static_cast<float>(sum);
    return out;
  }
#if QUINTET_NN_HAS_CUDA_OPS
  const ::quintet::DeviceGuard guard(c.device());
  std::vector<Tensor> dense;
  for (const Tensor& t : tensors) dense.push_back(t.contiguous(stream));
  cuda_ops::sum_of_squares(dense, out, stream);
#endif
  return out;
}

double global_norm(const std::vector<Tensor>& tensors, const Stream& stream) {
  const Tensor s = sum_of_squares(tensors, stream);
  stream.synchronize();
  return std::sqrt(s.item());
}

}  // namespace quintet::nn
