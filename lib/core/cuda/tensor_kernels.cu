// CUDA element-wise kernels behind Tensor: strided copy with conversion, fill, random fill.
// Built with --fmad=false (see CMakeLists.txt) so that random draws equal the CPU's bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/internal/tensor_kernels.hpp"
#include "quintet/core/philox.hpp"

namespace quintet::detail {

namespace {

constexpr int kMaxDims = 8;

// Shape and strides passed by value to kernels.
struct StridedLayout {
  int ndim;
  std::int64_t size[kMaxDims];
  std::int64_t dst_stride[kMaxDims];
  std::int64_t src_stride[kMaxDims];
};

// Device-side scalar types matching our host DTypes.
template <class T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceType<Half> {
  using type = __half;
};

template <class T>
__device__ inline float to_f(T v) {
  return static_cast<float>(v);
}
template <>
__device__ inline float to_f(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ inline float to_f(__half v) {
  return __half2float(v);
}

// Conversion on the device with the host's rules (through float for the 16-bit formats,
// round to nearest even, C++ truncation for integers).
template <class D, class S>
__device__ inline D convert_dev(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    return __float2bfloat16_rn(to_f(v));  // through float, as the host does
  } else if constexpr (std::is_same_v<D, __half>) {
    return __float2half_rn(to_f(v));
  } else if constexpr (std::is_same_v<S, __nv_bfloat16> || std::is_same_v<S, __half>) {
    return static_cast<D>(to_f(v));
  } else {
    return static_cast<D>(v);
  }
}

__device__ inline void offsets_of(const StridedLayout& l, std::int64_t i, std::int64_t& d,
                                  std::int64_t& s) {
  d = 0;
  s = 0;
  for (int k = l.ndim - 1; k >= 0; --k) {
    const std::int64_t c = i % l.size[k];
    i /= l.size[k];
    d += c * l.dst_stride[k];
    s += c * l.src_stride[k];
  }
}

template <class D, class S>
__global__ void copy_convert_kernel(D* dst, const S* src, StridedLayout l, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t d, s;
    offsets_of(l, i, d, s);
    dst[d] = convert_dev<D>(src[s]);
  }
}

template <class D, class S>
__global__ void copy_convert_contiguous_kernel(D* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = convert_dev<D>(src[i]);
  }
}

// A strided copy of 16-byte vectors (same dtype both sides): l is in units of vectors, its last
// dimension contiguous on both sides. One index computation per vector instead of per element.
__global__ void copy_vectors_kernel(uint4* dst, const uint4* src, StridedLayout l, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t d, s;
    offsets_of(l, i, d, s);
    dst[d] = src[s];
  }
}

template <class T>
__global__ void fill_kernel(T* dst, T value, StridedLayout l, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t d, s;
    offsets_of(l, i, d, s);
    dst[d] = value;
  }
}

// l.src_stride holds the full tensor's contiguous strides: s is the flat index in the full draw.
template <class T>
__global__ void random_kernel(T* dst, StridedLayout l, std::int64_t n, std::int64_t base,
                              RandomKey key, bool uniform, float lo, float hi) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t d, g;
    offsets_of(l, i, d, g);
    const auto w =
        philox::draw(key.seed, key.stream_id, key.offset + static_cast<std::uint64_t>(base + g));
    const float x = uniform ? lo + (hi - lo) * philox::uniform01(w.v[0])
                            : lo + hi * philox::normal(w.v[0], w.v[1]);
    dst[d] = convert_dev<T>(x);
  }
}

__global__ void philox_words_kernel(std::uint32_t* out, RandomKey key, std::uint64_t count) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const auto w = philox::draw(key.seed, key.stream_id, key.offset + i);
    for (int k = 0; k < 4; ++k) out[4 * i + k] = w.v[k];
  }
}

StridedLayout make_layout(const Shape& shape, const Shape& dst_strides, const Shape& src_strides) {
  QUINTET_CHECK(shape.size() <= static_cast<std::size_t>(kMaxDims),
                "CUDA tensor kernels support at most {} dimensions, got {}", kMaxDims,
                shape.size());
  StridedLayout l{};
  l.ndim = static_cast<int>(shape.size());
  for (int k = 0; k < l.ndim; ++k) {
    l.size[k] = shape[k];
    l.dst_stride[k] = dst_strides[k];
    l.src_stride[k] = src_strides[k];
  }
  return l;
}

// The same element order with fewer dimensions: size-1 dimensions dropped, and a dimension merged
// into the next when both sides step over it as one run (stride = next size x next stride). Fewer
// dimensions is less index arithmetic per element.
StridedLayout simplified(const StridedLayout& in) {
  StridedLayout out{};
  for (int k = 0; k < in.ndim; ++k) {
    if (in.size[k] == 1) continue;
    const int j = out.ndim - 1;
    if (j >= 0 && out.dst_stride[j] == in.size[k] * in.dst_stride[k] &&
        out.src_stride[j] == in.size[k] * in.src_stride[k]) {
      out.size[j] *= in.size[k];
      out.dst_stride[j] = in.dst_stride[k];
      out.src_stride[j] = in.src_stride[k];
      continue;
    }
    out.size[out.ndim] = in.size[k];
    out.dst_stride[out.ndim] = in.dst_stride[k];
    out.src_stride[out.ndim] = in.src_stride[k];
    ++out.ndim;
  }
  if (out.ndim == 0) {  // a single element
    out.ndim = 1;
    out.size[0] = 1;
    out.dst_stride[0] = 1;
    out.src_stride[0] = 1;
  }
  return out;
}

// l (simplified, in elements of `bytes` each) in units of 16-byte vectors, when its last dimension
// is contiguous on both sides and every stride, the last size and both pointers allow it.
bool as_vectors(const StridedLayout& l, std::size_t bytes, const void* dst, const void* src,
                StridedLayout* out) {
  const std::int64_t per = static_cast<std::int64_t>(16 / bytes);
  if (16 % bytes != 0 || per <= 1) return false;
  const int last = l.ndim - 1;
  if (l.dst_stride[last] != 1 || l.src_stride[last] != 1 || l.size[last] % per != 0) return false;
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(src) % 16 != 0) {
    return false;
  }
  for (int k = 0; k < last; ++k) {
    if (l.dst_stride[k] % per != 0 || l.src_stride[k] % per != 0) return false;
  }
  *out = l;
  out->size[last] /= per;
  for (int k = 0; k < last; ++k) {
    out->dst_stride[k] /= per;
    out->src_stride[k] /= per;
  }
  return true;
}

unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

template <class T>
using dev_t = typename DeviceType<T>::type;

}  // namespace

void cuda_copy_convert(const Tensor& dst, const Tensor& src, cudaStream_t stream) {
  const std::int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                       cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const bool contiguous = dst.is_contiguous() && src.is_contiguous();
  const StridedLayout l = simplified(make_layout(dst.shape(), dst.strides(), src.strides()));
  if (!contiguous && dst.dtype() == src.dtype()) {
    StridedLayout v;
    if (as_vectors(l, dtype_size(dst.dtype()), dst.data_ptr(), src.data_ptr(), &v)) {
      const std::int64_t vectors = n * static_cast<std::int64_t>(dtype_size(dst.dtype())) / 16;
      copy_vectors_kernel<<<grid_for(vectors), 256, 0, stream>>>(
          static_cast<uint4*>(dst.data_ptr()), static_cast<const uint4*>(src.data_ptr()), v,
          vectors);
      QUINTET_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  dispatch_dtype(dst.dtype(), [&](auto dtag) {
    using D = dev_t<decltype(dtag)>;
    dispatch_dtype(src.dtype(), [&](auto stag) {
      using S = dev_t<decltype(stag)>;
      auto* d = static_cast<D*>(dst.data_ptr());
      const auto* s = static_cast<const S*>(src.data_ptr());
      if (contiguous) {
        copy_convert_contiguous_kernel<D, S><<<grid_for(n), 256, 0, stream>>>(d, s, n);
      } else {
        copy_convert_kernel<D, S><<<grid_for(n), 256, 0, stream>>>(d, s, l, n);
      }
    });
  });
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

void cuda_fill(const Tensor& dst, double value, cudaStream_t stream) {
  const std::int64_t n = dst.numel();
  const StridedLayout l = simplified(make_layout(dst.shape(), dst.strides(), dst.strides()));
  dispatch_dtype(dst.dtype(), [&](auto tag) {
    using H = decltype(tag);
    using D = dev_t<H>;
    const H host_value = convert_scalar<H>(value);
    D v;
    static_assert(sizeof(D) == sizeof(H));
    __builtin_memcpy(&v, &host_value, sizeof v);
    // Zeros of a contiguous tensor (every gradient buffer at a step's start) through the copy
    // engine's memset, at the memory's rate; the kernel stores one element per thread.
    unsigned char bytes[sizeof v];
    __builtin_memcpy(bytes, &v, sizeof v);
    bool zero_bytes = true;
    for (const unsigned char b : bytes) zero_bytes = zero_bytes && b == 0;
    if (zero_bytes && dst.is_contiguous()) {
      QUINTET_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream));
      return;
    }
    fill_kernel<D><<<grid_for(n), 256, 0, stream>>>(static_cast<D*>(dst.data_ptr()), v, l, n);
  });
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

void cuda_fill_random(const Tensor& dst, const RandomKey& key, Distribution dist, float lo,
                      float hi, const RandomRegion& region, cudaStream_t stream) {
  const std::int64_t n = dst.numel();
  const Shape full_strides = contiguous_strides(region.full_shape);
  std::int64_t base = 0;
  for (std::size_t k = 0; k < region.start.size(); ++k) base += region.start[k] * full_strides[k];
  const StridedLayout l = make_layout(dst.shape(), dst.strides(), full_strides);
  const bool uniform = dist == Distribution::uniform;
  dispatch_dtype(dst.dtype(), [&](auto tag) {
    using D = dev_t<decltype(tag)>;
    if constexpr (std::is_floating_point_v<D> || std::is_same_v<D, __nv_bfloat16> ||
                  std::is_same_v<D, __half>) {
      random_kernel<D><<<grid_for(n), 256, 0, stream>>>(static_cast<D*>(dst.data_ptr()), l, n, base,
                                                        key, uniform, lo, hi);
    }
  });
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

void cuda_philox_words(std::uint32_t* out, const RandomKey& key, std::uint64_t count,
                       cudaStream_t stream) {
  if (count == 0) return;
  philox_words_kernel<<<grid_for(static_cast<std::int64_t>(count)), 256, 0, stream>>>(out, key,
                                                                                      count);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quintet::detail
