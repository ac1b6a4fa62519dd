// Private: helpers shared by the nn CUDA kernels (lib/nn/cuda/*.cu): scalar conversions between
// the storage dtypes and f32, warp/block reductions, grid sizing and the dtype dispatch from a
// runtime DType to a device type. C++17 (compiled by nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "quintet/core/dtype.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn::cuda_ops::detail {

using bf16 = __nv_bfloat16;

// A type carried as a value, so a generic lambda can receive "the device type of a DType".
template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T = bf16 or float for a compute dtype; others throw.
template <class F>
void dispatch_compute(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::bf16:
      f(TypeTag<bf16>{});
      return;
    case DType::f32:
      f(TypeTag<float>{});
      return;
    default:
      QUINTET_THROW(InvalidArgument, "{}: dtype {} on a GPU; the CUDA ops compute in bf16 or f32",
                    op, dtype_name(dtype));
  }
}

// Calls f(TypeTag<T>{}) with T the device type of any floating dtype (bf16, f16, f32, f64).
template <class F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::bf16:
      f(TypeTag<bf16>{});
      return;
    case DType::f16:
      f(TypeTag<__half>{});
      return;
    case DType::f32:
      f(TypeTag<float>{});
      return;
    case DType::f64:
      f(TypeTag<double>{});
      return;
    default:
      QUINTET_THROW(InvalidArgument, "{}: dtype {} is not a floating dtype", op, dtype_name(dtype));
  }
}

// Loads any storage type as float; stores float into any storage type (round to nearest even).
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(double v) { return static_cast<float>(v); }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ double from_float<double>(float v) {
  return static_cast<double>(v);
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// v reduced over the block by warp_reduce (a reduction of T over a warp, returned to every lane),
// returned to every thread (blockDim.x a multiple of 32, at most 1024). empty: the reduction's
// identity; scratch: 32 T of shared memory, safe to use again in the next call.
template <class T, class WarpReduce>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T empty, WarpReduce warp_reduce) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : empty;
  return warp_reduce(v);
}
// Sum of v over the block, returned to every thread (scratch: 32 floats of shared memory).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(v, scratch, 0.0f, [](float x) { return warp_sum(x); });
}
// Maximum of v over the block, like block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, [](float x) { return warp_max(x); });
}

// The running maximum m and sum s = sum_i exp(x_i - m) of values seen so far: the one-pass form of
// log-sum-exp (m + log s). When the maximum grows, s is rescaled by exp(m_old - m_new); two
// states merge the same way, in any order. Before any finite value (none seen, or only -inf) the
// state is m = -inf, s = 0; exponentials are taken against exp_sum_ref(m), which is 0 then, so a
// -inf adds exp(-inf) = 0 and never exp(-inf - -inf) = NaN; a NaN value keeps s NaN. Plain floats
// (not a struct with initialisers) so a block's states can sit in shared memory.
//
// The terms exp(x - m) (one per value, x - m <= 0) are __expf, ex2.approx of (x - m) log2(e),
// 3 instructions against expf's 9, which would bring a bf16 row's pass near its issue limit: the
// CUDA guide bounds its error by 2 + floor(1.173 |x - m|) ulp, so the terms that carry the sum,
// near the maximum, are within a few ulp (the sum within about 1e-6 relative, against bars of 1e-5
// on the lse in the GPU tests), and the far ones (exp(-10) and below) weigh nothing. The rescales
// and merges (a few per thread) stay expf.
struct ExpSum {
  float m;
  float s;
};
__device__ __forceinline__ ExpSum exp_sum_empty() { return ExpSum{-INFINITY, 0.0f}; }
__device__ __forceinline__ float exp_sum_ref(float m) { return m == -INFINITY ? 0.0f : m; }
// Raises a's maximum to m (no-op when m <= a.m), rescaling its sum.
__device__ __forceinline__ void exp_sum_raise(ExpSum& a, float m) {
  if (m > a.m) {
    a.s *= expf(a.m - m);
    a.m = m;
  }
}
__device__ __forceinline__ float exp_sum_term(float x, float ref) { return __expf(x - ref); }
// Adds one value x: exp(x - m) after raising m to x.
__device__ __forceinline__ void exp_sum_add(ExpSum& a, float x) {
  exp_sum_raise(a, x);
  a.s += exp_sum_term(x, exp_sum_ref(a.m));
}
__device__ __forceinline__ ExpSum exp_sum_merge(ExpSum a, ExpSum b) {
  const float m = fmaxf(a.m, b.m), r = exp_sum_ref(m);
  return ExpSum{m, a.s * expf(a.m - r) + b.s * expf(b.m - r)};
}
__device__ __forceinline__ ExpSum warp_exp_sum(ExpSum v) {
  for (int o = 16; o > 0; o >>= 1) {
    v = exp_sum_merge(
        v, ExpSum{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  }
  return v;
}
// The merged state of the block (like block_sum; scratch: 32 ExpSum of shared memory).
__device__ __forceinline__ ExpSum block_exp_sum(ExpSum v, ExpSum* scratch) {
  return block_reduce(v, scratch, exp_sum_empty(), [](ExpSum x) { return warp_exp_sum(x); });
}

constexpr int kThreads = 256;  // threads per block of the element-wise and row kernels

// Blocks for a grid-stride loop over n elements (at least 1, at most 65535 * 8).
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(blocks, 524280)));
}

// Threads per block for a kernel with one block per row of n elements: a multiple of 32 in
// [32, 1024], about one element per thread up to 4 elements per thread for long rows.
inline int row_threads(std::int64_t n) {
  const std::int64_t want = (n + 3) / 4;
  const std::int64_t t = std::min<std::int64_t>(1024, std::max<std::int64_t>(32, want));
  return static_cast<int>((t + 31) / 32 * 32);
}

// Grid-stride loop index helpers (64-bit).
__device__ __forceinline__ std::int64_t global_index() {
  return blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ std::int64_t global_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}
// The same over rows, a warp per row (blockDim.x / 32 rows a block).
__device__ __forceinline__ std::int64_t warp_row() {
  return blockIdx.x * static_cast<std::int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
}
__device__ __forceinline__ std::int64_t warp_row_stride() {
  return static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
}

// 16 bytes of T: the vectorized kernels move one per load or store (a memory-bound kernel runs at
// about half the bandwidth with 2-byte accesses). They do the same arithmetic per element as their
// scalar forms, which stay for shapes and views that do not fit.
template <class T>
struct alignas(16) Vec16 {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};
// A vector of zeros.
template <class T>
__device__ __forceinline__ Vec16<T> vec_zero() {
  Vec16<T> z;
#pragma unroll
  for (int e = 0; e < Vec16<T>::kCount; ++e) z.v[e] = from_float<T>(0.0f);
  return z;
}

// Whether p is aligned to `bytes` (a null pointer is).
inline bool aligned_to(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}
// Whether runs of n elements of T at every pointer can go as 16-byte vectors (n a multiple of the
// vector's count, every pointer 16-byte aligned; a null pointer passes).
template <class T>
bool vectorizable(std::int64_t n, std::initializer_list<const void*> pointers) {
  if (n % Vec16<T>::kCount != 0) return false;
  for (const void* p : pointers) {
    if (!aligned_to(p, 16)) return false;
  }
  return true;
}

// The number of multiprocessors of the device (sizes the grids of kernels that keep per-block
// partial sums).
inline int multiprocessors(const Device& device) {
  int n = 0;
  QUINTET_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device.index()));
  return n;
}

// The most threads a block of kernel may have on the current device: below 1024 where the
// kernel's registers per thread do not fit a block of 1024 (a launch past it fails with "too many
// resources requested"), so callers picking a block size from the data check against it.
template <class... Args>
int max_block_threads(void (*kernel)(Args...)) {
  cudaFuncAttributes a{};
  QUINTET_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  return a.maxThreadsPerBlock;
}

// Typed device pointers of a tensor (its dtype must match; checked by the dispatch).
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// Throws Cuda when the last launch failed (bad configuration, no kernel image for this GPU).
inline void check_launch() { QUINTET_CUDA_CHECK(cudaGetLastError()); }

// A row of n elements of T at p (p aligned to T): a scalar head up to the first 16-byte boundary,
// whole Vec16<T> from element head up to element end, then a scalar tail up to n.
struct RowSplit {
  std::int64_t head;
  std::int64_t vectors;
  std::int64_t end;
  std::int64_t n;
  // The scalar elements (the head's, then the tail's), and the row index of the c-th of them.
  __device__ std::int64_t scalars() const { return head + n - end; }
  __device__ std::int64_t scalar(std::int64_t c) const { return c < head ? c : end + (c - head); }
};
template <class T>
__device__ __forceinline__ RowSplit row_split(const T* p, std::int64_t n) {
  const auto misaligned = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p) & 15);
  const std::int64_t to_boundary = (16 - misaligned) % 16 / static_cast<std::int64_t>(sizeof(T));
  const std::int64_t head = to_boundary < n ? to_boundary : n;
  const std::int64_t vectors = (n - head) / Vec16<T>::kCount;
  return RowSplit{head, vectors, head + vectors * Vec16<T>::kCount, n};
}
// The same split with every element scalar (for rows whose other operands are not equally
// aligned).
__device__ __forceinline__ RowSplit row_scalars(std::int64_t n) { return RowSplit{n, 0, n, n}; }

// Adds a vector's values to a: one rescale to the vector's maximum, then one term per value.
template <class T>
__device__ __forceinline__ void exp_sum_add(ExpSum& a, const Vec16<T>& v) {
  constexpr int K = Vec16<T>::kCount;
  float x[K];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    x[k] = to_float(v.v[k]);
    mx = fmaxf(mx, x[k]);
  }
  exp_sum_raise(a, mx);
  const float r = exp_sum_ref(a.m);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) s += exp_sum_term(x[k], r);
  a.s += s;
}

}  // namespace quintet::nn::cuda_ops::detail
