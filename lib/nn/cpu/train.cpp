// CPU training ops: embedding gather/scatter-add, the AdamW update, element-wise arithmetic and
// sums of squares (the cross-entropy is vocab_parallel.cpp's, over one shard).
#include <algorithm>
#include <cmath>

#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"

namespace quintet::nn::cpu_ops {

namespace {
// ids as int64 values (i32 or i64 storage).
std::int64_t id_at(const Tensor& ids, std::int64_t i) {
  return ids.dtype() == DType::i32 ? ids.data<std::int32_t>()[i] : ids.data<std::int64_t>()[i];
}

// Every id must index a row of a table of `vocab` rows; checked before anything is written.
void check_ids(const char* op, const Tensor& ids, std::int64_t vocab) {
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    const std::int64_t id = id_at(ids, i);
    QUINTET_CHECK(id >= 0 && id < vocab,
                  "{}: ids[{}] = {} is outside the table's vocabulary [0, {})", op, i, id, vocab);
  }
}
}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y) {
  const std::int64_t n = ids.numel(), d = table.size(1);
  check_ids("embedding_forward", ids, table.size(0));
  dispatch_real(table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t i = 0; i < n; ++i) {
      std::copy_n(table.data<T>() + id_at(ids, i) * d, d, y.data<T>() + i * d);
    }
  });
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable) {
  const std::int64_t n = ids.numel(), d = dtable.size(1);
  check_ids("embedding_backward", ids, dtable.size(0));
  dispatch_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t i = 0; i < n; ++i) {
      T* row = dtable.data<T>() + id_at(ids, i) * d;
      const T* g = dy.data<T>() + i * d;
      for (std::int64_t j = 0; j < d; ++j) row[j] += g[j];
    }
  });
}

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWHyper& h, std::int64_t step, float grad_scale,
                const Tensor& param) {
  dispatch_real(master.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T bc1 = T(1.0 - std::pow(double(h.beta1), double(step)));
    const T bc2 = T(1.0 - std::pow(double(h.beta2), double(step)));
    const T lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
    T* p = master.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    const T* g = grad.data<T>();
    for (std::int64_t i = 0; i < master.numel(); ++i) {
      const T gi = g[i] * T(grad_scale);
      p[i] -= lr * wd * p[i];
      m[i] = b1 * m[i] + (T(1) - b1) * gi;
      v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
      p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
    }
  });
  if (param.defined()) {
    Tensor(param).copy_(master.to(param.dtype()));
  }
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_real(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    T* o = out.data<T>();
    for (std::int64_t i = 0; i < a.numel(); ++i) o[i] = ap[i] + bp[i];
  });
}

void add_(const Tensor& dst, const Tensor& src, float alpha) {
  dispatch_real(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* d = dst.data<T>();
    const T* s = src.data<T>();
    for (std::int64_t i = 0; i < dst.numel(); ++i) d[i] += T(alpha) * s[i];
  });
}

void scale(const Tensor& x, float alpha, const Tensor& out) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* o = out.data<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) o[i] = T(alpha) * xp[i];
  });
}

double sum_of_squares(const Tensor& x) {
  double sum = 0.0;
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* p = static_cast<const S*>(x.data_ptr());
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double v = convert_scalar<double>(p[i]);
      sum += v * v;
    }
  });
  return sum;
}

}  // namespace quintet::nn::cpu_ops
