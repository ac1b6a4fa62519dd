// Embedding lookup on the GPU and its scatter-add backward (atomicAdd in f32, so repeated ids add
// up). An id outside [0, V) gives a zero row and drops its gradient: checking would synchronise.
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

template <class T, class I>
__global__ void embedding_forward_kernel(const I* ids, const T* table, T* y, std::int64_t n,
                                         std::int64_t vocab, std::int64_t dim) {
  const std::int64_t total = n * dim;
  for (std::int64_t i = global_index(); i < total; i += global_stride()) {
    const std::int64_t row = i / dim, c = i - row * dim;
    const std::int64_t id = static_cast<std::int64_t>(ids[row]);
    y[i] = (id >= 0 && id < vocab) ? table[id * dim + c] : from_float<T>(0.0f);
  }
}

template <class T, class I>
__global__ void embedding_backward_kernel(const T* dy, const I* ids, float* dtable, std::int64_t n,
                                          std::int64_t vocab, std::int64_t dim) {
  const std::int64_t total = n * dim;
  for (std::int64_t i = global_index(); i < total; i += global_stride()) {
    const std::int64_t row = i / dim, c = i - row * dim;
    const std::int64_t id = static_cast<std::int64_t>(ids[row]);
    if (id >= 0 && id < vocab) atomicAdd(dtable + id * dim + c, to_float(dy[i]));
  }
}

// Calls f(TypeTag<I>{}) for the index dtype (i32 or i64).
template <class F>
void dispatch_ids(DType dtype, F&& f) {
  if (dtype == DType::i32) {
    f(TypeTag<std::int32_t>{});
  } else {
    QUINTET_CHECK(dtype == DType::i64, "embedding: ids have dtype {}, expected i32 or i64",
                  dtype_name(dtype));
    f(TypeTag<std::int64_t>{});
  }
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y,
                       const Stream& stream) {
  const std::int64_t n = ids.numel(), vocab = table.size(0), dim = table.size(1);
  if (n == 0 || dim == 0) return;
  dispatch_compute(table.dtype(), "embedding_forward", [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    dispatch_ids(ids.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      embedding_forward_kernel<T, I><<<grid_for(n * dim), kThreads, 0, stream.handle()>>>(
          ptr<I>(ids), ptr<T>(table), ptr<T>(y), n, vocab, dim);
    });
  });
  check_launch();
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                        const Stream& stream) {
  const std::int64_t n = ids.numel(), vocab = dtable.size(0), dim = dtable.size(1);
  if (n == 0 || dim == 0) return;
  dispatch_compute(dy.dtype(), "embedding_backward", [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    dispatch_ids(ids.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      embedding_backward_kernel<T, I><<<grid_for(n * dim), kThreads, 0, stream.handle()>>>(
          ptr<T>(dy), ptr<I>(ids), ptr<float>(dtable), n, vocab, dim);
    });
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
