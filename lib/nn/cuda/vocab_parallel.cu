// The vocabulary-parallel ops on the GPU (quintet/nn/vocab_parallel_ops.hpp): masked embedding
// lookup and scatter-add into one table shard, and the split-vocabulary cross-entropy (also the
// whole vocabulary's, as one shard: cross_entropy_forward in lib/nn/ops_train.cpp). The
// partials and backward kernels run one block per token row and read it once, as 16-byte vectors
// (the partials keep an online max and sum of exp, in f32); the combine runs one thread per row
// and adds the loss and count with atomics; nothing synchronises the host.
#include "nn/cuda/kernel_common.cuh"
#include "nn/vocab_parallel_impl.hpp"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

template <class F>
void dispatch_index(DType dtype, const char* op, F&& f) {
  if (dtype == DType::i32) {
    f(TypeTag<std::int32_t>{});
  } else {
    QUINTET_CHECK(dtype == DType::i64, "{}: indices have dtype {}, expected i32 or i64", op,
                  dtype_name(dtype));
    f(TypeTag<std::int64_t>{});
  }
}

__device__ __forceinline__ bool valid_target(std::int64_t t, std::int64_t ignore_index,
                                             std::int64_t vocab_size) {
  return t != ignore_index && t >= 0 && t < vocab_size;
}

template <class T, class I>
__global__ void vp_embedding_forward_kernel(const I* ids, const T* table, T* y, std::int64_t n,
                                            std::int64_t rows, std::int64_t dim,
                                            std::int64_t vocab_start) {
  const std::int64_t total = n * dim;
  for (std::int64_t i = global_index(); i < total; i += global_stride()) {
    const std::int64_t row = i / dim, c = i - row * dim;
    const std::int64_t local = static_cast<std::int64_t>(ids[row]) - vocab_start;
    y[i] = (local >= 0 && local < rows) ? table[local * dim + c] : from_float<T>(0.0f);
  }
}

template <class T, class I>
__global__ void vp_embedding_backward_kernel(const T* dy, const I* ids, float* dtable,
                                             std::int64_t n, std::int64_t rows, std::int64_t dim,
                                             std::int64_t vocab_start) {
  const std::int64_t total = n * dim;
  for (std::int64_t i = global_index(); i < total; i += global_stride()) {
    const std::int64_t row = i / dim, c = i - row * dim;
    const std::int64_t local = static_cast<std::int64_t>(ids[row]) - vocab_start;
    if (local >= 0 && local < rows) atomicAdd(dtable + local * dim + c, to_float(dy[i]));
  }
}

// The row kernels of the cross-entropy read each row once as 16-byte vectors (its body between
// a scalar head up to a 16-byte boundary and a scalar tail), kCeUnroll vectors in flight per
// thread; about two vectors a thread up to kCeThreads. A 50k-entry bf16 row is 6288 vectors, 24
// or 25 a thread; at under 64 registers a thread, four blocks (rows) share a multiprocessor, 64 KB
// of loads in flight, and one row's closing block reduction overlaps the other rows' loads.
constexpr int kCeThreads = 256;
constexpr int kCeUnroll = 4;

template <class T>
int ce_threads(std::int64_t local) {
  const std::int64_t want = (local / Vec16<T>::kCount + 1) / 2;
  const std::int64_t t = std::min<std::int64_t>(kCeThreads, std::max<std::int64_t>(32, want));
  return static_cast<int>((t + 31) / 32 * 32);
}

// Calls f(j, vector j) for this thread's vectors of xv[0, vectors), loading kCeUnroll of them
// before using any.
template <class T, class F>
__device__ __forceinline__ void for_each_vector(const Vec16<T>* xv, std::int64_t vectors, F&& f) {
  for (std::int64_t i = threadIdx.x; i < vectors; i += kCeUnroll * blockDim.x) {
    Vec16<T> a[kCeUnroll];
#pragma unroll
    for (int u = 0; u < kCeUnroll; ++u) {
      if (i + u * blockDim.x < vectors) a[u] = xv[i + u * blockDim.x];
    }
#pragma unroll
    for (int u = 0; u < kCeUnroll; ++u) {
      if (i + u * blockDim.x < vectors) f(i + u * blockDim.x, a[u]);
    }
  }
}

// One pass over each row: every thread keeps the online (max, sum of exp) of its elements, and
// the block merges them (-inf values add 0; a row of only -inf gives max -inf, sum 0).
template <class T, class I>
__global__ void __launch_bounds__(kCeThreads)
    vp_ce_partials_kernel(const T* logits, const I* targets, float* partials, std::int64_t n,
                          std::int64_t local, std::int64_t vocab_start, std::int64_t vocab_size,
                          std::int64_t ignore_index) {
  __shared__ ExpSum scratch[32];
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* x = logits + r * local;
    const RowSplit sp = row_split(x, local);
    const auto* xv = reinterpret_cast<const Vec16<T>*>(x + sp.head);
    ExpSum st = exp_sum_empty();
    for_each_vector(xv, sp.vectors, [&](std::int64_t, const Vec16<T>& v) { exp_sum_add(st, v); });
    for (std::int64_t c = threadIdx.x; c < sp.scalars(); c += blockDim.x) {
      exp_sum_add(st, to_float(x[sp.scalar(c)]));
    }
    st = block_exp_sum(st, scratch);
    if (threadIdx.x == 0) {
      const std::int64_t t = static_cast<std::int64_t>(targets[r]);
      const std::int64_t lt = t - vocab_start;
      const bool here = valid_target(t, ignore_index, vocab_size) && lt >= 0 && lt < local;
      partials[r] = st.m;
      partials[n + r] = st.s;
      partials[2 * n + r] = here ? to_float(x[lt]) : 0.0f;
    }
  }
}

// loss_sum and count must be zero on entry.
template <class I>
__global__ void vp_ce_combine_kernel(const float* g, const I* targets, float* lse, float* loss_sum,
                                     float* count, std::int64_t shards, std::int64_t n,
                                     std::int64_t vocab_size, std::int64_t ignore_index) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    float m = -INFINITY;
    for (std::int64_t r = 0; r < shards; ++r) m = fmaxf(m, g[r * 3 * n + i]);
    float s = 0.0f, tl = 0.0f;
    for (std::int64_t r = 0; r < shards; ++r) {
      const float* p = g + r * 3 * n;
      s += p[n + i] * expf(p[i] - m);
      tl += p[2 * n + i];
    }
    const float l = m + logf(s);
    lse[i] = l;
    if (valid_target(static_cast<std::int64_t>(targets[i]), ignore_index, vocab_size)) {
      atomicAdd(loss_sum, l - tl);
      atomicAdd(count, 1.0f);
    }
  }
}

__global__ void vp_ce_finish_kernel(float* loss, const float* count) {
  loss[0] = count[0] > 0.0f ? loss[0] / count[0] : 0.0f;
}

// dlogits = scale (exp(logit - lse) - onehot) per element, as 16-byte vectors where logits and
// dlogits are equally aligned (same_alignment; each row is then split the same way), else scalar.
// Ignored rows are written as zeros without reading their logits.
template <class T, class I>
__global__ void __launch_bounds__(kCeThreads)
    vp_ce_backward_kernel(const T* logits, const I* targets, const float* lse, const float* count,
                          float dloss, T* dlogits, std::int64_t n, std::int64_t local,
                          std::int64_t vocab_start, std::int64_t vocab_size,
                          std::int64_t ignore_index, bool same_alignment) {
  constexpr int K = Vec16<T>::kCount;
  const float scale = dloss / fmaxf(count[0], 1.0f);
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const std::int64_t t = static_cast<std::int64_t>(targets[r]);
    const bool valid = valid_target(t, ignore_index, vocab_size);
    const std::int64_t lt = t - vocab_start;
    const float l = lse[r];
    const T* x = logits + r * local;
    T* y = dlogits + r * local;
    const RowSplit sp = same_alignment ? row_split(x, local) : row_scalars(local);
    const auto* xv = reinterpret_cast<const Vec16<T>*>(x + sp.head);
    auto* yv = reinterpret_cast<Vec16<T>*>(y + sp.head);
    auto grad = [&](float v, bool target) {
      float g = expf(v - l);
      if (target) g -= 1.0f;
      return from_float<T>(g * scale);
    };
    if (valid) {
      for_each_vector(xv, sp.vectors, [&](std::int64_t j, const Vec16<T>& v) {
        const std::int64_t at = lt - (sp.head + j * K);  // the target's place in the vector
        const int tk = at >= 0 && at < K ? static_cast<int>(at) : -1;
        Vec16<T> o;
#pragma unroll
        for (int k = 0; k < K; ++k) o.v[k] = grad(to_float(v.v[k]), k == tk);
        yv[j] = o;
      });
      for (std::int64_t c = threadIdx.x; c < sp.scalars(); c += blockDim.x) {
        const std::int64_t e = sp.scalar(c);
        y[e] = grad(to_float(x[e]), e == lt);
      }
    } else {
      const Vec16<T> zero = vec_zero<T>();
      for (std::int64_t i = threadIdx.x; i < sp.vectors; i += blockDim.x) yv[i] = zero;
      for (std::int64_t c = threadIdx.x; c < sp.scalars(); c += blockDim.x) {
        y[sp.scalar(c)] = from_float<T>(0.0f);
      }
    }
  }
}

inline unsigned rows_grid(std::int64_t rows) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(rows, 1 << 20)));
}

}  // namespace

void vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table,
                                      std::int64_t vocab_start, std::int64_t vocab_size,
                                      const Tensor& y, const Stream& stream) {
  (void)vocab_size;  // out-of-vocabulary ids fall outside every shard: zero rows
  const std::int64_t n = ids.numel(), rows = table.size(0), dim = table.size(1);
  if (n == 0 || dim == 0) return;
  const char* op = "vocab_parallel_embedding_forward";
  dispatch_compute(table.dtype(), op, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    dispatch_index(ids.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      vp_embedding_forward_kernel<T, I><<<grid_for(n * dim), kThreads, 0, stream.handle()>>>(
          ptr<I>(ids), ptr<T>(table), ptr<T>(y), n, rows, dim, vocab_start);
    });
  });
  check_launch();
}

void vocab_parallel_embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                                       std::int64_t vocab_start, const Stream& stream) {
  const std::int64_t n = ids.numel(), rows = dtable.size(0), dim = dtable.size(1);
  if (n == 0 || dim == 0) return;
  const char* op = "vocab_parallel_embedding_backward";
  dispatch_compute(dy.dtype(), op, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    dispatch_index(ids.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      vp_embedding_backward_kernel<T, I><<<grid_for(n * dim), kThreads, 0, stream.handle()>>>(
          ptr<T>(dy), ptr<I>(ids), ptr<float>(dtable), n, rows, dim, vocab_start);
    });
  });
  check_launch();
}

void vocab_parallel_ce_partials(const Tensor& logits, const Tensor& targets,
                                std::int64_t vocab_start, std::int64_t vocab_size,
                                std::int64_t ignore_index, const Tensor& partials,
                                const Stream& stream) {
  const std::int64_t n = logits.size(0), local = logits.size(1);
  if (n == 0) return;
  const char* op = "vocab_parallel_ce_partials";
  dispatch_compute(logits.dtype(), op, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    dispatch_index(targets.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      vp_ce_partials_kernel<T, I><<<rows_grid(n), ce_threads<T>(local), 0, stream.handle()>>>(
          ptr<T>(logits), ptr<I>(targets), ptr<float>(partials), n, local, vocab_start, vocab_size,
          ignore_index);
    });
  });
  check_launch();
}

void vocab_parallel_ce_combine(const Tensor& gathered, const Tensor& targets,
                               std::int64_t vocab_size, std::int64_t ignore_index,
                               const Tensor& loss, const Tensor& lse, const Tensor& valid_count,
                               const Stream& stream) {
  const std::int64_t shards = gathered.size(0), n = gathered.size(2);
  const cudaStream_t s = stream.handle();
  QUINTET_CUDA_CHECK(cudaMemsetAsync(loss.data_ptr(), 0, sizeof(float), s));
  QUINTET_CUDA_CHECK(cudaMemsetAsync(valid_count.data_ptr(), 0, sizeof(float), s));
  if (n > 0) {
    dispatch_index(targets.dtype(), "vocab_parallel_ce_combine", [&](auto itag) {
      using I = typename decltype(itag)::type;
      vp_ce_combine_kernel<I><<<grid_for(n), kThreads, 0, s>>>(
          ptr<float>(gathered), ptr<I>(targets), ptr<float>(lse), ptr<float>(loss),
          ptr<float>(valid_count), shards, n, vocab_size, ignore_index);
    });
    check_launch();
  }
  vp_ce_finish_kernel<<<1, 1, 0, s>>>(ptr<float>(loss), ptr<float>(valid_count));
  check_launch();
}

void vocab_parallel_ce_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& valid_count, float dloss, std::int64_t vocab_start,
                                std::int64_t vocab_size, std::int64_t ignore_index,
                                const Tensor& dlogits, const Stream& stream) {
  const std::int64_t n = logits.size(0), local = logits.size(1);
  if (n == 0) return;
  const char* op = "vocab_parallel_ce_backward";
  dispatch_compute(logits.dtype(), op, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    dispatch_index(targets.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      const auto gap = reinterpret_cast<std::uintptr_t>(logits.data_ptr()) -
                       reinterpret_cast<std::uintptr_t>(dlogits.data_ptr());
      vp_ce_backward_kernel<T, I><<<rows_grid(n), ce_threads<T>(local), 0, stream.handle()>>>(
          ptr<T>(logits), ptr<I>(targets), ptr<float>(lse), ptr<float>(valid_count), dloss,
          ptr<T>(dlogits), n, local, vocab_start, vocab_size, ignore_index, gap % 16 == 0);
    });
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
