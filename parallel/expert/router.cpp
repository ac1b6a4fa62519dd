// The router's math on the CPU, in f32 (see router.hpp for the definitions).
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

// A contiguous [T, cols] tensor of dtype, on `device` when given (else any device).
void check_matrix(const char* what, const Tensor& t, std::int64_t cols, DType dtype,
                  const Device* device = nullptr) {
  QUINTET_CHECK(t.defined() && t.dtype() == dtype && t.dim() == 2 && t.size(1) == cols &&
                    t.is_contiguous() && (device == nullptr || t.device() == *device),
                "router: {} must be a contiguous [T, {}] {} tensor{}, got {}", what, cols,
                dtype_name(dtype), device != nullptr ? " on " + device->str() : std::string(),
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

double logsumexp(const float* row, std::int64_t n) {
  float m = row[0];
  for (std::int64_t e = 1; e < n; ++e) m = std::max(m, row[e]);
  double s = 0.0;
  for (std::int64_t e = 0; e < n; ++e) s += std::exp(static_cast<double>(row[e] - m));
  return static_cast<double>(m) + std::log(s);
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

std::vector<std::int64_t> expert_load(const Routing& routing, std::int64_t experts,
                                      const Stream& stream) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(experts), 0);
  const Tensor ex_t = routing.experts.to(Device::cpu(), stream);
  const Tensor kept_t = routing.kept.to(Device::cpu(), stream);
  stream.synchronize();
  const std::int32_t* ex = ex_t.data<std::int32_t>();
  const std::uint8_t* kept = kept_t.data<std::uint8_t>();
  for (std::int64_t a = 0; a < routing.experts.numel(); ++a) {
    if (kept[a] != 0) ++load[ex[a]];
  }
  return load;
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

Tensor weights_backward(const Routing& routing, const Tensor& dweights, const RouterConfig& config,
                        const Stream& stream) {
  const std::int64_t T = routing.probs.size(0), E = routing.probs.size(1);
  const int k = config.top_k;
  const Device dev = routing.probs.device();
  check_matrix("dweights", dweights, k, DType::f32, &dev);
  QUINTET_CHECK(dweights.size(0) == T, "router: dweights has {} rows for {} tokens",
                dweights.size(0), T);
  if (on_gpu(dweights)) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(dev);
    Tensor dprobs = Tensor::empty({T, E}, DType::f32, dev, stream);
    cuda::weights_backward(routing.probs, routing.experts, routing.kept, dweights,
                           config.renormalize, dprobs, stream);
    return dprobs;
#endif
  }
  Tensor dprobs = Tensor::zeros({T, E}, DType::f32);
  const float* p = routing.probs.data<float>();
  const std::int32_t* ex = routing.experts.data<std::int32_t>();
  const std::uint8_t* kept = routing.kept.data<std::uint8_t>();
  const float* dw = dweights.data<float>();
  float* dp = dprobs.data<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t a0 = t * k;
    if (!config.renormalize) {
      for (int j = 0; j < k; ++j) {
        if (kept[a0 + j] != 0) dp[t * E + ex[a0 + j]] += dw[a0 + j];
      }
      continue;
    }
    // w_j = p_j / S with S the sum of the k selected probs; dropped w_j are 0 (no gradient).
    double S = 0.0, gp = 0.0;
    for (int j = 0; j < k; ++j) S += p[t * E + ex[a0 + j]];
    for (int j = 0; j < k; ++j) {
      if (kept[a0 + j] != 0) gp += static_cast<double>(dw[a0 + j]) * p[t * E + ex[a0 + j]];
    }
    for (int j = 0; j < k; ++j) {
      const double g = kept[a0 + j] != 0 ? dw[a0 + j] : 0.0;
      dp[t * E + ex[a0 + j]] += static_cast<float>(g / S - gp / (S * S));
    }
  }
  return dprobs;
}

Tensor scores_backward(const Tensor& probs, const Tensor& dprobs, RouterScore score,
                       const Stream& stream) {
  const std::int64_t E = probs.size(1);
  const Device dev = probs.device();
  check_matrix("dprobs", dprobs, E, DType::f32, &dev);
  const std::int64_t T = probs.size(0);
  if (on_gpu(probs)) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(dev);
    Tensor dlogits = Tensor::empty({T, E}, DType::f32, dev, stream);
    cuda::scores_backward(probs, dprobs, score == RouterScore::softmax, dlogits, stream);
    return dlogits;
#endif
  }
  Tensor dlogits = Tensor::empty({T, E}, DType::f32);
  const float* p = probs.data<float>();
  const float* dp = dprobs.data<float>();
  float* dl = dlogits.data<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    const float* pr = p + t * E;
    const float* dr = dp + t * E;
    if (score == RouterScore::softmax) {
      double dot = 0.0;
      for (std::int64_t e = 0; e < E; ++e) dot += static_cast<double>(pr[e]) * dr[e];
      for (std::int64_t e = 0; e < E; ++e) {
        dl[t * E + e] = static_cast<float>(pr[e] * (dr[e] - dot));
      }
    } else {
      for (std::int64_t e = 0; e < E; ++e) dl[t * E + e] = dr[e] * pr[e] * (1.0f - pr[e]);
    }
  }
  return dlogits;
}

AuxStats aux_stats(const Routing& routing, std::int64_t groups, const Stream& stream) {
  const std::int64_t T = routing.probs.size(0), E = routing.probs.size(1);
  const std::int64_t k = routing.experts.size(1);
  QUINTET_CHECK(groups >= 1 && T % groups == 0,
                "router: {} tokens do not split into {} equal groups for the aux loss", T, groups);
  if (on_gpu(routing.probs)) {
#if QUINTET_HAS_CUDA
    const Device dev = routing.probs.device();
    DeviceGuard guard(dev);
    AuxStats s{Tensor::empty({groups, E}, DType::f32, dev, stream),
               Tensor::empty({groups, E}, DType::f32, dev, stream)};
    cuda::aux_stats(routing.probs, routing.experts, s.counts, s.prob_sum, stream);
    return s;
#endif
  }
  const std::int64_t n = T / groups;
  AuxStats s{Tensor::zeros({groups, E}, DType::f32), Tensor::zeros({groups, E}, DType::f32)};
  const float* p = routing.probs.data<float>();
  const std::int32_t* ex = routing.experts.data<std::int32_t>();
  float* c = s.counts.data<float>();
  float* ps = s.prob_sum.data<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t g = t / n;
    for (std::int64_t j = 0; j < k; ++j) c[g * E + ex[t * k + j]] += 1.0f;
    for (std::int64_t e = 0; e < E; ++e) ps[g * E + e] += p[t * E + e];
  }
  return s;
}

double aux_loss(const AuxStats& stats, std::int64_t group_tokens, const RouterConfig& config) {
  const Tensor acc = Tensor::zeros({1}, DType::f64);
  accumulate_aux_loss({stats.counts.to(Device::cpu()), stats.prob_sum.to(Device::cpu())},
                      group_tokens, config, acc);
  return acc.to_vector<double>()[0];
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

void add_aux_loss_grad(const AuxStats& stats, std::int64_t group_tokens, const RouterConfig& config,
                       float scale, const Tensor& dprobs, const Stream& stream) {
  const std::int64_t G = stats.counts.size(0), E = stats.counts.size(1);
  const Device dev = stats.counts.device();
  check_matrix("dprobs", dprobs, E, DType::f32, &dev);
  const std::int64_t T = dprobs.size(0);
  QUINTET_CHECK(T % G == 0, "router: {} tokens do not split into the aux loss's {} groups", T, G);
  const std::int64_t local = T / G;
  const double base = aux_grad_factor(config, G, group_tokens, scale);
  if (on_gpu(dprobs)) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(dev);
    cuda::add_aux_loss_grad(stats.counts, base, dprobs, stream);
    return;
#endif
  }
  const float* c = stats.counts.data<float>();
  float* dp = dprobs.data<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t g = t / local;
    for (std::int64_t e = 0; e < E; ++e) {
      dp[t * E + e] += static_cast<float>(base * c[g * E + e]);
    }
  }
}

double z_loss(const Tensor& logits, const RouterConfig& config) {
  const Tensor acc = Tensor::zeros({1}, DType::f64);
  accumulate_z_loss(logits.to(Device::cpu()), config, acc);
  return acc.to_vector<double>()[0];
}

void accumulate_z_loss(const Tensor& logits, const RouterConfig& config, const Tensor& acc,
                       const Stream& stream) {
  check_matrix("logits", logits, config.experts, DType::f32);
  QUINTET_CHECK(acc.defined() && acc.dtype() == DType::f64 && acc.numel() == 1 &&
                    acc.device() == logits.device(),
                "router: the z loss accumulates into a [1] f64 tensor on {}, got {}",
                logits.device().str(), acc.str());
  const std::int64_t T = logits.size(0), E = logits.size(1);
  if (T == 0) return;
  if (on_gpu(logits)) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(acc.device());
    cuda::z_loss(logits, config.z_loss_coeff, acc, stream);
    return;
#endif
  }
  double s = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const double l = logsumexp(logits.data<float>() + t * E, E);
    s += l * l;
  }
  acc.data<double>()[0] += config.z_loss_coeff * s / static_cast<double>(T);
}

void add_z_loss_grad(const Tensor& logits, const RouterConfig& config, float scale,
                     const Tensor& dlogits, const Stream& stream) {
  const std::int64_t E = config.experts;
  const Device dev = logits.device();
  check_matrix("logits", logits, E, DType::f32);
  check_matrix("dlogits", dlogits, E, DType::f32, &dev);
  const std::int64_t T = logits.size(0);
  if (on_gpu(logits)) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(dev);
    cuda::add_z_loss_grad(logits, static_cast<double>(scale) * config.z_loss_coeff, dlogits,
                          stream);
    return;
#endif
  }
  const float* lg = logits.data<float>();
  float* dl = dlogits.data<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = lg + t * E;
    const double lse = logsumexp(row, E);
    const double f = static_cast<double>(scale) * config.z_loss_coeff * 2.0 * lse;
    for (std::int64_t e = 0; e < E; ++e) {
      dl[t * E + e] += static_cast<float>(f * std::exp(static_cast<double>(row[e]) - lse));
    }
  }
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
