// The router's math on the CPU, in f32 (see router.hpp for the definitions).
#include "quintet/parallel/expert/router.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "quintet/core/error.hpp"

namespace quintet::expert {

namespace {

void check_matrix(const char* what, const Tensor& t, std::int64_t cols, DType dtype) {
  QUINTET_CHECK(t.defined() && t.device().is_cpu() && t.dtype() == dtype && t.dim() == 2 &&
                    t.size(1) == cols && t.is_contiguous(),
                "router: {} must be a contiguous [T, {}] {} CPU tensor, got {}", what, cols,
                dtype_name(dtype), t.defined() ? t.str() : std::string("an undefined tensor"));
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
}

std::int64_t RouterConfig::capacity(std::int64_t tokens) const {
  if (capacity_factor <= 0.0f) return 0;
  const double c = std::ceil(static_cast<double>(capacity_factor) * static_cast<double>(tokens) *
                             top_k / static_cast<double>(experts));
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(c));
}

Routing route(const Tensor& logits, const Tensor& bias, const RouterConfig& config) {
  config.validate();
  const std::int64_t E = config.experts;
  const int k = config.top_k;
  check_matrix("logits", logits, E, DType::f32);
  QUINTET_CHECK(!bias.defined() || (bias.device().is_cpu() && bias.dtype() == DType::f32 &&
                                    bias.numel() == E && bias.is_contiguous()),
                "router: the balancing bias must be a contiguous [{}] f32 CPU tensor, got {}", E,
                bias.str());
  const std::int64_t T = logits.size(0);
  Routing r;
  r.probs = Tensor::empty({T, E}, DType::f32);
  r.experts = Tensor::empty({T, k}, DType::i32);
  r.weights = Tensor::empty({T, k}, DType::f32);
  r.kept = Tensor::empty({T, k}, DType::u8);
  const float* lg = logits.data<float>();
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  float* p = r.probs.data<float>();
  std::int32_t* ex = r.experts.data<std::int32_t>();
  float* w = r.weights.data<float>();
  std::uint8_t* kept = r.kept.data<std::uint8_t>();
  std::vector<std::int32_t> order(static_cast<std::size_t>(E));
  std::vector<float> sel(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = lg + t * E;
    float* prow = p + t * E;
    if (config.score == RouterScore::softmax) {
      const double lse = logsumexp(row, E);
      for (std::int64_t e = 0; e < E; ++e) {
        prow[e] = static_cast<float>(std::exp(static_cast<double>(row[e]) - lse));
      }
    } else {
      for (std::int64_t e = 0; e < E; ++e) {
        prow[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(row[e]))));
      }
    }
    for (std::int64_t e = 0; e < E; ++e) sel[e] = prow[e] + (b != nullptr ? b[e] : 0.0f);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](std::int32_t a, std::int32_t c) {
                        return sel[a] > sel[c] || (sel[a] == sel[c] && a < c);
                      });
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += prow[order[j]];
    for (int j = 0; j < k; ++j) {
      ex[t * k + j] = order[j];
      const float pv = prow[order[j]];
      w[t * k + j] = config.renormalize ? static_cast<float>(pv / sum) : pv;
      kept[t * k + j] = 1;
    }
  }
  const std::int64_t cap = config.capacity(T);
  if (cap > 0) {
    // Per expert, its assignments by decreasing probability (ties: earlier token first); those
    // past the capacity are dropped.
    std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(E));
    for (std::int64_t a = 0; a < T * k; ++a) by_expert[ex[a]].push_back(a);
    for (std::int64_t e = 0; e < E; ++e) {
      auto& list = by_expert[e];
      if (static_cast<std::int64_t>(list.size()) <= cap) continue;
      std::stable_sort(list.begin(), list.end(), [&](std::int64_t a, std::int64_t c) {
        return p[(a / k) * E + e] > p[(c / k) * E + e];
      });
      for (std::size_t i = static_cast<std::size_t>(cap); i < list.size(); ++i) {
        kept[list[i]] = 0;
        w[list[i]] = 0.0f;
        ++r.dropped;
      }
    }
  }
  return r;
}

std::vector<std::int64_t> expert_load(const Routing& routing, std::int64_t experts) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(experts), 0);
  const std::int32_t* ex = routing.experts.data<std::int32_t>();
  const std::uint8_t* kept = routing.kept.data<std::uint8_t>();
  for (std::int64_t a = 0; a < routing.experts.numel(); ++a) {
    if (kept[a] != 0) ++load[ex[a]];
  }
  return load;
}

Tensor weights_backward(const Routing& routing, const Tensor& dweights,
                        const RouterConfig& config) {
  const std::int64_t T = routing.probs.size(0), E = routing.probs.size(1);
  const int k = config.top_k;
  check_matrix("dweights", dweights, k, DType::f32);
  QUINTET_CHECK(dweights.size(0) == T, "router: dweights has {} rows for {} tokens",
                dweights.size(0), T);
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

Tensor scores_backward(const Tensor& probs, const Tensor& dprobs, RouterScore score) {
  const std::int64_t E = probs.size(1);
  check_matrix("dprobs", dprobs, E, DType::f32);
  const std::int64_t T = probs.size(0);
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

AuxStats aux_stats(const Routing& routing, std::int64_t groups) {
  const std::int64_t T = routing.probs.size(0), E = routing.probs.size(1);
  const std::int64_t k = routing.experts.size(1);
  QUINTET_CHECK(groups >= 1 && T % groups == 0,
                "router: {} tokens do not split into {} equal groups for the aux loss", T, groups);
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
  const std::int64_t G = stats.counts.size(0), E = stats.counts.size(1);
  const float* c = stats.counts.data<float>();
  const float* ps = stats.prob_sum.data<float>();
  const double n = static_cast<double>(group_tokens);
  double total = 0.0;
  for (std::int64_t g = 0; g < G; ++g) {
    double l = 0.0;
    for (std::int64_t e = 0; e < E; ++e) {
      l += (c[g * E + e] / (n * config.top_k)) * (ps[g * E + e] / n);
    }
    total += static_cast<double>(E) * l;
  }
  return G > 0 ? config.aux_loss_coeff * total / static_cast<double>(G) : 0.0;
}

void add_aux_loss_grad(const AuxStats& stats, std::int64_t group_tokens, const RouterConfig& config,
                       float scale, const Tensor& dprobs) {
  const std::int64_t G = stats.counts.size(0), E = stats.counts.size(1);
  check_matrix("dprobs", dprobs, E, DType::f32);
  const std::int64_t T = dprobs.size(0);
  QUINTET_CHECK(T % G == 0, "router: {} tokens do not split into the aux loss's {} groups", T, G);
  const std::int64_t local = T / G;
  const float* c = stats.counts.data<float>();
  float* dp = dprobs.data<float>();
  const double n = static_cast<double>(group_tokens);
  // dL/dP_ge = coeff * E / G * f_ge, and dP_ge/dprobs[t, e] = 1 / n for t in g.
  const double base = static_cast<double>(scale) * config.aux_loss_coeff * static_cast<double>(E) /
                      static_cast<double>(G) / (n * config.top_k * n);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t g = t / local;
    for (std::int64_t e = 0; e < E; ++e) {
      dp[t * E + e] += static_cast<float>(base * c[g * E + e]);
    }
  }
}

double z_loss(const Tensor& logits, const RouterConfig& config) {
  check_matrix("logits", logits, config.experts, DType::f32);
  const std::int64_t T = logits.size(0), E = logits.size(1);
  if (T == 0) return 0.0;
  double s = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const double l = logsumexp(logits.data<float>() + t * E, E);
    s += l * l;
  }
  return config.z_loss_coeff * s / static_cast<double>(T);
}

void add_z_loss_grad(const Tensor& logits, const RouterConfig& config, float scale,
                     const Tensor& dlogits) {
  const std::int64_t E = config.experts;
  check_matrix("logits", logits, E, DType::f32);
  check_matrix("dlogits", dlogits, E, DType::f32);
  const std::int64_t T = logits.size(0);
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
