// CPU attention, one (batch, query head) at a time: the score matrix is formed whole with Eigen
// GEMMs (Sq x Sk values per head), masked by global positions, and normalised with its log-sum-exp.
// Grouped-query attention reads the key/value head of each query head's group in place; the
// backward sums dk and dv over the group.
#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"

namespace quintet::nn::cpu_ops {

namespace {
// Number of keys query row i sees: keys j < visible_keys(i) are visible.
std::int64_t visible_keys(const AttentionOptions& o, std::int64_t i, std::int64_t sk) {
  if (!o.causal) return sk;
  const std::int64_t last = o.q_offset + i - o.k_offset;  // highest visible key index
  return std::clamp<std::int64_t>(last + 1, 0, sk);
}

// scores = scale * q kᵀ, then P = exp(scores - lse) on visible keys and 0 elsewhere. When lse is
// null it is computed (and written to lse_out).
template <class T>
void probabilities(const ConstMatMap<T>& q, const ConstMatMap<T>& k, const AttentionOptions& o,
                   const T* lse_in, T* lse_out, RowMatrix<T>& p) {
  const std::int64_t sq = q.rows(), sk = k.rows();
  p.noalias() = (q * k.transpose()) * T(o.scale);
  for (std::int64_t i = 0; i < sq; ++i) {
    const std::int64_t n = visible_keys(o, i, sk);
    T lse;
    if (lse_in != nullptr) {
      lse = lse_in[i];
    } else if (n == 0) {
      lse = -std::numeric_limits<T>::infinity();
    } else {
      const T mx = p.row(i).head(n).maxCoeff();
      lse = mx + std::log((p.row(i).head(n).array() - mx).exp().sum());
    }
    if (lse_out != nullptr) lse_out[i] = lse;
    if (n > 0 && std::isfinite(lse)) {
      p.row(i).head(n) = (p.row(i).head(n).array() - lse).exp().matrix();
      p.row(i).tail(sk - n).setZero();
    } else {
      p.row(i).setZero();  // a row that sees no key: out = 0, no gradient
    }
  }
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionOptions& options, const Tensor& out, const Tensor& lse) {
  dispatch_real(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t heads = q.size(0) * q.size(1), sq = q.size(2), sk = k.size(2), d = q.size(3);
    const std::int64_t group = std::max<std::int64_t>(
        1, q.size(1) / std::max<std::int64_t>(1, k.size(1)));  // query heads per key/value head
    RowMatrix<T> p(sq, sk);
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t kvh =
          h / group;  // [B, H] flattened: (b H + i) / group = b Hkv + i / group
      const ConstMatMap<T> qm(q.data<T>() + h * sq * d, sq, d);
      const ConstMatMap<T> km(k.data<T>() + kvh * sk * d, sk, d);
      const ConstMatMap<T> vm(v.data<T>() + kvh * sk * d, sk, d);
      probabilities<T>(qm, km, options, nullptr, lse.data<T>() + h * sq, p);
      MatMap<T>(out.data<T>() + h * sq * d, sq, d).noalias() = p * vm;
    }
  });
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  dispatch_real(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t heads = q.size(0) * q.size(1), sq = q.size(2), sk = k.size(2), d = q.size(3);
    const std::int64_t group =
        std::max<std::int64_t>(1, q.size(1) / std::max<std::int64_t>(1, k.size(1)));
    RowMatrix<T> p(sq, sk), ds(sq, sk);
    mat<T>(dk, dk.numel() / std::max<std::int64_t>(d, 1), d).setZero();  // summed over each group
    mat<T>(dv, dv.numel() / std::max<std::int64_t>(d, 1), d).setZero();
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t kvh = h / group;
      const ConstMatMap<T> qm(q.data<T>() + h * sq * d, sq, d);
      const ConstMatMap<T> km(k.data<T>() + kvh * sk * d, sk, d);
      const ConstMatMap<T> vm(v.data<T>() + kvh * sk * d, sk, d);
      const ConstMatMap<T> om(out.data<T>() + h * sq * d, sq, d);
      const ConstMatMap<T> dom(dout.data<T>() + h * sq * d, sq, d);
      probabilities<T>(qm, km, options, lse.data<T>() + h * sq, nullptr, p);
      // dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O)); masked entries have P = 0.
      const Eigen::Matrix<T, Eigen::Dynamic, 1> delta = dom.cwiseProduct(om).rowwise().sum();
      ds.noalias() = dom * vm.transpose();
      ds.colwise() -= delta;
      ds = ds.cwiseProduct(p);
      MatMap<T>(dv.data<T>() + kvh * sk * d, sk, d).noalias() += p.transpose() * dom;
      MatMap<T>(dq.data<T>() + h * sq * d, sq, d).noalias() = (ds * km) * T(options.scale);
      MatMap<T>(dk.data<T>() + kvh * sk * d, sk, d).noalias() +=
          (ds.transpose() * qm) * T(options.scale);
    }
  });
}

void attention_merge_(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                      const Tensor& lse_b) {
  dispatch_real(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t rows = lse.numel(), d = out.size(3);
    T* o = out.data<T>();
    T* l = lse.data<T>();
    const T* ob = out_b.data<T>();
    const T* lb = lse_b.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T a = l[r], b = lb[r];
      const T m = std::max(a, b);
      if (m == -std::numeric_limits<T>::infinity()) continue;  // neither sees a key
      const T wa = std::exp(a - m), wb = std::exp(b - m);
      const T sum = wa + wb;
      for (std::int64_t j = 0; j < d; ++j)
        o[r * d + j] = (o[r * d + j] * wa + ob[r * d + j] * wb) / sum;
      l[r] = m + std::log(sum);
    }
  });
}

}  // namespace quintet::nn::cpu_ops
