// The router's logits ops on the GPU (quintet/nn/router_ops.hpp): x (bf16 or f32) read once in
// its own dtype, the weight, products and sums in f32, no f32 copy of x.
// - forward and backward input: a warp per token row, x and dx as quads of 4 elements beside
//   16-byte loads of the weight (when d and the pointers allow, else a lane per element), the
//   weight in shared memory when it fits in 48 KiB (else read through L1); the forward keeps
//   kExpertChunk sums per lane, then warp sums.
// - backward weight: blocks take a tile of columns, kExpertChunk experts and a chunk of tokens
//   and write per-chunk partial sums; a second kernel adds the chunks in order into dw. A fixed
//   order, so dw is the same from run to run (atomics would add the chunks in any order); the
//   partials cost a scratch of chunks * E * d floats, a few MB at most.
#include "nn/cuda/kernel_common.cuh"
#include "nn/router_ops_impl.hpp"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

constexpr int kRouterThreads = 256;  // 8 warps: 8 token rows at a time per block
constexpr int kRowsPerBlock = kRouterThreads / 32;
constexpr int kExpertChunk = 8;  // experts per pass of a row (sums held per lane or thread)
constexpr std::int64_t kSharedBytes = 48 * 1024;
constexpr int kDwCols = 4;                // columns per thread of the weight gradient
constexpr int kDwTokens = 32;             // tokens of dlogits staged in shared memory at a time
constexpr std::int64_t kDwMinChunk = 64;  // fewest tokens per chunk of the weight gradient

// Copies n floats of w into shared memory s (the whole block), returns s.
__device__ __forceinline__ const float* stage(const float* w, float* s, std::int64_t n) {
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s[i] = w[i];
  __syncthreads();
  return s;
}

// Four consecutive elements of x or dx: the unit of the row kernels' vector path. Lanes take
// consecutive quads, so the four f32 weights beside a lane's quad are one 16-byte load and a
// warp's loads of one weight row are consecutive (no shared-memory bank conflict; a 16-byte
// vector of bf16 would pair with 32 bytes of weights, a 2-way conflict).
template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

// Whether rows of d elements at p (x or dx) can go as quads, with the weight w (null when staged
// in shared memory) read as float4: d a multiple of 4, the pointers aligned.
template <class T>
bool quads(std::int64_t d, const void* p, const void* w) {
  return d % 4 == 0 && aligned_to(p, 4 * sizeof(T)) && aligned_to(w, 16);
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// logits[t, e] = sum_k x[t, k] w[e, k]. kVec: rows as quads (quads() holds).
template <class T, bool kVec>
__global__ void __launch_bounds__(kRouterThreads)
    router_forward_kernel(const T* __restrict__ x, const float* __restrict__ w,
                          float* __restrict__ logits, std::int64_t rows, std::int64_t d, int E,
                          bool shared) {
  extern __shared__ float4 router_smem[];
  const float* wp = shared ? stage(w, reinterpret_cast<float*>(router_smem), E * d) : w;
  const int lane = threadIdx.x & 31;
  for (std::int64_t t = warp_row(); t < rows; t += warp_row_stride()) {
    const T* xr = x + t * d;
    for (int e0 = 0; e0 < E; e0 += kExpertChunk) {
      float acc[kExpertChunk] = {};
      if constexpr (kVec) {
        const auto* xq = reinterpret_cast<const Quad<T>*>(xr);
#pragma unroll 4
        for (std::int64_t i = lane; i < d / 4; i += 32) {
          const Quad<T> q = xq[i];
          const float x0 = to_float(q.v[0]), x1 = to_float(q.v[1]), x2 = to_float(q.v[2]),
                      x3 = to_float(q.v[3]);
#pragma unroll
          for (int c = 0; c < kExpertChunk; ++c) {
            if (e0 + c >= E) break;
            const float4 a = load4(wp + (e0 + c) * d + 4 * i);
            acc[c] += x0 * a.x;
            acc[c] += x1 * a.y;
            acc[c] += x2 * a.z;
            acc[c] += x3 * a.w;
          }
        }
      } else {
        for (std::int64_t k = lane; k < d; k += 32) {
          const float xf = to_float(xr[k]);
#pragma unroll
          for (int c = 0; c < kExpertChunk; ++c) {
            if (e0 + c < E) acc[c] += xf * wp[(e0 + c) * d + k];
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kExpertChunk; ++c) {
        const float s = warp_sum(acc[c]);
        if (lane == 0 && e0 + c < E) logits[t * E + e0 + c] = s;
      }
    }
  }
}

// dx[t, k] = sum_e dlogits[t, e] w[e, k], the sum over e in order from 0, one rounding into T.
// Shared memory: each warp's row of dlogits (kRowsPerBlock * pad4(E) floats), then w if shared.
template <class T, bool kVec>
__global__ void __launch_bounds__(kRouterThreads)
    router_backward_input_kernel(const float* __restrict__ dl, const float* __restrict__ w,
                                 T* __restrict__ dx, std::int64_t rows, std::int64_t d, int E,
                                 bool shared) {
  extern __shared__ float4 router_smem[];
  float* s = reinterpret_cast<float*>(router_smem);
  const int padded = (E + 3) / 4 * 4;
  float* dls = s + (threadIdx.x / 32) * padded;
  const float* wp = shared ? stage(w, s + kRowsPerBlock * padded, E * d) : w;
  const int lane = threadIdx.x & 31;
  for (std::int64_t t = warp_row(); t < rows; t += warp_row_stride()) {
    __syncwarp();
    for (int e = lane; e < E; e += 32) dls[e] = dl[t * E + e];
    __syncwarp();
    if constexpr (kVec) {
      auto* out = reinterpret_cast<Quad<T>*>(dx + t * d);
      for (std::int64_t i = lane; i < d / 4; i += 32) {
        float acc[4] = {};
        for (int e = 0; e < E; ++e) {
          const float a = dls[e];
          const float4 v = load4(wp + e * d + 4 * i);
          acc[0] += a * v.x;
          acc[1] += a * v.y;
          acc[2] += a * v.z;
          acc[3] += a * v.w;
        }
        Quad<T> q;
#pragma unroll
        for (int j = 0; j < 4; ++j) q.v[j] = from_float<T>(acc[j]);
        out[i] = q;
      }
    } else {
      for (std::int64_t k = lane; k < d; k += 32) {
        float acc = 0.0f;
        for (int e = 0; e < E; ++e) acc += dls[e] * wp[e * d + k];
        dx[t * d + k] = from_float<T>(acc);
      }
    }
  }
}

// partial[z, e, k] = sum over the tokens of chunk z (in order) of dlogits[t, e] x[t, k]. Grid:
// x tiles of kRouterThreads * kDwCols columns, y chunks of kExpertChunk experts, z token chunks.
template <class T>
__global__ void __launch_bounds__(kRouterThreads)
    router_dw_partial_kernel(const float* __restrict__ dl, const T* __restrict__ x,
                             float* __restrict__ partial, std::int64_t rows, std::int64_t d, int E,
                             std::int64_t chunk) {
  __shared__ float s_dl[kDwTokens][kExpertChunk];
  const std::int64_t k0 =
      (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) * kDwCols;
  const int e0 = static_cast<int>(blockIdx.y) * kExpertChunk;
  const std::int64_t begin = blockIdx.z * chunk;
  const std::int64_t end = begin + chunk < rows ? begin + chunk : rows;
  float acc[kExpertChunk][kDwCols] = {};
  for (std::int64_t t0 = begin; t0 < end; t0 += kDwTokens) {
    const int n = static_cast<int>(end - t0 < kDwTokens ? end - t0 : kDwTokens);
    __syncthreads();
    for (int i = threadIdx.x; i < kDwTokens * kExpertChunk; i += blockDim.x) {
      const int tt = i / kExpertChunk, c = i % kExpertChunk;
      s_dl[tt][c] = tt < n && e0 + c < E ? dl[(t0 + tt) * E + e0 + c] : 0.0f;
    }
    __syncthreads();
#pragma unroll 4
    for (int tt = 0; tt < n; ++tt) {
      const T* xr = x + (t0 + tt) * d;
      float xf[kDwCols];
#pragma unroll
      for (int j = 0; j < kDwCols; ++j) xf[j] = k0 + j < d ? to_float(xr[k0 + j]) : 0.0f;
#pragma unroll
      for (int c = 0; c < kExpertChunk; ++c) {
        const float a = s_dl[tt][c];
#pragma unroll
        for (int j = 0; j < kDwCols; ++j) acc[c][j] += a * xf[j];
      }
    }
  }
  float* out = partial + blockIdx.z * static_cast<std::int64_t>(E) * d;
#pragma unroll
  for (int c = 0; c < kExpertChunk; ++c) {
#pragma unroll
    for (int j = 0; j < kDwCols; ++j) {
      if (e0 + c < E && k0 + j < d) out[(e0 + c) * d + k0 + j] = acc[c][j];
    }
  }
}

// dw[i] += sum over the chunks, in order, of partial[z, i] (n = E * d).
__global__ void router_dw_reduce_kernel(const float* __restrict__ partial, float* __restrict__ dw,
                                        std::int64_t n, std::int64_t chunks) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    float s = 0.0f;
    for (std::int64_t z = 0; z < chunks; ++z) s += partial[z * n + i];
    dw[i] += s;
  }
}

// Blocks for a grid-stride loop over rows, kRowsPerBlock at a time, a few per multiprocessor
// (each stages the weight once).
unsigned row_blocks(std::int64_t rows, const Device& device) {
  const std::int64_t want = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return static_cast<unsigned>(
      std::max<std::int64_t>(1, std::min<std::int64_t>(want, 4LL * multiprocessors(device))));
}

}  // namespace

void router_logits_forward(const Tensor& x, const Tensor& w, const Tensor& logits,
                           const Stream& stream) {
  const std::int64_t rows = x.size(0), d = x.size(1);
  const int E = static_cast<int>(w.size(0));
  const bool shared = E * d * 4 <= kSharedBytes;
  const std::size_t smem = shared ? static_cast<std::size_t>(E * d * 4) : 0;
  const unsigned blocks = row_blocks(rows, x.device());
  dispatch_compute(x.dtype(), "router_logits_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = ptr<T>(x);
    if (quads<T>(d, xp, shared ? nullptr : w.data_ptr())) {
      router_forward_kernel<T, true><<<blocks, kRouterThreads, smem, stream.handle()>>>(
          xp, ptr<float>(w), ptr<float>(logits), rows, d, E, shared);
    } else {
      router_forward_kernel<T, false><<<blocks, kRouterThreads, smem, stream.handle()>>>(
          xp, ptr<float>(w), ptr<float>(logits), rows, d, E, shared);
    }
    check_launch();
  });
}

void router_logits_backward_input(const Tensor& dlogits, const Tensor& w, const Tensor& dx,
                                  const Stream& stream) {
  const std::int64_t rows = dx.size(0), d = dx.size(1);
  const int E = static_cast<int>(w.size(0));
  const std::int64_t rows_bytes = kRowsPerBlock * ((E + 3) / 4 * 4) * 4;
  const bool shared = rows_bytes + E * d * 4 <= kSharedBytes;
  const std::size_t smem = static_cast<std::size_t>(rows_bytes + (shared ? E * d * 4 : 0));
  const unsigned blocks = row_blocks(rows, dx.device());
  dispatch_compute(dx.dtype(), "router_logits_backward_input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = ptr<T>(dx);
    if (quads<T>(d, out, shared ? nullptr : w.data_ptr())) {
      router_backward_input_kernel<T, true><<<blocks, kRouterThreads, smem, stream.handle()>>>(
          ptr<float>(dlogits), ptr<float>(w), out, rows, d, E, shared);
    } else {
      router_backward_input_kernel<T, false><<<blocks, kRouterThreads, smem, stream.handle()>>>(
          ptr<float>(dlogits), ptr<float>(w), out, rows, d, E, shared);
    }
    check_launch();
  });
}

void router_logits_backward_weight(const Tensor& dlogits, const Tensor& x, const Tensor& dw,
                                   const Stream& stream) {
  const std::int64_t rows = x.size(0), d = x.size(1);
  const int E = static_cast<int>(dw.size(0));
  const std::int64_t tiles = (d + kRouterThreads * kDwCols - 1) / (kRouterThreads * kDwCols);
  const std::int64_t expert_chunks = (E + kExpertChunk - 1) / kExpertChunk;
  // About two blocks per multiprocessor, at least kDwMinChunk tokens a chunk.
  const std::int64_t want =
      std::max<std::int64_t>(1, 2LL * multiprocessors(x.device()) / (tiles * expert_chunks));
  const std::int64_t chunk = std::max<std::int64_t>(kDwMinChunk, (rows + want - 1) / want);
  const std::int64_t chunks = (rows + chunk - 1) / chunk;
  const Tensor partial = Tensor::empty({chunks, E, d}, DType::f32, x.device(), stream);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(expert_chunks),
                  static_cast<unsigned>(chunks));
  dispatch_compute(x.dtype(), "router_logits_backward_weight", [&](auto tag) {
    using T = typename decltype(tag)::type;
    router_dw_partial_kernel<T><<<grid, kRouterThreads, 0, stream.handle()>>>(
        ptr<float>(dlogits), ptr<T>(x), ptr<float>(partial), rows, d, E, chunk);
    check_launch();
  });
  router_dw_reduce_kernel<<<grid_for(E * d), kThreads, 0, stream.handle()>>>(
      ptr<float>(partial), ptr<float>(dw), E * d, chunks);
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
