#include "quintet/nn/parameter.hpp"

#include <algorithm>
#include <set>

#include "quintet/nn/context.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn {

Parameter::Parameter(std::string local_name, Shape shape, ParameterInit init,
                     ParameterAttributes attrs)
    : local_name_(std::move(local_name)),
      name_(local_name_),
      shape_(std::move(shape)),
      init_(init),
      attrs_(std::move(attrs)) {
  shape_numel(shape_);  // rejects negative sizes
  QUINTET_CHECK(attrs_.shard_dim >= -1 && attrs_.shard_dim < static_cast<int>(shape_.size()),
                "Parameter {}: shard_dim = {} is not a dimension of shape {}", local_name_,
                attrs_.shard_dim, shape_str(shape_));
  QUINTET_CHECK(attrs_.full_shape.size() == attrs_.shard_start.size() &&
                    (attrs_.full_shape.empty() || attrs_.full_shape.size() == shape_.size()),
                "Parameter {}: full_shape {} and shard_start {} must both be empty or both have "
                "the rank of shape {}",
                local_name_, shape_str(attrs_.full_shape), shape_str(attrs_.shard_start),
                shape_str(shape_));
  QUINTET_CHECK(
      attrs_.tp_replicas >= 1 && (attrs_.tp_replicas == 1 || attrs_.shard_axis == Axis::tp),
      "Parameter {}: tp_replicas = {} must be >= 1, and more than 1 only for a tp shard",
      local_name_, attrs_.tp_replicas);
}

void Parameter::set_tied(TiedRole role) {
  QUINTET_CHECK(!materialized(),
                "Parameter {}: set_tied after a ParameterStore was built over it; mark tied "
                "weights when the model is built",
                name_);
  attrs_.tied = role;
}

Tensor Parameter::data() const {
  QUINTET_CHECK(data_.defined(),
                "Parameter {} has no memory yet; build a ParameterStore over its "
                "module first",
                name_);
  return data_;
}

Tensor Parameter::grad() const {
  QUINTET_CHECK(grad_.defined(), "Parameter {} has no gradient {}", name_,
                offset_ < 0 ? "yet; build a ParameterStore over its module first"
                            : "bound: its store keeps gradients on demand (ZeRO-2), so a gradient "
                              "exists only while backward accumulates it; read the reduced shard "
                              "with DataParallel::owned_grad");
  if (grad_stale_) {
    // No stream here: zero_grad's, waited for on a GPU (as a stream-less fill_ would be), so
    // that the caller may read the zeros on any stream or on the host.
    const Stream stream = store_->zero_grad_stream();
    store_->zero_stale(*this, stream);
    if (stream.device().is_cuda()) stream.synchronize();
  }
  return grad_;
}

Tensor Parameter::grad_for_backward(const Stream& stream) {
  if (!grad_.defined() && on_grad_needed_) on_grad_needed_(*this, stream);
  if (grad_stale_) store_->zero_stale(*this, stream);
  return grad();
}

Parameter::GradForWrite Parameter::grad_for_write(const Stream& stream) {
  if (!grad_.defined() && on_grad_needed_) on_grad_needed_(*this, stream);
  const bool overwrite = grad_stale_;
  if (overwrite) store_->clear_stale(*this);
  return {grad(), overwrite};
}

Tensor Parameter::use(const Stream& stream) {
  if (on_use_) on_use_(*this, stream);
  return data();
}

void Parameter::mark_grad_ready() {
  if (on_grad_ready_) on_grad_ready_(*this);
}

namespace {

// Every accumulate_gradients: the first `writes` parameters' gradients through grad_for_write
// (overwrite[i] from it), the others through grad_for_backward (overwrite[i] false).
void run_gradient_work(Context& ctx, std::vector<Parameter*> ps, OverwritingGradientsWork work,
                       std::size_t writes, GradTiming timing, GradReady ready) {
  auto mark = [ps, ready] {
    if (ready == GradReady::defer) return;
    for (Parameter* p : ps) {
      if (p) p->mark_grad_ready();
    }
  };
  auto run = [ps, fn = std::move(work), writes, stream = &ctx.stream()] {
    std::vector<Tensor> grads;
    grads.reserve(ps.size());
    std::vector<bool> overwrite(ps.size(), false);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      Parameter* p = ps[i];
      if (p == nullptr) {
        grads.emplace_back();
      } else if (i < writes) {
        Parameter::GradForWrite w = p->grad_for_write(*stream);
        grads.push_back(std::move(w.grad));
        overwrite[i] = w.overwrite;
      } else {
        grads.push_back(p->grad_for_backward(*stream));
      }
    }
    fn(grads, overwrite, *stream);
  };
  if (!ctx.defers_weight_gradients()) {
    run();
    mark();
  } else if (timing == GradTiming::deferrable) {
    ctx.defer([run = std::move(run), mark = std::move(mark)] {
      run();
      mark();
    });
  } else {
    // Computed now (its kernel also gives dx), marked with the rest of the microbatch's weight
    // gradients, so that every mark of a backward happens at its W.
    run();
    ctx.defer(std::move(mark));
  }
}

}  // namespace

void accumulate_gradients(Context& ctx, std::initializer_list<Parameter*> params,
                          GradientWork accumulate, GradTiming timing, GradReady ready) {
  run_gradient_work(
      ctx, std::vector<Parameter*>(params),
      [fn = std::move(accumulate)](const std::vector<Tensor>& g, const std::vector<bool>&,
                                   const Stream& s) { fn(g, s); },
      0, timing, ready);
}

void accumulate_gradients(Context& ctx, std::initializer_list<Parameter*> params,
                          OverwritingGradientWork accumulate, GradTiming timing, GradReady ready) {
  run_gradient_work(
      ctx, std::vector<Parameter*>(params),
      [fn = std::move(accumulate)](const std::vector<Tensor>& g, const std::vector<bool>& o,
                                   const Stream& s) { fn(g, !o.empty() && o[0], s); },
      1, timing, ready);
}

void accumulate_gradients(Context& ctx, std::initializer_list<Parameter*> params,
                          OverwritingGradientsWork accumulate, GradTiming timing, GradReady ready) {
  run_gradient_work(ctx, std::vector<Parameter*>(params), std::move(accumulate), params.size(),
                    timing, ready);
}

std::uint64_t parameter_stream_id(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

ParameterStore::ParameterStore(Module& root, DType dtype, const Stream& stream,
                               std::uint64_t seed) {
  const Device device = stream.device();
  const bool ok = device.is_cuda() ? (dtype == DType::bf16 || dtype == DType::f32)
                                   : (dtype == DType::f32 || dtype == DType::f64);
  QUINTET_CHECK(ok, "ParameterStore: dtype {} on {}; parameters are {} there", dtype_name(dtype),
                device.str(), device.is_cuda() ? "bf16 or f32" : "f32 (or f64)");
  auto named = root.named_parameters();
  std::set<std::string> seen;
  for (const auto& [name, p] : named) {
    QUINTET_CHECK(seen.insert(name).second, "ParameterStore: two parameters are named {}", name);
    QUINTET_CHECK(!p->materialized(), "ParameterStore: parameter {} already belongs to a store",
                  name);
  }
  std::reverse(named.begin(), named.end());  // backward order
  std::int64_t total = 0;
  for (auto& [name, p] : named) {
    p->name_ = name;
    p->offset_ = total;
    total += (p->numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
    params_.push_back(p);
  }
  data_ = Tensor::empty({total}, dtype, device, stream);
  data_.fill_(0.0, stream);
  grad_ = Tensor::empty({total}, accum_dtype(dtype), device, stream);
  grad_.fill_(0.0, stream);
  for (Parameter* p : params_) {
    p->store_ = this;
    p->data_ = data_.narrow(0, p->offset_, p->numel()).view(p->shape());
    p->grad_ = grad_.narrow(0, p->offset_, p->numel()).view(p->shape());
    p->on_grad_ready_ = [this](Parameter& q) {
      for (const auto& hook : hooks_) hook(q);
    };
    p->on_use_ = [this](Parameter& q, const Stream& s) {
      if (use_hook_) use_hook_(q, s);
    };
    p->on_grad_needed_ = [this](Parameter& q, const Stream& s) {
      if (grad_binder_) grad_binder_(q, s);
    };
    switch (p->init_.kind) {
      case ParameterInit::Kind::zeros:
        break;
      case ParameterInit::Kind::ones:
        p->data_.fill_(1.0, stream);
        break;
      case ParameterInit::Kind::normal: {
        const RandomKey key{seed, parameter_stream_id(p->name_), 0};
        const RandomRegion region{p->attrs_.full_shape, p->attrs_.shard_start};
        fill_random(p->data_, key, Distribution::normal, 0.0f, p->init_.stddev, region, stream);
        break;
      }
    }
  }
}

Parameter& ParameterStore::find(const std::string& name) const {
  for (Parameter* p : params_) {
    if (p->name() == name) return *p;
  }
  QUINTET_THROW(InvalidArgument, "ParameterStore::find: no parameter named '{}' among {}", name,
                params_.size());
}

void ParameterStore::zero_grad(const Stream& stream) {
  if (on_demand_) {
    for (Parameter* p : params_) {
      if (p->grad_.defined()) p->grad_.fill_(0.0, stream);
    }
    return;
  }
  for (Parameter* p : params_) p->grad_stale_ = lazy_;
  stale_ = lazy_ ? params_.size() : 0;
  if (!lazy_) {
    grad_.fill_(0.0, stream);
    return;
  }
  zero_handle_ = stream.handle();
}

const Tensor& ParameterStore::grad_buffer() const {
  if (stale_ > 0) {  // as Parameter::grad()
    const Stream stream = zero_grad_stream();
    zero_stale(0, total_elements(), stream);
    if (device().is_cuda()) stream.synchronize();
  }
  return grad_;
}

Tensor ParameterStore::grad_range(std::int64_t begin, std::int64_t n, const Stream& stream) {
  QUINTET_CHECK(grad_.defined() && begin >= 0 && n >= 0 && begin + n <= total_elements(),
                "ParameterStore::grad_range: elements [{}, {}) of a gradient buffer of {}{}", begin,
                begin + n, total_elements(),
                grad_.defined() ? "" : " (released: gradients are on demand)");
  zero_stale(begin, begin + n, stream);
  return grad_.narrow(0, begin, n);
}

void ParameterStore::zero_stale(const Parameter& p, const Stream& stream) const {
  if (!p.grad_stale_) return;
  if (p.numel() > 0) Tensor(p.grad_).fill_(0.0, stream);
  clear_stale(p);
}

void ParameterStore::zero_stale(std::int64_t begin, std::int64_t end, const Stream& stream) const {
  if (stale_ == 0) return;
  // The parameters lie in offset order, each ending before the next starts: skip those that end
  // before begin, then take those that start before end, filling each run of consecutive stale
  // ones at once (the alignment padding between them is zero already).
  auto it = std::partition_point(params_.begin(), params_.end(), [&](const Parameter* p) {
    return p->offset_ < begin && p->offset_ + p->numel() <= begin;
  });
  std::int64_t run_begin = -1, run_end = -1;
  const auto flush = [&] {
    if (run_end > run_begin) grad_.narrow(0, run_begin, run_end - run_begin).fill_(0.0, stream);
    run_begin = run_end = -1;
  };
  for (; it != params_.end() && (*it)->offset_ < end; ++it) {
    const Parameter& p = **it;
    if (!p.grad_stale_) {
      flush();
      continue;
    }
    if (run_begin < 0) run_begin = p.offset_;
    run_end = p.offset_ + p.numel();
    clear_stale(p);
  }
  flush();
}

Stream ParameterStore::zero_grad_stream() const { return Stream::borrow(device(), zero_handle_); }

void ParameterStore::clear_stale(const Parameter& p) const {
  if (!p.grad_stale_) return;
  p.grad_stale_ = false;
  --stale_;
}

void ParameterStore::release_gradient_buffer(
    std::function<void(Parameter&, const Stream&)> binder) {
  QUINTET_CHECK(static_cast<bool>(binder),
                "ParameterStore::release_gradient_buffer: empty binder; gradients could never be "
                "bound again");
  QUINTET_CHECK(!on_demand_,
                "ParameterStore::release_gradient_buffer: the gradient buffer was already released "
                "(one DataParallel with ZeRO stage 2 per store)");
  on_demand_ = true;
  grad_binder_ = std::move(binder);
  grad_ = Tensor();
  for (Parameter* p : params_) {
    p->grad_ = Tensor();
    clear_stale(*p);  // whoever binds a gradient gives it zeroed storage
  }
}

void ParameterStore::bind_gradients(const std::vector<Parameter*>& params, const Tensor& storage,
                                    std::int64_t first) {
  QUINTET_CHECK(storage.defined() && storage.dim() == 1 && storage.is_contiguous() &&
                    storage.dtype() == accum_dtype(dtype()) && storage.device() == device(),
                "ParameterStore::bind_gradients: storage must be a contiguous 1-D {} tensor on {}",
                dtype_name(accum_dtype(dtype())), device().str());
  for (Parameter* p : params) {
    QUINTET_CHECK(p->offset_ >= first && p->offset_ + p->numel() <= first + storage.numel(),
                  "ParameterStore::bind_gradients: parameter {} (flat elements [{}, {})) is not "
                  "inside the storage's [{}, {})",
                  p->name(), p->offset_, p->offset_ + p->numel(), first, first + storage.numel());
    p->grad_ = storage.narrow(0, p->offset_ - first, p->numel()).view(p->shape());
    clear_stale(*p);
  }
}

void ParameterStore::unbind_gradients(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) p->grad_ = Tensor();
}

void ParameterStore::add_grad_ready_hook(std::function<void(Parameter&)> hook) {
  QUINTET_CHECK(static_cast<bool>(hook), "ParameterStore::add_grad_ready_hook: empty hook");
  hooks_.push_back(std::move(hook));
}

void ParameterStore::set_before_use_hook(std::function<void(Parameter&, const Stream&)> hook) {
  use_hook_ = std::move(hook);
}

}  // namespace quintet::nn
