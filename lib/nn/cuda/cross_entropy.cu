// Cross-entropy fused with the softmax over the vocabulary, on the GPU: one block per token row
// computes the log-sum-exp in f32 and adds its loss into the (zeroed) loss and count scalars with
// atomics; a one-thread kernel then divides. The backward reads the count from device memory, so
// nothing synchronises the host.
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

template <class I>
__device__ __forceinline__ bool is_valid_target(I t, std::int64_t ignore_index,
                                                std::int64_t vocab) {
  const std::int64_t v = static_cast<std::int64_t>(t);
  return v != ignore_index && v >= 0 && v < vocab;
}

// loss_sum and count must be zero on entry.
template <class T, class I>
__global__ void cross_entropy_forward_kernel(const T* logits, const I* targets,
                                             std::int64_t ignore_index, float* lse, float* loss_sum,
                                             float* count, std::int64_t rows, std::int64_t vocab) {
  __shared__ float scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * vocab;
    float m = -INFINITY;
    for (std::int64_t c = threadIdx.x; c < vocab; c += blockDim.x) m = fmaxf(m, to_float(x[c]));
    m = block_max(m, scratch);
    float s = 0.0f;
    for (std::int64_t c = threadIdx.x; c < vocab; c += blockDim.x) s += expf(to_float(x[c]) - m);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
      const float l = m + logf(s);
      lse[r] = l;
      const I t = targets[r];
      if (is_valid_target(t, ignore_index, vocab)) {
        atomicAdd(loss_sum, l - to_float(x[static_cast<std::int64_t>(t)]));
        atomicAdd(count, 1.0f);
      }
    }
  }
}

__global__ void cross_entropy_finish_kernel(float* loss, const float* count) {
  loss[0] = count[0] > 0.0f ? loss[0] / count[0] : 0.0f;
}

template <class T, class I>
__global__ void cross_entropy_backward_kernel(const T* logits, const I* targets, const float* lse,
                                              const float* count, float dloss,
                                              std::int64_t ignore_index, T* dlogits,
                                              std::int64_t rows, std::int64_t vocab) {
  const float scale = dloss / fmaxf(count[0], 1.0f);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const I t = targets[r];
    const bool valid = is_valid_target(t, ignore_index, vocab);
    const std::int64_t target = static_cast<std::int64_t>(t);
    const float l = lse[r];
    for (std::int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      float g = 0.0f;
      if (valid) {
        g = expf(to_float(logits[r * vocab + c]) - l);
        if (c == target) g -= 1.0f;
        g *= scale;
      }
      dlogits[r * vocab + c] = from_float<T>(g);
    }
  }
}

template <class F>
void dispatch_targets(DType dtype, F&& f) {
  if (dtype == DType::i32) {
    f(TypeTag<std::int32_t>{});
  } else {
    QUINTET_CHECK(dtype == DType::i64, "cross_entropy: targets have dtype {}, expected i32 or i64",
                  dtype_name(dtype));
    f(TypeTag<std::int64_t>{});
  }
}

inline unsigned row_grid(std::int64_t rows) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(rows, 1 << 20)));
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index,
                           const Tensor& loss, const Tensor& lse, const Tensor& valid_count,
                           const Stream& stream) {
  const std::int64_t rows = logits.size(0), vocab = logits.size(1);
  const cudaStream_t s = stream.handle();
  QUINTET_CUDA_CHECK(cudaMemsetAsync(loss.data_ptr(), 0, sizeof(float), s));
  QUINTET_CUDA_CHECK(cudaMemsetAsync(valid_count.data_ptr(), 0, sizeof(float), s));
  if (rows > 0) {
    dispatch_compute(logits.dtype(), "cross_entropy_forward", [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      dispatch_targets(targets.dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        cross_entropy_forward_kernel<T, I><<<row_grid(rows), row_threads(vocab), 0, s>>>(
            ptr<T>(logits), ptr<I>(targets), ignore_index, ptr<float>(lse), ptr<float>(loss),
            ptr<float>(valid_count), rows, vocab);
      });
    });
    check_launch();
  }
  cross_entropy_finish_kernel<<<1, 1, 0, s>>>(ptr<float>(loss), ptr<float>(valid_count));
  check_launch();
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& valid_count, float dloss, std::int64_t ignore_index,
                            const Tensor& dlogits, const Stream& stream) {
  const std::int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) return;
  dispatch_compute(logits.dtype(), "cross_entropy_backward", [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    dispatch_targets(targets.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      cross_entropy_backward_kernel<T, I>
          <<<row_grid(rows), row_threads(vocab), 0, stream.handle()>>>(
              ptr<T>(logits), ptr<I>(targets), ptr<float>(lse), ptr<float>(valid_count), dloss,
              ignore_index, ptr<T>(dlogits), rows, vocab);
    });
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
