// The CPU mixture-of-experts ops (quintet/nn/ops.hpp): the router in one pass per token (scores
// in f64 rounded to f32, top-k, weights, statistics), the capacity rule, the router's backward,
// and the permutation of the token rows with the weighted combine that undoes it.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"
#include "quintet/core/error.hpp"

namespace quintet::nn::cpu_ops {

namespace {

// log(sum exp(row)) in f64 around the row's f32 maximum.
double logsumexp(const float* row, std::int64_t n) {
  float m = row[0];
  for (std::int64_t e = 1; e < n; ++e) m = std::max(m, row[e]);
  double s = 0.0;
  for (std::int64_t e = 0; e < n; ++e) s += std::exp(static_cast<double>(row[e] - m));
  return static_cast<double>(m) + std::log(s);
}

}  // namespace

void moe_route_forward(const Tensor& logits, const Tensor& bias, const RouteOptions& options,
                       const Tensor& probs, const Tensor& experts, const Tensor& weights,
                       const Tensor& kept, const Tensor& lse, const Tensor& counts,
                       const Tensor& prob_sum, const Tensor& z_sum) {
  const std::int64_t T = logits.size(0), E = logits.size(1);
  const int k = options.top_k;
  const float* lg = logits.data<float>();
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  float* p = probs.data<float>();
  std::int32_t* ex = experts.data<std::int32_t>();
  float* w = weights.data<float>();
  std::uint8_t* kp = kept.data<std::uint8_t>();
  float* ls = lse.data<float>();
  float* cnt = counts.defined() ? counts.data<float>() : nullptr;
  float* ps = prob_sum.defined() ? prob_sum.data<float>() : nullptr;
  if (cnt != nullptr) {
    std::fill(cnt, cnt + counts.numel(), 0.0f);
    std::fill(ps, ps + prob_sum.numel(), 0.0f);
  }
  const std::int64_t group_tokens = options.groups > 0 ? T / options.groups : 1;
  std::vector<std::int32_t> order(static_cast<std::size_t>(E));
  std::vector<float> sel(static_cast<std::size_t>(E));
  double z = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = lg + t * E;
    float* prow = p + t * E;
    const double l = logsumexp(row, E);
    ls[t] = static_cast<float>(l);
    z += l * l;
    if (options.score == RouteScore::softmax) {
      for (std::int64_t e = 0; e < E; ++e) {
        prow[e] = static_cast<float>(std::exp(static_cast<double>(row[e]) - l));
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
      w[t * k + j] = options.renormalize ? static_cast<float>(pv / sum) : pv;
      kp[t * k + j] = 1;
    }
    if (cnt != nullptr) {
      const std::int64_t g = t / group_tokens;
      for (int j = 0; j < k; ++j) cnt[g * E + order[j]] += 1.0f;
      for (std::int64_t e = 0; e < E; ++e) ps[g * E + e] += prow[e];
    }
  }
  if (z_sum.defined()) z_sum.data<double>()[0] += options.z_scale * z;
}

std::int64_t moe_drop_over_capacity_(const Tensor& probs, const Tensor& experts,
                                     std::int64_t capacity, const Tensor& weights,
                                     const Tensor& kept) {
  const std::int64_t E = probs.size(1), A = experts.numel(), k = experts.size(1);
  const float* p = probs.data<float>();
  const std::int32_t* ex = experts.data<std::int32_t>();
  float* w = weights.data<float>();
  std::uint8_t* kp = kept.data<std::uint8_t>();
  // Per expert, its kept assignments by decreasing probability (ties: earlier assignment
  // first); those past the capacity are dropped.
  std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(E));
  for (std::int64_t a = 0; a < A; ++a) {
    QUINTET_CHECK(ex[a] >= 0 && ex[a] < E,
                  "moe_drop_over_capacity_: assignment {} names expert {} of {}", a, ex[a], E);
    if (kp[a] != 0) by_expert[ex[a]].push_back(a);
  }
  std::int64_t dropped = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    auto& list = by_expert[e];
    if (static_cast<std::int64_t>(list.size()) <= capacity) continue;
    std::stable_sort(list.begin(), list.end(), [&](std::int64_t a, std::int64_t c) {
      return p[(a / k) * E + e] > p[(c / k) * E + e];
    });
    for (std::size_t i = static_cast<std::size_t>(capacity); i < list.size(); ++i) {
      kp[list[i]] = 0;
      w[list[i]] = 0.0f;
      ++dropped;
    }
  }
  return dropped;
}

void moe_route_backward(const Tensor& dweights, const Tensor& logits, const Tensor& probs,
                        const Tensor& experts, const Tensor& kept, const Tensor& /*lse*/,
                        const Tensor& counts, double aux_scale, double z_scale,
                        const RouteOptions& options, const Tensor& dlogits) {
  const std::int64_t T = logits.size(0), E = logits.size(1);
  const int k = options.top_k;
  const float* lg = logits.data<float>();
  const float* p = probs.data<float>();
  const std::int32_t* ex = experts.data<std::int32_t>();
  const std::uint8_t* kp = kept.data<std::uint8_t>();
  const float* dw = dweights.data<float>();
  const float* cnt = counts.defined() ? counts.data<float>() : nullptr;
  const std::int64_t local = counts.defined() ? T / counts.size(0) : 1;
  float* dl = dlogits.data<float>();
  std::vector<float> dp(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t a0 = t * k;
    const float* pr = p + t * E;
    // d(probs): through the weights (a dropped weight is 0: no gradient) ...
    std::fill(dp.begin(), dp.end(), 0.0f);
    if (!options.renormalize) {
      for (int j = 0; j < k; ++j) {
        if (kp[a0 + j] != 0) dp[ex[a0 + j]] += dw[a0 + j];
      }
    } else {
      // w_j = p_j / S with S the sum of the k selected probs.
      double S = 0.0, gp = 0.0;
      for (int j = 0; j < k; ++j) S += pr[ex[a0 + j]];
      for (int j = 0; j < k; ++j) {
        if (kp[a0 + j] != 0) gp += static_cast<double>(dw[a0 + j]) * pr[ex[a0 + j]];
      }
      for (int j = 0; j < k; ++j) {
        const double g = kp[a0 + j] != 0 ? dw[a0 + j] : 0.0;
        dp[ex[a0 + j]] += static_cast<float>(g / S - gp / (S * S));
      }
    }
    // ... and the aux loss's sum_e counts * probs.
    if (cnt != nullptr) {
      const float* c = cnt + (t / local) * E;
      for (std::int64_t e = 0; e < E; ++e) dp[e] += static_cast<float>(aux_scale * c[e]);
    }
    // d(logits) through the scores ...
    float* out = dl + t * E;
    if (options.score == RouteScore::softmax) {
      double dot = 0.0;
      for (std::int64_t e = 0; e < E; ++e) dot += static_cast<double>(pr[e]) * dp[e];
      for (std::int64_t e = 0; e < E; ++e) out[e] = static_cast<float>(pr[e] * (dp[e] - dot));
    } else {
      for (std::int64_t e = 0; e < E; ++e) out[e] = dp[e] * pr[e] * (1.0f - pr[e]);
    }
    // ... plus the z loss's: d(lse²)/d(logits) = 2 lse softmax(logits), lse again in f64.
    if (z_scale != 0.0) {
      const float* row = lg + t * E;
      const double l = logsumexp(row, E);
      const double f = z_scale * 2.0 * l;
      for (std::int64_t e = 0; e < E; ++e) {
        out[e] += static_cast<float>(f * std::exp(static_cast<double>(row[e]) - l));
      }
    }
  }
}

void moe_permute(const Tensor& x, const Tensor& experts, const Tensor& kept, const Tensor& rows,
                 const Tensor& counts, const Tensor& offsets, const Tensor& source,
                 const Tensor& slot) {
  const std::int64_t A = experts.numel(), k = experts.size(1), E = counts.numel();
  const std::int64_t d = x.size(1);
  const std::int32_t* ex = experts.data<std::int32_t>();
  const std::uint8_t* kp = kept.data<std::uint8_t>();
  for (std::int64_t a = 0; a < A; ++a) {
    QUINTET_CHECK(kp[a] == 0 || (ex[a] >= 0 && ex[a] < E),
                  "moe_permute: assignment {} names expert {} of {}", a, ex[a], E);
  }
  std::int64_t* cn = counts.data<std::int64_t>();
  std::fill(cn, cn + E, 0);
  for (std::int64_t a = 0; a < A; ++a) {
    if (kp[a] != 0) ++cn[ex[a]];
  }
  std::int64_t* off = offsets.data<std::int64_t>();
  off[0] = 0;
  std::partial_sum(cn, cn + E, off + 1);
  std::vector<std::int64_t> next(off, off + E);
  std::int32_t* src = source.data<std::int32_t>();
  std::int32_t* sl = slot.data<std::int32_t>();
  std::fill(src, src + A, -1);
  for (std::int64_t a = 0; a < A; ++a) {
    sl[a] = -1;
    if (kp[a] == 0) continue;
    const std::int64_t row = next[ex[a]]++;
    sl[a] = static_cast<std::int32_t>(row);
    src[row] = static_cast<std::int32_t>(a);
  }
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* out = rows.data<T>();
    for (std::int64_t i = 0; i < A; ++i) {
      if (src[i] < 0) {
        std::fill(out + i * d, out + (i + 1) * d, T(0));
      } else {
        std::copy(in + (src[i] / k) * d, in + (src[i] / k + 1) * d, out + i * d);
      }
    }
  });
}

void moe_unpermute(const Tensor& rows, const Tensor& slot, const Tensor& weights, const Tensor& y) {
  const std::int64_t n = slot.size(0), k = slot.size(1), d = rows.size(1), R = rows.size(0);
  const std::int32_t* sl = slot.data<std::int32_t>();
  for (std::int64_t a = 0; a < n * k; ++a) {
    QUINTET_CHECK(sl[a] < R, "moe_unpermute: assignment {} points at row {} of {}", a, sl[a], R);
  }
  dispatch_real(rows.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = rows.data<T>();
    const float* w = weights.defined() ? weights.data<float>() : nullptr;
    T* o = y.data<T>();
    std::fill(o, o + n * d, T(0));
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        if (sl[a] < 0) continue;
        const T wt = w != nullptr ? static_cast<T>(w[a]) : T(1);
        const T* src = in + static_cast<std::int64_t>(sl[a]) * d;
        for (std::int64_t c = 0; c < d; ++c) o[t * d + c] += wt * src[c];
      }
    }
  });
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                            const Tensor& /*source*/, const Tensor& weights, const Tensor& drows,
                            const Tensor& dweights) {
  const std::int64_t n = dy.size(0), d = dy.size(1), k = slot.size(1), R = rows.size(0);
  const std::int32_t* sl = slot.data<std::int32_t>();
  for (std::int64_t a = 0; a < n * k; ++a) {
    QUINTET_CHECK(sl[a] < R, "moe_unpermute_backward: assignment {} points at row {} of {}", a,
                  sl[a], R);
  }
  dispatch_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* gy = dy.data<T>();
    const T* y = rows.data<T>();
    const float* w = weights.data<float>();
    T* dr = drows.data<T>();
    float* dw = dweights.data<float>();
    std::fill(dr, dr + rows.numel(), T(0));
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        dw[a] = 0.0f;
        if (sl[a] < 0) continue;
        const std::int64_t r = sl[a];
        const T wt = static_cast<T>(w[a]);
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c) {
          dr[r * d + c] = wt * gy[t * d + c];
          dot += static_cast<double>(gy[t * d + c]) * y[r * d + c];
        }
        dw[a] = static_cast<float>(dot);
      }
    }
  });
}

}  // namespace quintet::nn::cpu_ops
