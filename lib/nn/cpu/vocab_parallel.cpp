// CPU implementations of the vocabulary-parallel ops (quintet/nn/vocab_parallel_ops.hpp): the
// masked embedding of one table shard and the cross-entropy of a split vocabulary (also the
// whole vocabulary's, as one shard: cross_entropy_forward), computed in double per row.
#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/cpu/cpu_common.hpp"
#include "nn/vocab_parallel_impl.hpp"

namespace quintet::nn::cpu_ops {

namespace {

std::int64_t id_of(const Tensor& ids, std::int64_t i) {
  return ids.dtype() == DType::i32 ? ids.data<std::int32_t>()[i] : ids.data<std::int64_t>()[i];
}

}  // namespace

void vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table,
                                      std::int64_t vocab_start, std::int64_t vocab_size,
                                      const Tensor& y) {
  const std::int64_t n = ids.numel(), rows = table.size(0), d = table.size(1);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t id = id_of(ids, i);
    QUINTET_CHECK(id >= 0 && id < vocab_size,
                  "vocab_parallel_embedding_forward: ids[{}] = {} is outside the vocabulary [0, "
                  "{})",
                  i, id, vocab_size);
  }
  dispatch_real(table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t local = id_of(ids, i) - vocab_start;
      T* out = y.data<T>() + i * d;
      if (local >= 0 && local < rows) {
        std::copy_n(table.data<T>() + local * d, d, out);
      } else {
        std::fill_n(out, d, T(0));
      }
    }
  });
}

void vocab_parallel_embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                                       std::int64_t vocab_start) {
  const std::int64_t n = ids.numel(), rows = dtable.size(0), d = dtable.size(1);
  dispatch_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t local = id_of(ids, i) - vocab_start;
      if (local < 0 || local >= rows) continue;
      T* dst = dtable.data<T>() + local * d;
      const T* src = dy.data<T>() + i * d;
      for (std::int64_t j = 0; j < d; ++j) dst[j] += src[j];
    }
  });
}

void vocab_parallel_ce_partials(const char* op, const Tensor& logits, const Tensor& targets,
                                std::int64_t vocab_start, std::int64_t vocab_size,
                                std::int64_t ignore_index, const Tensor& partials) {
  const std::int64_t n = logits.size(0), local = logits.size(1);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = id_of(targets, i);
    QUINTET_CHECK(t == ignore_index || (t >= 0 && t < vocab_size),
                  "{}: targets[{}] = {} is outside the vocabulary [0, {}) and is not the ignore "
                  "index {}",
                  op, i, t, vocab_size, ignore_index);
  }
  dispatch_real(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = partials.data<T>();
    for (std::int64_t i = 0; i < n; ++i) {
      const T* row = logits.data<T>() + i * local;
      const T mx = *std::max_element(row, row + local);
      // A shard whose row is all -inf (masked) has max -inf and sum 0, which the combine weighs
      // by exp(-inf) = 0; exp(-inf - -inf) would be NaN and poison the whole row's loss.
      double sum = 0.0;
      if (!(std::isinf(mx) && mx < 0)) {
        for (std::int64_t j = 0; j < local; ++j) sum += std::exp(double(row[j]) - mx);
      }
      const std::int64_t t = id_of(targets, i) - vocab_start;
      p[i] = mx;
      p[n + i] = T(sum);
      p[2 * n + i] = (id_of(targets, i) != ignore_index && t >= 0 && t < local) ? row[t] : T(0);
    }
  });
}

void vocab_parallel_ce_combine(const Tensor& gathered, const Tensor& targets,
                               std::int64_t vocab_size, std::int64_t ignore_index,
                               const Tensor& loss, const Tensor& lse, const Tensor& valid_count) {
  const std::int64_t shards = gathered.size(0), n = gathered.size(2);
  dispatch_real(gathered.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = gathered.data<T>();
    double total = 0.0;
    std::int64_t count = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double mx = -std::numeric_limits<double>::infinity(), target_logit = 0.0;
      for (std::int64_t r = 0; r < shards; ++r) mx = std::max(mx, double(g[r * 3 * n + i]));
      double sum = 0.0;
      for (std::int64_t r = 0; r < shards; ++r) {
        const T* p = g + r * 3 * n;
        sum += double(p[n + i]) * std::exp(double(p[i]) - mx);
        target_logit += double(p[2 * n + i]);
      }
      const double l = mx + std::log(sum);
      lse.data<T>()[i] = T(l);
      const std::int64_t t = id_of(targets, i);
      if (t == ignore_index || t < 0 || t >= vocab_size) continue;
      total += l - target_logit;
      ++count;
    }
    loss.data<T>()[0] = count > 0 ? T(total / double(count)) : T(0);
    valid_count.data<T>()[0] = T(count);
  });
}

void vocab_parallel_ce_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& valid_count, float dloss, std::int64_t vocab_start,
                                std::int64_t vocab_size, std::int64_t ignore_index,
                                const Tensor& dlogits) {
  const std::int64_t n = logits.size(0), local = logits.size(1);
  dispatch_real(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const double g = double(dloss) / std::max<double>(valid_count.data<T>()[0], 1.0);
    for (std::int64_t i = 0; i < n; ++i) {
      const T* row = logits.data<T>() + i * local;
      T* drow = dlogits.data<T>() + i * local;
      const std::int64_t target = id_of(targets, i);
      if (target == ignore_index || target < 0 || target >= vocab_size) {
        std::fill_n(drow, local, T(0));
        continue;
      }
      const double l = lse.data<T>()[i];
      for (std::int64_t j = 0; j < local; ++j) drow[j] = T(g * std::exp(double(row[j]) - l));
      const std::int64_t t = target - vocab_start;
      if (t >= 0 && t < local) drow[t] -= T(g);
    }
  });
}

}  // namespace quintet::nn::cpu_ops
