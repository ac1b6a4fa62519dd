// Activations on the GPU: GELU (tanh form) and SwiGLU element-wise (16-byte vectors where the sizes
// and pointers allow, one element per step otherwise), and the softmax over the last dimension
// (one block per row). All arithmetic in f32.
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
}

__device__ __forceinline__ float gelu_grad(float v) {
  const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
}

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    y[i] = from_float<T>(gelu(to_float(x[i])));
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* dy, const T* x, T* dx, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    dx[i] = from_float<T>(to_float(dy[i]) * gelu_grad(to_float(x[i])));
  }
}

template <class T>
__global__ void gelu_forward_vec_kernel(const Vec16<T>* x, Vec16<T>* y, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    const Vec16<T> a = x[i];
    Vec16<T> r;
#pragma unroll
    for (int k = 0; k < Vec16<T>::kCount; ++k) r.v[k] = from_float<T>(gelu(to_float(a.v[k])));
    y[i] = r;
  }
}

template <class T>
__global__ void gelu_backward_vec_kernel(const Vec16<T>* dy, const Vec16<T>* x, Vec16<T>* dx,
                                         std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    const Vec16<T> g = dy[i], a = x[i];
    Vec16<T> r;
#pragma unroll
    for (int k = 0; k < Vec16<T>::kCount; ++k) {
      r.v[k] = from_float<T>(to_float(g.v[k]) * gelu_grad(to_float(a.v[k])));
    }
    dx[i] = r;
  }
}

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

__device__ __forceinline__ float swiglu(float g, float u) { return g * sigmoid(g) * u; }

// d silu(g) / dg = s (1 + g (1 - s)) with s = sigmoid(g): dgate = dy u silu'(g), dup = dy silu(g).
__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float& dgate, float& dup) {
  const float s = sigmoid(g);
  dgate = d * u * s * (1.0f + g * (1.0f - s));
  dup = d * g * s;
}

template <class T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* y, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    y[i] = from_float<T>(swiglu(to_float(gate[i]), to_float(up[i])));
  }
}

template <class T>
__global__ void swiglu_forward_vec_kernel(const Vec16<T>* gate, const Vec16<T>* up, Vec16<T>* y,
                                          std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    const Vec16<T> g = gate[i], u = up[i];
    Vec16<T> r;
#pragma unroll
    for (int k = 0; k < Vec16<T>::kCount; ++k) {
      r.v[k] = from_float<T>(swiglu(to_float(g.v[k]), to_float(u.v[k])));
    }
    y[i] = r;
  }
}

template <class T>
__global__ void swiglu_backward_kernel(const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                       std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    float dg, du;
    swiglu_grad(to_float(dy[i]), to_float(gate[i]), to_float(up[i]), dg, du);
    dgate[i] = from_float<T>(dg);
    dup[i] = from_float<T>(du);
  }
}

template <class T>
__global__ void swiglu_backward_vec_kernel(const Vec16<T>* dy, const Vec16<T>* gate,
                                           const Vec16<T>* up, Vec16<T>* dgate, Vec16<T>* dup,
                                           std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    const Vec16<T> d = dy[i], g = gate[i], u = up[i];
    Vec16<T> rg, ru;
#pragma unroll
    for (int k = 0; k < Vec16<T>::kCount; ++k) {
      float a, b;
      swiglu_grad(to_float(d.v[k]), to_float(g.v[k]), to_float(u.v[k]), a, b);
      rg.v[k] = from_float<T>(a);
      ru.v[k] = from_float<T>(b);
    }
    dgate[i] = rg;
    dup[i] = ru;
  }
}

template <class T>
__global__ void softmax_forward_kernel(const T* x, T* y, std::int64_t rows, int n) {
  __shared__ float scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < n; c += blockDim.x) m = fmaxf(m, to_float(xr[c]));
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) s += expf(to_float(xr[c]) - m);
    const float inv = 1.0f / block_sum(s, scratch);
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
      y[r * n + c] = from_float<T>(expf(to_float(xr[c]) - m) * inv);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* dy, const T* y, T* dx, std::int64_t rows, int n) {
  __shared__ float scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float s = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
      s += to_float(dy[r * n + c]) * to_float(y[r * n + c]);
    }
    s = block_sum(s, scratch);
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
      const float yv = to_float(y[r * n + c]);
      dx[r * n + c] = from_float<T>(yv * (to_float(dy[r * n + c]) - s));
    }
  }
}

inline unsigned row_grid(std::int64_t rows) {
  return static_cast<unsigned>(std::min<std::int64_t>(rows, 1 << 20));
}

}  // namespace

void gelu_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  dispatch_compute(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vectorizable<T>(n, {x.data_ptr(), y.data_ptr()})) {
      const std::int64_t nv = n / Vec16<T>::kCount;
      gelu_forward_vec_kernel<T><<<grid_for(nv), kThreads, 0, stream.handle()>>>(
          reinterpret_cast<const Vec16<T>*>(ptr<T>(x)), reinterpret_cast<Vec16<T>*>(ptr<T>(y)), nv);
      return;
    }
    gelu_forward_kernel<T><<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<T>(x), ptr<T>(y), n);
  });
  check_launch();
}

void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx, const Stream& stream) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  dispatch_compute(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vectorizable<T>(n, {dy.data_ptr(), x.data_ptr(), dx.data_ptr()})) {
      const std::int64_t nv = n / Vec16<T>::kCount;
      gelu_backward_vec_kernel<T><<<grid_for(nv), kThreads, 0, stream.handle()>>>(
          reinterpret_cast<const Vec16<T>*>(ptr<T>(dy)),
          reinterpret_cast<const Vec16<T>*>(ptr<T>(x)), reinterpret_cast<Vec16<T>*>(ptr<T>(dx)),
          nv);
      return;
    }
    gelu_backward_kernel<T>
        <<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<T>(dy), ptr<T>(x), ptr<T>(dx), n);
  });
  check_launch();
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y, const Stream& stream) {
  const std::int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_compute(gate.dtype(), "swiglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vectorizable<T>(n, {gate.data_ptr(), up.data_ptr(), y.data_ptr()})) {
      const std::int64_t nv = n / Vec16<T>::kCount;
      swiglu_forward_vec_kernel<T><<<grid_for(nv), kThreads, 0, stream.handle()>>>(
          reinterpret_cast<const Vec16<T>*>(ptr<T>(gate)),
          reinterpret_cast<const Vec16<T>*>(ptr<T>(up)), reinterpret_cast<Vec16<T>*>(ptr<T>(y)),
          nv);
      return;
    }
    swiglu_forward_kernel<T>
        <<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<T>(gate), ptr<T>(up), ptr<T>(y), n);
  });
  check_launch();
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup, const Stream& stream) {
  const std::int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_compute(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vectorizable<T>(
            n, {dy.data_ptr(), gate.data_ptr(), up.data_ptr(), dgate.data_ptr(), dup.data_ptr()})) {
      const std::int64_t nv = n / Vec16<T>::kCount;
      swiglu_backward_vec_kernel<T><<<grid_for(nv), kThreads, 0, stream.handle()>>>(
          reinterpret_cast<const Vec16<T>*>(ptr<T>(dy)),
          reinterpret_cast<const Vec16<T>*>(ptr<T>(gate)),
          reinterpret_cast<const Vec16<T>*>(ptr<T>(up)), reinterpret_cast<Vec16<T>*>(ptr<T>(dgate)),
          reinterpret_cast<Vec16<T>*>(ptr<T>(dup)), nv);
      return;
    }
    swiglu_backward_kernel<T><<<grid_for(n), kThreads, 0, stream.handle()>>>(
        ptr<T>(dy), ptr<T>(gate), ptr<T>(up), ptr<T>(dgate), ptr<T>(dup), n);
  });
  check_launch();
}

void softmax_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  const std::int64_t rows = x.size(0), n = x.size(1);
  if (rows == 0 || n == 0) return;
  dispatch_compute(x.dtype(), "softmax_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_forward_kernel<T><<<row_grid(rows), row_threads(n), 0, stream.handle()>>>(
        ptr<T>(x), ptr<T>(y), rows, static_cast<int>(n));
  });
  check_launch();
}

void softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx, const Stream& stream) {
  const std::int64_t rows = y.size(0), n = y.size(1);
  if (rows == 0 || n == 0) return;
  dispatch_compute(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T><<<row_grid(rows), row_threads(n), 0, stream.handle()>>>(
        ptr<T>(dy), ptr<T>(y), ptr<T>(dx), rows, static_cast<int>(n));
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
