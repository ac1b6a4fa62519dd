// The router's functions (see router.hpp for the definitions): routing through the fused op with
// the capacity, the aux loss from its statistics, the load's sum, the balancing bias.
#include "quintet/parallel/expert/router.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "quintet/core/config.hpp"
#include "quintet/core/device_guard.hpp"
#include "quintet/core/error.hpp"

#if QUINTET_HAS_CUDA
#include "parallel/expert/cuda/moe_kernels.hpp"
#endif

namespace quintet::expert {

namespace {

// A contiguous [T, cols] tensor of dtype.
void check_matrix(const char* what, const Tensor& t, std::int64_t cols, DType dtype) {
  QUINTET_CHECK(
      t.defined() && t.dtype() == dtype && t.dim() == 2 && t.size(1) == cols && t.is_contiguous(),
      "router: {} must be a contiguous [T, {}] {} tensor, got {}", what, cols, dtype_name(dtype),
      t.defined() ? t.str() : std::string("an undefined tensor"));
}

// Whether t is a CUDA tensor (the GPU kernels of cuda/moe_kernels.hpp run it).
bool on_gpu(const Tensor& t) {
#if QUINTET_HAS_CUDA
  return t.device().is_cuda();
#else
  (void)t;
  return false;
#endif
}

}  // namespace

RouterScore parse_router_score(std::string_view name) {
  if (name == "softmax") return RouterScore::softmax;
  if (name == "sigmoid") return RouterScore::sigmoid;
  QUINTET_THROW(InvalidArgument, "unknown router score \"{}\"; use softmax or sigmoid", name);
}

void RouterConfig::validate() const {
  QUINTET_CHECK(experts >= 1, "RouterConfig: experts = {} must be >= 1", experts);
  QUINTET_CHECK(top_k >= 1 && top_k <= 8,
                "RouterConfig: top_k = {} must be between 1 and 8 (experts per token)", top_k);
  QUINTET_CHECK(top_k <= experts,
                "RouterConfig: top_k = {} is more than the {} experts; each token goes to top_k "
                "different experts",
                top_k, experts);
  const auto non_negative = [](const char* name, float v) {
    QUINTET_CHECK(std::isfinite(v) && v >= 0.0f, "RouterConfig: {} = {} must be finite and >= 0",
                  name, v);
  };
  non_negative("capacity_factor", capacity_factor);
  non_negative("aux_loss_coeff", aux_loss_coeff);
  non_negative("z_loss_coeff", z_loss_coeff);
  non_negative("bias_rate", bias_rate);
  QUINTET_CHECK(idle_warning_steps >= 0,
                "RouterConfig: idle_warning_steps = {} must be >= 0 (0: never warn)",
                idle_warning_steps);
}

std::int64_t RouterConfig::capacity(std::int64_t tokens) const {
  if (capacity_factor <= 0.0f) return 0;
  const double c = std::ceil(static_cast<double>(capacity_factor) * static_cast<double>(tokens) *
                             top_k / static_cast<double>(experts));
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(c));
}

nn::RouteOptions route_options(const RouterConfig& config) {
  nn::RouteOptions o;
  o.top_k = config.top_k;
  o.score = config.score;
  o.renormalize = config.renormalize;
  return o;
}

Routing apply_capacity(const nn::RouteOutput& routed, const RouterConfig& config,
                       const Stream& stream) {
  Routing r{routed.probs, routed.experts, routed.weights, routed.kept,
            on_gpu(routed.probs) ? -1 : 0};
  const std::int64_t cap = config.capacity(r.probs.size(0));
  if (cap > 0)
    r.dropped = nn::moe_drop_over_capacity_(r.probs, r.experts, cap, r.weights, r.kept, stream);
  return r;
}

Routing route(const Tensor& logits, const Tensor& bias, const RouterConfig& config,
              const Stream& stream) {
  config.validate();
  check_matrix("logits", logits, config.experts, DType::f32);
  return apply_capacity(
      nn::moe_route_forward(logits, bias, route_options(config), Tensor(), stream), config, stream);
}

void accumulate_load(const Tensor& counts, const Tensor& acc, const Stream& stream) {
  QUINTET_CHECK(counts.defined() && counts.dtype() == DType::i64 && counts.dim() == 1 &&
                    counts.is_contiguous(),
                "router: the load comes as a contiguous [E] i64 tensor, got {}",
                counts.defined() ? counts.str() : std::string("an undefined tensor"));
  QUINTET_CHECK(acc.defined() && acc.dtype() == DType::f64 && acc.numel() == counts.numel() &&
                    acc.is_contiguous() && acc.device() == counts.device(),
                "router: the load accumulates into a contiguous [{}] f64 tensor on {}, got {}",
                counts.numel(), counts.device().str(),
                acc.defined() ? acc.str() : std::string("an undefined tensor"));
  if (on_gpu(acc)) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(acc.device());
    cuda::add_counts(counts, acc, stream);
    return;
#endif
  }
  const std::int64_t* c = counts.data<std::int64_t>();
  double* a = acc.data<double>();
  for (std::int64_t e = 0; e < counts.numel(); ++e) a[e] += static_cast<double>(c[e]);
}

void accumulate_aux_loss(const AuxStats& stats, std::int64_t group_tokens,
                         const RouterConfig& config, const Tensor& acc, const Stream& stream) {
  const std::int64_t G = stats.counts.size(0), E = stats.counts.size(1);
  QUINTET_CHECK(acc.defined() && acc.dtype() == DType::f64 && acc.numel() == 1 &&
                    acc.device() == stats.counts.device(),
                "router: the aux loss accumulates into a [1] f64 tensor on {}, got {}",
                stats.counts.device().str(), acc.str());
  const double n = static_cast<double>(group_tokens);
  if (on_gpu(acc)) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(acc.device());
    cuda::aux_loss(stats.counts, stats.prob_sum, n, config.top_k, config.aux_loss_coeff, acc,
                   stream);
    return;
#endif
  }
  const float* c = stats.counts.data<float>();
  const float* ps = stats.prob_sum.data<float>();
  double total = 0.0;
  for (std::int64_t g = 0; g < G; ++g) {
    double l = 0.0;
    for (std::int64_t e = 0; e < E; ++e) {
      l += (c[g * E + e] / (n * config.top_k)) * (ps[g * E + e] / n);
    }
    total += static_cast<double>(E) * l;
  }
  if (G > 0) acc.data<double>()[0] += config.aux_loss_coeff * total / static_cast<double>(G);
}

double aux_grad_factor(const RouterConfig& config, std::int64_t groups, std::int64_t group_tokens,
                       float scale) {
  // dL/dP_ge = coeff * E / G * f_ge, and dP_ge/dprobs[t, e] = 1 / n for t in g.
  const double n = static_cast<double>(group_tokens);
  return static_cast<double>(scale) * config.aux_loss_coeff * static_cast<double>(config.experts) /
         static_cast<double>(groups) / (n * config.top_k * n);
}

void update_balance_bias(const Tensor& bias, const std::vector<double>& load, float rate) {
  QUINTET_CHECK(bias.device().is_cpu() && bias.dtype() == DType::f32 &&
                    bias.numel() == static_cast<std::int64_t>(load.size()) && bias.is_contiguous(),
                "update_balance_bias: bias must be a contiguous [{}] f32 CPU tensor, got {}",
                load.size(), bias.str());
  if (load.empty()) return;
  const double mean =
      std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
  float* b = bias.data<float>();
  for (std::size_t e = 0; e < load.size(); ++e) {
    const double diff = mean - load[e];
    b[e] += rate * static_cast<float>((diff > 0) - (diff < 0));
  }
}

}  // namespace quintet::expert
