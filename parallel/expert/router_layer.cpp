// The MoE layer's routing part (class Router of quintet/parallel/expert/router.hpp): the router's
// weight, the balancing bias, the step's statistics, around router.cpp's functions.
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "quintet/core/log.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/nn/router_ops.hpp"
#include "quintet/parallel/expert/router.hpp"

namespace quintet::expert {

namespace {

int size_of(Communicator* c) { return c != nullptr ? c->size() : 1; }

// Whether the logits go through the fused router ops (quintet/nn/router_ops.hpp), which read bf16
// x once instead of casting it to f32 for f32 GEMMs. Only on a GPU: the CPU (and f64 layers)
// keep the cast and the f32 (f64) linear ops, whose results tests compare bit for bit, as do
// routers of more experts than the fused ops take.
bool fused_logits(const Tensor& x, std::int64_t experts) {
  return x.device().is_cuda() && x.dtype() == DType::bf16 && experts <= nn::kRouterMaxExperts;
}

void all_reduce_sum(const Tensor& t, Communicator* c, const Stream& s) {
  if (size_of(c) > 1) c->all_reduce(t, t, ReduceOp::sum, s).wait(s);
}

}  // namespace

double MoEStats::min_load() const {
  return load.empty() ? 0.0 : *std::min_element(load.begin(), load.end());
}
double MoEStats::max_load() const {
  return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}
double MoEStats::mean_load() const {
  return load.empty()
             ? 0.0
             : std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
}

Router::Router(const nn::AddParameter& add, Communicator& tp, Communicator* cp, std::int64_t dim,
               const RouterConfig& config, bool sequence_parallel, float init_std)
    : tp_(&tp), cp_(cp), config_(config), sequence_parallel_(sequence_parallel) {
  nn::ParameterAttributes attrs;
  attrs.reduce_over_tp = sequence_parallel;
  weight_ =
      &add("router.weight", {config.experts, dim}, nn::ParameterInit::normal(init_std), attrs);
  bias_ = Tensor::zeros({config.experts}, DType::f32);
  idle_steps_.assign(static_cast<std::size_t>(config.experts), 0);
}

void Router::set_balance_bias(const std::vector<float>& values) {
  QUINTET_CHECK(static_cast<std::int64_t>(values.size()) == config_.experts,
                "MoELayer::set_balance_bias: {} values for {} experts", values.size(),
                config_.experts);
  bias_ = Tensor::from_vector(values, {config_.experts});
  bias_device_ = Tensor();  // uploaded again by the next forward on a GPU
}

const Tensor& Router::device_bias(const Device& device, const Stream& stream) {
  if (device.is_cpu()) return bias_;
  if (!bias_device_.defined() || bias_device_.device() != device) upload_bias(device, stream);
  return bias_device_;
}

void Router::upload_bias(const Device& device, const Stream& stream) {
  // From pinned memory, so that the host does not wait for the copy (from pageable memory it
  // would). The staging buffer lives until the next upload, by when a step's end has waited for
  // the stream.
  bias_staging_ = Tensor::empty_pinned(bias_.shape(), DType::f32);
  bias_staging_.copy_(bias_);
  bias_device_ = bias_staging_.to(device, stream);
}

RouterHandle Router::forward(nn::Context& ctx, const Tensor& x, std::int64_t sequences) {
  const Stream& s = ctx.stream();
  const RouterConfig& rc = config_;
  const Device dev = x.device();
  const std::int64_t E = rc.experts;
  if (!sums_.defined() || sums_.device() != dev) {
    sums_ = Tensor::empty({E + 2}, DType::f64, dev, s);
    sums_.fill_(0.0, s);
  }
  RouterHandle h;
  h.x = x;
  const Tensor w = nn::cast(weight_->use(s), DType::f32, s);
  h.logits = fused_logits(x, E) ? nn::router_logits_forward(x, w, s)
                                : nn::linear_forward(nn::cast(x, DType::f32, s), w, Tensor(), s);
  // One pass: scores, selection, weights, the aux loss's per-sequence statistics (an
  // evaluation, with no backward and nothing counted, needs none) and the z loss's sum.
  h.seq_tokens = x.size(0) / sequences * (sequence_parallel_ ? tp_->size() : 1) * size_of(cp_);
  const bool aux = rc.aux_loss_coeff > 0.0f && !ctx.forward_only();
  const bool z = rc.z_loss_coeff > 0.0f && ctx.counts_statistics() && x.size(0) > 0;
  nn::RouteOptions o = route_options(rc);
  o.groups = aux ? sequences : 0;
  o.z_scale = z ? rc.z_loss_coeff / static_cast<double>(x.size(0)) : 0.0;
  const nn::RouteOutput routed =
      nn::moe_route_forward(h.logits, rc.bias_rate > 0.0f ? device_bias(dev, s) : Tensor(), o,
                            z ? sums_.narrow(0, E + 1, 1) : Tensor(), s);
  h.routing = apply_capacity(routed, rc, s);
  h.lse = routed.lse;
  // The aux statistics summed over the ranks holding parts of a sequence.
  if (aux) {
    const AuxStats st{routed.counts, routed.prob_sum};
    if (sequence_parallel_) {
      all_reduce_sum(st.counts, tp_, s);
      all_reduce_sum(st.prob_sum, tp_, s);
    }
    all_reduce_sum(st.counts, cp_, s);
    all_reduce_sum(st.prob_sum, cp_, s);
    if (ctx.counts_statistics())
      accumulate_aux_loss(st, h.seq_tokens, rc, sums_.narrow(0, E, 1), s);
    h.aux_counts = st.counts;
  }
  return h;
}

Tensor Router::backward(nn::Context& ctx, const RouterHandle& h, const Tensor& dweights) {
  const Stream& s = ctx.stream();
  const RouterConfig& rc = config_;
  // The aux loss spans each whole sequence; data parallelism averages the router's gradient over
  // cp, so each cp rank's part counts cp times. The z loss is a mean over the tokens.
  const bool aux = rc.aux_loss_coeff > 0.0f && h.aux_counts.defined();
  const double aux_scale =
      aux ? aux_grad_factor(rc, h.aux_counts.size(0), h.seq_tokens,
                            ctx.loss_scale() * static_cast<float>(size_of(cp_)))
          : 0.0;
  const double tokens = static_cast<double>(h.x.size(0)) * (sequence_parallel_ ? tp_->size() : 1);
  const double z_scale =
      rc.z_loss_coeff > 0.0f && tokens > 0
          ? static_cast<double>(static_cast<float>(ctx.loss_scale() / tokens)) * rc.z_loss_coeff
          : 0.0;
  const Tensor dlogits = nn::moe_route_backward(
      dweights, h.logits, h.routing.probs, h.routing.experts, h.routing.kept, h.lse,
      aux ? h.aux_counts : Tensor(), aux_scale, z_scale, route_options(rc), s);
  const Tensor w = nn::cast(weight_->data(), DType::f32, s);
  if (fused_logits(h.x, rc.experts)) {
    nn::accumulate_gradients(
        ctx, {weight_},
        [&](const std::vector<Tensor>& g, const Stream& st) {
          nn::router_logits_backward_weight(dlogits, h.x, g[0], st);
        },
        nn::GradTiming::now);
    return nn::router_logits_backward_input(dlogits, w, h.x.dtype(), s);
  }
  // The weight's gradient in its gradient's dtype: f32 (bf16 and f32 layers), f64 (f64 layers).
  const DType gdt = nn::accum_dtype(h.x.dtype());
  const Tensor xg = nn::cast(h.x, gdt, s), dlogits_g = nn::cast(dlogits, gdt, s);
  nn::accumulate_gradients(
      ctx, {weight_},
      [&](const std::vector<Tensor>& g, const Stream& st) {
        nn::linear_backward_weight(dlogits_g, xg, g[0], Tensor(), st);
      },
      nn::GradTiming::now);
  return nn::linear_backward_input(dlogits, w, s);
}

void Router::count(const std::vector<Tensor>& loads, std::int64_t assignments,
                   const Stream& stream) {
  QUINTET_CHECK(sums_.defined(), "Router::count: no forward has run this step");
  for (const Tensor& load : loads) {
    accumulate_load(load, sums_.narrow(0, 0, config_.experts), stream);
  }
  assignments_ += static_cast<double>(assignments);
  microbatches_ += 1.0;
}

Tensor Router::take_counters(std::vector<double>& host) {
  host.insert(host.end(), static_cast<std::size_t>(config_.experts), 0.0);
  host.insert(host.end(), {assignments_, 0.0, 0.0, microbatches_});
  assignments_ = microbatches_ = 0.0;
  return std::exchange(sums_, Tensor());  // the next forward starts a zeroed one
}

MoEStats Router::finish_step(const double* summed, const Communicator& stage,
                             const Stream& stream) {
  const std::int64_t E = config_.experts;
  MoEStats out;
  out.load.assign(summed, summed + E);
  out.assignments = summed[E];
  out.dropped = out.assignments - std::accumulate(out.load.begin(), out.load.end(), 0.0);
  const double mbs = summed[E + 3];
  out.aux_loss = mbs > 0 ? summed[E + 1] / mbs : 0.0;
  out.z_loss = mbs > 0 ? summed[E + 2] / mbs : 0.0;
  if (config_.bias_rate > 0.0f) {
    update_balance_bias(bias_, out.load, config_.bias_rate);
    // The next step's routing reads the new bias; uploading it here keeps forward free of copies.
    if (bias_device_.defined()) upload_bias(bias_device_.device(), stream);
  }
  check_idle_experts(out, stage);
  return out;
}

void Router::check_idle_experts(const MoEStats& step, const Communicator& stage) {
  const RouterConfig& rc = config_;
  std::vector<std::int64_t> idle;
  for (std::size_t e = 0; e < idle_steps_.size(); ++e) {
    idle_steps_[e] = step.load[e] == 0.0 ? idle_steps_[e] + 1 : 0;
    if (rc.idle_warning_steps > 0 && idle_steps_[e] >= rc.idle_warning_steps) {
      idle.push_back(static_cast<std::int64_t>(e));
    }
  }
  if (idle.empty() || warned_idle_) return;
  warned_idle_ = true;  // on every rank of the stage: they all hold the same load
  if (stage.rank() != 0) return;
  // The layer's name from its weight's (the store names it, e.g. "block0.mlp.router.weight").
  std::string name = weight_->name();
  const std::string suffix = "router.weight";
  name = name.size() > suffix.size() ? name.substr(0, name.size() - suffix.size() - 1) : "";
  log::warn(
      "MoE layer{}{}: expert{} {} received no token in the last {} steps (this step's tokens "
      "per expert: min {}, mean {}, max {}): routing has collapsed onto the other experts, which "
      "then learn alone. Turn on or raise load balancing: RouterConfig aux_loss_coeff (now {}, "
      "--aux-loss-coeff) or bias_rate (now {}, --aux-free-bias-rate). Said once per layer; "
      "RouterConfig::idle_warning_steps sets after how many steps (0: never).",
      name.empty() ? "" : " ", name, idle.size() > 1 ? "s" : "", fmt::join(idle, ", "),
      rc.idle_warning_steps, step.min_load(), step.mean_load(), step.max_load(), rc.aux_loss_coeff,
      rc.bias_rate);
}

}  // namespace quintet::expert
