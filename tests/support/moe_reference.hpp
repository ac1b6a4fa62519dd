// An independent reference for the MoE layer (quintet/parallel/expert/moe_layer.hpp), written from
// its documented rules (moe_layer.hpp, router.hpp) as a plain per-token loop in f64 on
// std::vector, sharing no code with the layer: router scores, top-k, combine weights, the capacity
// rule, each chosen expert's MLP, the weighted sum, the shared experts, and the aux and z losses.
// Gradients are taken from it by finite differences (tests/unit/ep_moe_reference_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace moe_ref {

struct Config {
  std::int64_t experts = 4, top_k = 2, dim = 4, ffn = 4;
  bool sigmoid = false;  // scores: softmax over the experts, or sigmoid elementwise
  bool renormalize = true;
  bool swiglu = false;           // experts (and shared experts): SwiGLU, else GELU
  double capacity_factor = 0.0;  // 0 = dropless
  double aux_coeff = 0.0, z_coeff = 0.0;
  std::int64_t shared_width = 0;  // the shared MLP's width (0 = none)
};

// Row-major, as the layer's parameters: router [E, d], fc and up [E, F, d], proj [E, d, F]; the
// shared MLP fc and up [Fs, d], proj [d, Fs], with biases fc_b [Fs] and proj_b [d] for GELU only.
// bias [E] (may be empty) is the balancing bias, added to the scores for the selection only.
struct Params {
  std::vector<double> router, fc, up, proj;
  std::vector<double> shared_fc, shared_fc_b, shared_up, shared_proj, shared_proj_b;
  std::vector<double> bias;
};

struct Result {
  std::vector<double> y;             // [T, d]
  double aux = 0.0, z = 0.0;         // the loss terms, coefficients included
  std::vector<std::int64_t> expert;  // [T, k]: the selected experts, by decreasing selection score
  std::vector<int> kept;             // [T, k]: 0 where the capacity dropped the assignment
  std::vector<std::int64_t> load;    // [E]: kept assignments per expert
  std::int64_t dropped = 0;
};

inline double gelu(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
inline double silu(double v) { return v / (1.0 + std::exp(-v)); }

// out[r] = sum_i w[r * n + i] * x[i] (+ b[r]) for r < rows.
inline std::vector<double> matvec(const double* w, const double* x, std::int64_t rows,
                                  std::int64_t n, const double* b = nullptr) {
  std::vector<double> out(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    double s = b != nullptr ? b[r] : 0.0;
    for (std::int64_t i = 0; i < n; ++i) s += w[r * n + i] * x[i];
    out[static_cast<std::size_t>(r)] = s;
  }
  return out;
}

// One MLP of width F on the token x [d]: proj . act(fc . x (+ fc_b)) (+ proj_b); SwiGLU:
// proj . (silu(fc . x) * (up . x)).
inline std::vector<double> mlp(const Config& c, std::int64_t F, const double* fc, const double* up,
                               const double* proj, const double* fc_b, const double* proj_b,
                               const double* x) {
  std::vector<double> h = matvec(fc, x, F, c.dim, fc_b);
  if (c.swiglu) {
    const std::vector<double> u = matvec(up, x, F, c.dim);
    for (std::int64_t f = 0; f < F; ++f) h[f] = silu(h[f]) * u[f];
  } else {
    for (double& v : h) v = gelu(v);
  }
  return matvec(proj, h.data(), c.dim, F, proj_b);
}

// The layer on x [sequences, seq, d] (T = sequences * seq tokens, one rank).
inline Result forward(const Config& c, const Params& p, const std::vector<double>& x,
                      std::int64_t sequences) {
  const std::int64_t E = c.experts, k = c.top_k, d = c.dim, F = c.ffn;
  const std::int64_t T = static_cast<std::int64_t>(x.size()) / d, n = T / sequences;
  Result r;
  r.y.assign(static_cast<std::size_t>(T * d), 0.0);
  r.expert.assign(static_cast<std::size_t>(T * k), -1);
  r.kept.assign(static_cast<std::size_t>(T * k), 1);
  r.load.assign(static_cast<std::size_t>(E), 0);
  std::vector<double> probs(static_cast<std::size_t>(T * E)), weight(r.kept.size());

  // Scores, the selection (repeated arg-max of probs + bias, the lower expert on a tie) and the
  // weights; the z loss from each token's log-sum-exp of its logits.
  double z_sum = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::vector<double> logit = matvec(p.router.data(), &x[t * d], E, d);
    double m = logit[0];
    for (double v : logit) m = std::max(m, v);
    double s = 0.0;
    for (double v : logit) s += std::exp(v - m);
    const double lse = m + std::log(s);
    z_sum += lse * lse;
    double* pt = &probs[t * E];
    for (std::int64_t e = 0; e < E; ++e) {
      pt[e] = c.sigmoid ? 1.0 / (1.0 + std::exp(-logit[e])) : std::exp(logit[e] - lse);
    }
    std::vector<bool> taken(static_cast<std::size_t>(E), false);
    double picked = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t best = -1;
      double best_score = 0.0;
      for (std::int64_t e = 0; e < E; ++e) {
        const double score = pt[e] + (p.bias.empty() ? 0.0 : p.bias[e]);
        if (!taken[e] && (best < 0 || score > best_score)) best = e, best_score = score;
      }
      taken[best] = true;
      r.expert[t * k + j] = best;
      picked += pt[best];
    }
    for (std::int64_t j = 0; j < k; ++j) {
      const double pv = pt[r.expert[t * k + j]];
      weight[t * k + j] = c.renormalize ? pv / picked : pv;
    }
  }
  r.z = c.z_coeff * z_sum / static_cast<double>(T);

  // Capacity: C = max(1, ceil(factor * T * k / E)) per expert. Assignment (t, j) to e is dropped
  // when at least C other assignments to e rank above it: a larger probs[., e], or an equal one
  // of an earlier token.
  if (c.capacity_factor > 0.0) {
    const auto C = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(
               std::ceil(c.capacity_factor * static_cast<double>(T * k) / static_cast<double>(E))));
    for (std::int64_t a = 0; a < T * k; ++a) {
      const std::int64_t e = r.expert[a], t = a / k;
      std::int64_t above = 0;
      for (std::int64_t b = 0; b < T * k; ++b) {
        const std::int64_t u = b / k;
        if (b == a || r.expert[b] != e) continue;
        const double pu = probs[u * E + e], pt = probs[t * E + e];
        if (pu > pt || (pu == pt && u < t)) ++above;
      }
      if (above >= C) r.kept[a] = 0;
    }
  }

  // The aux loss per sequence g of n tokens: E * sum_e f_ge * P_ge, f_ge = selected assignments
  // (dropped ones included) / (n k), P_ge = mean of probs[t, e] over g; the mean over sequences.
  double aux = 0.0;
  for (std::int64_t g = 0; g < sequences; ++g) {
    for (std::int64_t e = 0; e < E; ++e) {
      double count = 0.0, psum = 0.0;
      for (std::int64_t t = g * n; t < (g + 1) * n; ++t) {
        psum += probs[t * E + e];
        for (std::int64_t j = 0; j < k; ++j) count += r.expert[t * k + j] == e ? 1.0 : 0.0;
      }
      aux += static_cast<double>(E) * (count / static_cast<double>(n * k)) *
             (psum / static_cast<double>(n));
    }
  }
  r.aux = c.aux_coeff * aux / static_cast<double>(sequences);

  // Each token: the weighted sum of its kept experts' MLPs, plus the shared MLP.
  for (std::int64_t t = 0; t < T; ++t) {
    double* yt = &r.y[t * d];
    const double* xt = &x[t * d];
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j, e = r.expert[a];
      if (r.kept[a] == 0) {
        ++r.dropped;
        continue;
      }
      ++r.load[e];
      const std::vector<double> out =
          mlp(c, F, &p.fc[e * F * d], c.swiglu ? &p.up[e * F * d] : nullptr, &p.proj[e * d * F],
              nullptr, nullptr, xt);
      for (std::int64_t i = 0; i < d; ++i) yt[i] += weight[a] * out[i];
    }
    if (c.shared_width > 0) {
      const std::vector<double> out =
          mlp(c, c.shared_width, p.shared_fc.data(), c.swiglu ? p.shared_up.data() : nullptr,
              p.shared_proj.data(), c.swiglu ? nullptr : p.shared_fc_b.data(),
              c.swiglu ? nullptr : p.shared_proj_b.data(), xt);
      for (std::int64_t i = 0; i < d; ++i) yt[i] += out[i];
    }
  }
  return r;
}

}  // namespace moe_ref
