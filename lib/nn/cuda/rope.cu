// RoPE on the GPU, reading and writing through the strides of x and y, so the q and k heads of a
// fused projection are rotated where they lie (in place, no copy). inv_freq travels in the kernel's
// parameters (f32, as the CPU op rounds it); the angle and its cosine and sine are f32, like the
// CPU op's f32 path, and both kernels compute them the same way.
//
// Where each head is a contiguous row whose halves are runs of whole 16-byte vectors (unit stride
// in D, D / 2 a multiple of the vector's count, 16-byte aligned heads), one thread takes a vector
// of the lower half and its rotate-half partner in the upper half, for kHeadsPerThread heads of the
// same token: the cosines and sines of its pairs are computed once for those heads, and each head
// is two 16-byte loads and two 16-byte stores. Otherwise one thread per rotated pair
// (i, i + D/2) of one (batch, token, head), consecutive threads on consecutive i.
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

constexpr int kMaxHalf = 256;  // head_dim <= 512

struct RopeArgs {
  std::int64_t n;                 // pairs: B * S * H * half
  std::int64_t seq, heads, half;  // S, H, D / 2
  std::int64_t xs[4], ys[4];      // strides of x and y (elements)
  std::int64_t pos_b, pos_s;      // strides of positions ([S]: pos_b = 0)
  std::int64_t offset;            // position_offset
  float sign;                     // +1 forward, -1 inverse
  float inv_freq[kMaxHalf];
};

template <class T, class P>
__global__ void rope_kernel(const T* x, T* y, const P* positions, RopeArgs a) {
  for (std::int64_t idx = global_index(); idx < a.n; idx += global_stride()) {
    const std::int64_t i = idx % a.half;
    std::int64_t r = idx / a.half;
    const std::int64_t h = r % a.heads;
    r /= a.heads;
    const std::int64_t s = r % a.seq, b = r / a.seq;
    const std::int64_t p =
        a.offset + (positions != nullptr
                        ? static_cast<std::int64_t>(positions[b * a.pos_b + s * a.pos_s])
                        : s);
    float sn, cs;
    sincosf(static_cast<float>(p) * a.inv_freq[i], &sn, &cs);
    sn *= a.sign;
    const T* xr = x + b * a.xs[0] + s * a.xs[1] + h * a.xs[2];
    T* yr = y + b * a.ys[0] + s * a.ys[1] + h * a.ys[2];
    const float lo = to_float(xr[i * a.xs[3]]), hi = to_float(xr[(i + a.half) * a.xs[3]]);
    yr[i * a.ys[3]] = from_float<T>(lo * cs - hi * sn);
    yr[(i + a.half) * a.ys[3]] = from_float<T>(hi * cs + lo * sn);
  }
}

constexpr int kHeadsPerThread = 4;

// n = B * S * groups * (half / V) work items, groups >= ceil(H / kHeadsPerThread). Item
// (b, s, group, j) rotates vector j of each half of heads u * groups + group (u < kHeadsPerThread,
// the head < H) of token (b, s): every head once, and a warp's loads for one u cover neighbouring
// heads.
template <class T, class P>
__global__ void rope_vec_kernel(const T* x, T* y, const P* positions, RopeArgs a,
                                std::int64_t groups, std::int64_t n) {
  constexpr int V = Vec16<T>::kCount;
  const std::int64_t nj = a.half / V;  // vectors per half
  for (std::int64_t idx = global_index(); idx < n; idx += global_stride()) {
    const std::int64_t j = idx % nj;
    std::int64_t r = idx / nj;
    const std::int64_t group = r % groups;
    r /= groups;
    const std::int64_t s = r % a.seq, b = r / a.seq;
    const std::int64_t p =
        a.offset + (positions != nullptr
                        ? static_cast<std::int64_t>(positions[b * a.pos_b + s * a.pos_s])
                        : s);
    float cs[V], sn[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      sincosf(static_cast<float>(p) * a.inv_freq[j * V + k], &sn[k], &cs[k]);
      sn[k] *= a.sign;
    }
    const T* xt = x + b * a.xs[0] + s * a.xs[1] + j * V;
    T* yt = y + b * a.ys[0] + s * a.ys[1] + j * V;
    Vec16<T> lo[kHeadsPerThread], hi[kHeadsPerThread];
#pragma unroll
    for (int u = 0; u < kHeadsPerThread; ++u) {
      const std::int64_t h = u * groups + group;
      if (h < a.heads) {
        lo[u] = *reinterpret_cast<const Vec16<T>*>(xt + h * a.xs[2]);
        hi[u] = *reinterpret_cast<const Vec16<T>*>(xt + h * a.xs[2] + a.half);
      }
    }
#pragma unroll
    for (int u = 0; u < kHeadsPerThread; ++u) {
      const std::int64_t h = u * groups + group;
      if (h < a.heads) {
        Vec16<T> ylo, yhi;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float l = to_float(lo[u].v[k]), g = to_float(hi[u].v[k]);
          ylo.v[k] = from_float<T>(l * cs[k] - g * sn[k]);
          yhi.v[k] = from_float<T>(g * cs[k] + l * sn[k]);
        }
        *reinterpret_cast<Vec16<T>*>(yt + h * a.ys[2]) = ylo;
        *reinterpret_cast<Vec16<T>*>(yt + h * a.ys[2] + a.half) = yhi;
      }
    }
  }
}

// Whether rope_vec_kernel<T> can take x and y: unit stride in D, halves of whole vectors, and every
// head's start 16-byte aligned (the strides of B, S and H multiples of the vector's count, where
// the dimension has more than one index).
template <class T>
bool rope_vectorizable(const Tensor& x, const Tensor& y, std::int64_t half) {
  if (x.stride(3) != 1 || y.stride(3) != 1) return false;
  for (int d = 0; d < 3; ++d) {
    if (x.size(d) > 1 &&
        (x.stride(d) % Vec16<T>::kCount != 0 || y.stride(d) % Vec16<T>::kCount != 0)) {
      return false;
    }
  }
  return vectorizable<T>(half, {x.data_ptr(), y.data_ptr()});
}

}  // namespace

void rope(const Tensor& x, const Tensor& y, const Tensor& positions,
          const std::vector<double>& inv_freq, std::int64_t position_offset, bool inverse,
          const Stream& stream) {
  const std::int64_t half = x.size(3) / 2;
  QUINTET_CHECK(half <= kMaxHalf, "rope: head_dim = {}; the CUDA kernel takes head_dim up to {}",
                x.size(3), 2 * kMaxHalf);
  RopeArgs a{};
  a.n = x.size(0) * x.size(1) * x.size(2) * half;
  a.seq = x.size(1);
  a.heads = x.size(2);
  a.half = half;
  for (int d = 0; d < 4; ++d) {
    a.xs[d] = x.stride(d);
    a.ys[d] = y.stride(d);
  }
  if (positions.defined()) {
    a.pos_b = positions.dim() == 2 ? positions.stride(0) : 0;
    a.pos_s = positions.stride(positions.dim() - 1);
  }
  a.offset = position_offset;
  a.sign = inverse ? -1.0f : 1.0f;
  for (std::int64_t i = 0; i < half; ++i) a.inv_freq[i] = static_cast<float>(inv_freq[i]);
  if (a.n == 0) return;
  dispatch_compute(x.dtype(), "rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool i32 = positions.defined() && positions.dtype() == DType::i32;
    const T* xp = ptr<T>(x);
    T* yp = ptr<T>(y);
    if (rope_vectorizable<T>(x, y, half)) {
      // kHeadsPerThread heads a thread where that leaves enough threads to fill the GPU (about
      // 2^17), fewer (more groups) for fewer heads or tokens, such as the key heads.
      const std::int64_t tokens_vecs = x.size(0) * x.size(1) * (half / Vec16<T>::kCount);
      std::int64_t per_thread = kHeadsPerThread;
      while (per_thread > 1 &&
             tokens_vecs * ((a.heads + per_thread - 1) / per_thread) < (1 << 17)) {
        per_thread /= 2;
      }
      const std::int64_t groups = (a.heads + per_thread - 1) / per_thread;
      const std::int64_t n = tokens_vecs * groups;
      if (i32) {
        rope_vec_kernel<T, std::int32_t><<<grid_for(n), kThreads, 0, stream.handle()>>>(
            xp, yp, ptr<std::int32_t>(positions), a, groups, n);
      } else {
        rope_vec_kernel<T, std::int64_t><<<grid_for(n), kThreads, 0, stream.handle()>>>(
            xp, yp, positions.defined() ? ptr<std::int64_t>(positions) : nullptr, a, groups, n);
      }
      return;
    }
    if (i32) {
      rope_kernel<T, std::int32_t><<<grid_for(a.n), kThreads, 0, stream.handle()>>>(
          xp, yp, ptr<std::int32_t>(positions), a);
    } else {
      rope_kernel<T, std::int64_t><<<grid_for(a.n), kThreads, 0, stream.handle()>>>(
          xp, yp, positions.defined() ? ptr<std::int64_t>(positions) : nullptr, a);
    }
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
