// The MoE layer: its Router, TokenDispatcher and Experts composed (moe_layer.hpp).
#include "quintet/parallel/expert/moe_layer.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "quintet/nn/ops.hpp"

namespace quintet::expert {

namespace {

int size_of(Communicator* c) { return c != nullptr ? c->size() : 1; }
int rank_of(Communicator* c) { return c != nullptr ? c->rank() : 0; }

// What one forward keeps for its backward.
struct MoESaved {
  RouterHandle router;
  DispatchHandle dispatch;
  std::vector<ExpertsActivations> experts;  // per chunk
};

}  // namespace

MoEStats combine(const std::vector<MoEStats>& layers) {
  MoEStats out;
  for (const MoEStats& s : layers) {
    out.load.insert(out.load.end(), s.load.begin(), s.load.end());
    out.assignments += s.assignments;
    out.dropped += s.dropped;
    out.aux_loss += s.aux_loss;
    out.z_loss += s.z_loss;
  }
  return out;
}

MoESummary summarize(const std::vector<MoEStats>& layers, Communicator& pp, const Stream& stream) {
  const MoEStats all = combine(layers);
  // Sums, then the minimum and the maximum, over the stages.
  std::vector<double> sums = {static_cast<double>(layers.size()),
                              std::accumulate(all.load.begin(), all.load.end(), 0.0),
                              static_cast<double>(all.load.size()),
                              all.assignments,
                              all.dropped,
                              all.aux_loss,
                              all.z_loss};
  std::vector<double> lo = {all.load.empty() ? std::numeric_limits<double>::infinity()
                                             : all.min_load()};
  std::vector<double> hi = {all.load.empty() ? 0.0 : all.max_load()};
  if (pp.size() > 1) {
    for (auto [v, op] : {std::pair{&sums, ReduceOp::sum}, std::pair{&lo, ReduceOp::min},
                         std::pair{&hi, ReduceOp::max}}) {
      Tensor t = Tensor::from_vector(*v, {static_cast<std::int64_t>(v->size())})
                     .to(stream.device(), stream);
      pp.all_reduce(t, t, op, stream).wait(stream);
      *v = t.to_vector<double>();
    }
  }
  MoESummary out;
  out.layers = static_cast<int>(sums[0]);
  if (out.layers == 0) return out;
  out.mean_load = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
  out.min_load = lo[0];
  out.max_load = hi[0];
  out.dropped_fraction = sums[3] > 0 ? sums[4] / sums[3] : 0.0;
  out.aux_loss = sums[5];
  out.z_loss = sums[6];
  return out;
}

ExpertsFp8 MoELayer::experts_fp8(const MoEOptions& options, Communicator* stage) {
  ExpertsFp8 out;
  if (options.fp8.mode == nn::Fp8Mode::off) return out;
  const nn::Fp8Recipe& r = options.fp8;
  const auto scale = [&](const std::string& name, nn::Fp8Format format) -> nn::Fp8TensorScale& {
    return add_fp8_scale(name, format, r);
  };
  // One statement per scale, so they are registered in this order (arguments have none).
  const auto linear = [&](nn::Fp8TensorScale& x, const std::string& name) {
    nn::Fp8TensorScale& w = scale(name + ".fp8_w", nn::Fp8Format::e4m3);
    return tensor_parallel::Fp8Linear(x, w, scale(name + ".fp8_dy", nn::Fp8Format::e5m2));
  };
  nn::Fp8TensorScale& x = scale("experts.fc.fp8_x", nn::Fp8Format::e4m3);
  out.fc = linear(x, "experts.fc");
  if (options.activation == nn::Activation::swiglu) out.up = linear(x, "experts.up");
  out.proj = linear(scale("experts.proj.fp8_x", nn::Fp8Format::e4m3), "experts.proj");
  out.stage = stage;
  return out;
}

MoELayer::MoELayer(const MoEGroups& groups, std::int64_t dim, const MoEOptions& options)
    : dim_(dim), options_(options) {
  QUINTET_CHECK(groups.tp != nullptr,
                "MoELayer: no tensor-parallel communicator (pass a one-rank one for none)");
  options.router.validate();
  QUINTET_CHECK(dim > 0, "MoELayer: dim = {} must be > 0", dim);
  QUINTET_CHECK(options.expert_ffn > 0, "MoELayer: expert_ffn = {} must be > 0",
                options.expert_ffn);
  QUINTET_CHECK(options.overlap_chunks >= 1 && options.overlap_chunks <= 64,
                "MoELayer: overlap_chunks = {} must be between 1 and 64", options.overlap_chunks);
  QUINTET_CHECK(options.shared_experts >= 0, "MoELayer: shared_experts = {} must be >= 0",
                options.shared_experts);
  const int ep = size_of(groups.ep), etp = size_of(groups.etp);
  const std::int64_t E = options.router.experts, F = options.expert_ffn;
  QUINTET_CHECK(E % ep == 0,
                "MoELayer: {} experts are not divisible by the expert-parallel size ep = {}; each "
                "ep rank holds experts / ep of them",
                E, ep);
  QUINTET_CHECK(F % etp == 0,
                "MoELayer: expert_ffn = {} is not divisible by the expert-tensor-parallel size "
                "etp = {}",
                F, etp);
  if (options.fp8.mode != nn::Fp8Mode::off) {
    nn::check_fp8_recipe(options.fp8);
    QUINTET_CHECK(groups.stage != nullptr,
                  "MoELayer: fp8 = {} needs the stage communicator (MoEGroups::stage, the ranks "
                  "of the pipeline stage), over which the experts' FP8 amaxes are reduced",
                  nn::fp8_mode_name(options.fp8.mode));
  }
  const nn::AddParameter add = parameter_adder();
  router_.emplace(add, *groups.tp, groups.cp, dim, options.router, options.sequence_parallel,
                  options.init_std);
  experts_.emplace(add,
                   ExpertsConfig{.experts = E,
                                 .dim = dim,
                                 .ffn = F,
                                 .activation = options.activation,
                                 .init_std = options.init_std,
                                 .proj_init_std = options.proj_init_std,
                                 .ep = ep,
                                 .ep_rank = rank_of(groups.ep),
                                 .etp = etp,
                                 .etp_rank = rank_of(groups.etp)},
                   experts_fp8(options, groups.stage));
  // The chunks of the exchanges: overlap_chunks with an ep exchange, else 1.
  dispatcher_.emplace(*groups.tp, groups.ep, groups.etp,
                      TokenDispatcherConfig{.experts = E,
                                            .local_experts = E / ep,
                                            .sequence_parallel = options.sequence_parallel,
                                            .chunks = ep > 1 ? options.overlap_chunks : 1});
  if (options.shared_experts > 0) {
    shared_ = &add_module("shared", std::make_unique<tensor_parallel::ParallelMLP>(
                                        *groups.tp, dim, options.shared_experts * F,
                                        tensor_parallel::ParallelMLPOptions{
                                            .activation = options.activation,
                                            .init_std = options.init_std,
                                            .proj_init_std = options.proj_init_std,
                                            .sequence_parallel = options.sequence_parallel,
                                            .fp8 = options.fp8}));
  }
}

Tensor MoELayer::forward(nn::Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  const std::int64_t d = dim_, k = options_.router.top_k;
  QUINTET_CHECK(x.defined() && x.dim() == 3 && x.size(2) == d,
                "MoELayer: expected x [batch, seq, {}], got {}", d,
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const std::int64_t B = x.size(0), T = B * x.size(1);
  dispatcher_->check_tokens(B, x.size(1));
  const Tensor x2 = x.contiguous(s).view({T, d});
  MoESaved saved;
  saved.router = router_->forward(ctx, x2, B);
  const ExpertWeights w = experts_->use(s);
  saved.experts.resize(static_cast<std::size_t>(dispatcher_->config().chunks));
  const auto run_experts = [&](int c, const ExpertRows& in) {
    ExpertsActivations& a = saved.experts[static_cast<std::size_t>(c)];
    if (!in.counts.empty()) {
      return experts_->forward(w, in.rows, in.counts, a, ctx.counts_statistics(), s);
    }
    // Without an exchange the experts read their rows' offsets on the device (FP8 too): no wait.
    return experts_->forward(w, in.rows, in.offsets, a, ctx.counts_statistics(), s);
  };
  Tensor y = dispatcher_->forward(x2, saved.router.routing, run_experts, saved.dispatch, s)
                 .view(x.shape());
  if (ctx.counts_statistics()) {
    std::vector<Tensor> loads;
    for (const DispatchHandle::Chunk& ch : saved.dispatch.chunks) loads.push_back(ch.counts);
    router_->count(loads, saved.dispatch.count * k, s);
  }
  ctx.save_handle(*this, std::move(saved));
  if (shared_ != nullptr) y = nn::add(y, shared_->forward(ctx, x), s);
  return y;
}

Tensor MoELayer::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& s = ctx.stream();
  Tensor dx_shared;
  if (shared_ != nullptr) dx_shared = shared_->backward(ctx, dy);
  const MoESaved saved = ctx.take_handle<MoESaved>(*this);
  const Tensor dy2 = dy.contiguous(s).view({saved.dispatch.tokens, dim_});
  // The experts' backward inside their weight gradients' accumulation.
  const ExpertWeights w = experts_->data();
  std::vector<Tensor> grads;
  // Which gradients are stale (nn::Parameter::grad_for_write): the first chunk's experts
  // overwrite them, the later chunks add.
  std::vector<bool> overwrite;
  const auto run_experts = [&](int c, const Tensor& drows, const Stream& st) {
    Tensor dx = experts_->backward(w, drows, saved.experts[static_cast<std::size_t>(c)], grads,
                                   overwrite, st);
    overwrite.assign(overwrite.size(), false);
    return dx;
  };
  const auto with_grads = [&](const std::function<void(const Stream&)>& body) {
    nn::accumulate_gradients(
        ctx, {experts_->fc(), experts_->up(), experts_->proj()},
        [&](const std::vector<Tensor>& g, const std::vector<bool>& o, const Stream& st) {
          grads = g;
          overwrite = o;
          body(st);
          // Stale gradients no experts' call wrote (no chunk ran) read as zeros.
          for (std::size_t i = 0; i < grads.size(); ++i) {
            if (overwrite[i] && grads[i].numel() > 0) Tensor(grads[i]).fill_(0.0, st);
          }
        },
        nn::GradTiming::now);
  };
  const DispatchGrads g = dispatcher_->backward(dy2, saved.dispatch, run_experts, with_grads, s);
  Tensor dx = g.dx;
  // The router: from d(weights) of every token this rank routed, with the load-balancing terms.
  const Tensor dx_router = router_->backward(ctx, saved.router, g.dweights);
  nn::add_(dx, nn::cast(dx_router, dx.dtype(), s), 1.0f, s);
  Tensor out = dx.view(dy.shape());
  if (dx_shared.defined()) nn::add_(out, dx_shared, 1.0f, s);
  return out;
}

MoEStats MoELayer::finish_step(Communicator& stage, const Stream& stream) {
  const std::vector<MoELayer*> one = {this};
  const StepCounters reduced = reduce_step_counters(one, stage, stream);
  const Tensor counters = reduced.summed.to(Device::cpu(), stream);
  stream.synchronize();
  return finish_steps(one, counters, stage, stream).front();
}

StepCounters reduce_step_counters(const std::vector<MoELayer*>& layers, Communicator& stage,
                                  const Stream& stream) {
  std::vector<double> host;
  struct DeviceCounters {
    std::int64_t at, experts;  // the layer's offset, E
    Tensor sums;               // [E + 2]: load, aux sum, z sum
  };
  std::vector<DeviceCounters> sums;
  for (MoELayer* layer : layers) {
    const std::int64_t at = static_cast<std::int64_t>(host.size());
    Tensor s = layer->take_counters(host);
    if (s.defined()) sums.push_back({at, layer->options().router.experts, std::move(s)});
  }
  // From pinned memory, so that the upload does not wait for the stream (a pageable one would).
  StepCounters out;
  if (host.empty()) return out;
  out.staging = Tensor::empty_pinned({static_cast<std::int64_t>(host.size())}, DType::f64);
  std::copy(host.begin(), host.end(), out.staging.data<double>());
  out.summed = out.staging.to(stream.device(), stream);
  for (const DeviceCounters& d : sums) {
    const Tensor s = d.sums.to(stream.device(), stream);
    out.summed.narrow(0, d.at, d.experts).copy_(s.narrow(0, 0, d.experts), stream);
    out.summed.narrow(0, d.at + d.experts + 1, 2).copy_(s.narrow(0, d.experts, 2), stream);
  }
  if (stage.size() > 1) {
    stage.all_reduce(out.summed, out.summed, ReduceOp::sum, stream).wait(stream);
  }
  return out;
}

std::vector<MoEStats> finish_steps(const std::vector<MoELayer*>& layers, const Tensor& counters,
                                   const Communicator& stage, const Stream& stream) {
  std::int64_t total = 0;
  for (const MoELayer* layer : layers) total += layer->counters_size();
  QUINTET_CHECK(
      counters.device().is_cpu() && counters.dtype() == DType::f64 && counters.numel() == total,
      "finish_steps: the counters are {} {} values on {}; want the {} f64 values of "
      "reduce_step_counters for these {} layers, on the CPU",
      counters.numel(), dtype_name(counters.dtype()), counters.device().str(), total,
      layers.size());
  const double* at = counters.data<double>();
  std::vector<MoEStats> out;
  for (MoELayer* layer : layers) {
    out.push_back(layer->finish_step(at, stage, stream));
    at += layer->counters_size();
  }
  return out;
}

}  // namespace quintet::expert
