// Element-wise arithmetic on the GPU (add, in-place add with a scale, scale) and the sum of
// squares of a tensor, reduced on the GPU into a device scalar (no host synchronisation).
#include <type_traits>

#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"
#include "nn/cuda/multi_tensor.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  }
}

template <class D, class S>
__global__ void add_inplace_kernel(D* dst, const S* src, float alpha, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    dst[i] = from_float<D>(to_float(dst[i]) + alpha * to_float(src[i]));
  }
}

template <class T>
__global__ void scale_kernel(const T* x, float alpha, T* out, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    out[i] = from_float<T>(alpha * to_float(x[i]));
  }
}

// out[0] += sum(x²): a block sum, then one atomic per block. kVectors: the list counts 16-byte
// vectors of T (each entry's size a multiple of their count, its data aligned), else elements.
template <class T, bool kVectors>
__global__ void sum_of_squares_kernel(TensorList<const void*> list, std::int64_t total,
                                      float* out) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for_each_element(list, total, [&](int t, std::int64_t i) {
    if constexpr (kVectors) {
      const Vec16<T> x = static_cast<const Vec16<T>*>(list.entry[t])[i];
#pragma unroll
      for (int e = 0; e < Vec16<T>::kCount; ++e) {
        const float v = to_float(x.v[e]);
        s += v * v;
      }
    } else {
      const float v = to_float(static_cast<const T*>(list.entry[t])[i]);
      s += v * v;
    }
  });
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out, const Stream& stream) {
  const std::int64_t n = a.numel();
  if (n == 0) return;
  dispatch_compute(a.dtype(), "add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_kernel<T>
        <<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<T>(a), ptr<T>(b), ptr<T>(out), n);
  });
  check_launch();
}

void add_(const Tensor& dst, const Tensor& src, float alpha, const Stream& stream) {
  const std::int64_t n = src.numel();
  if (n == 0) return;
  dispatch_compute(src.dtype(), "add_", [&](auto stag) {
    using S = typename decltype(stag)::type;
    dispatch_compute(dst.dtype(), "add_", [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      add_inplace_kernel<D, S>
          <<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<D>(dst), ptr<S>(src), alpha, n);
    });
  });
  check_launch();
}

void scale(const Tensor& x, float alpha, const Tensor& out, const Stream& stream) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  dispatch_compute(x.dtype(), "scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_kernel<T>
        <<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<T>(x), alpha, ptr<T>(out), n);
  });
  check_launch();
}

void sum_of_squares(const std::vector<Tensor>& xs, const Tensor& out, const Stream& stream) {
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    std::vector<const void*> entries;
    std::vector<std::int64_t> numel;
    for (const Tensor& x : xs) {
      if (x.dtype() != dtype) continue;
      entries.push_back(x.data_ptr());
      numel.push_back(x.numel());
    }
    if (entries.empty()) continue;
    dispatch_float(dtype, "sum_of_squares", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto launch = [&](auto vectors) {
        return [&](const TensorList<const void*>& list, std::int64_t n) {
          sum_of_squares_kernel<T, decltype(vectors)::value>
              <<<chunk_blocks(n), kThreads, 0, stream.handle()>>>(list, n, ptr<float>(out));
          check_launch();
        };
      };
      for_each_tensor_list_grouped(
          entries, numel, Vec16<T>::kCount, [](const void* p) { return aligned_to(p, 16); },
          launch(std::true_type{}), launch(std::false_type{}));
    });
  }
}

}  // namespace quintet::nn::cuda_ops
