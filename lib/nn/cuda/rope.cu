// RoPE on the GPU, reading and writing through the strides of x and y, so the q and k heads of a
// fused projection are rotated where they lie (in place, no copy). inv_freq travels in the kernel's
// parameters (f32, as the CPU op rounds it); the angle and its cosine and sine are f32, like the
// CPU op's f32 path.
//
// One kernel, a block per group of tokens (grid-stride over the groups), 2^xlog threads per token.
// Each thread first issues the loads of its items — an item is W elements of a head's lower half
// and their rotate-half partners in the upper half, for one head of its token — then, while they
// are in flight, computes its share of its token's D / 2 cosines and sines into a table in shared
// memory (one sincosf per (token, i), shared by every head of the token), and after one barrier
// rotates its items and stores them. W is a 16-byte vector's count (8 in bf16, 4 in f32) where each
// head is a contiguous row whose halves are runs of whole 16-byte vectors (unit stride in D, D / 2
// a multiple of W, 16-byte aligned heads; the fused q/k/v views included), else 1 (any strides,
// each element on its own). Items of a token are numbered (head, j) with j fastest, so a warp's
// loads cover neighbouring heads; up to kItemsPerThread items a thread, in chunks when a token has
// more.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

constexpr int kMaxHalf = 256;  // head_dim <= 512
// Items a thread holds at once: its loads in flight before the table is computed.
constexpr int kItemsPerThread = 4;
// A block's table of cosines (and as many sines): tokens per block x D / 2 entries, 16 KiB in all.
constexpr int kTableEntries = 2048;
// Fewer items per thread (more threads per token, fewer tokens a block) while the grid would have
// fewer blocks than this: about 4 blocks of kThreads per multiprocessor on an H100 or H200, so
// small tensors (the key heads) still spread over the GPU.
constexpr std::int64_t kMinBlocks = 512;
// Blocks a multiprocessor holds at once at the least (registers kept to 85 a thread, which the
// bf16 kernel fits without spilling; 64 spills), 3 x 16 KiB of tables.
constexpr int kMinBlocksPerSM = 3;

struct RopeArgs {
  std::int64_t tokens;        // B * S
  std::int64_t seq;           // S
  std::int64_t groups;        // blocks of tokens: ceil(tokens / (kThreads >> xlog))
  std::int64_t xs[4], ys[4];  // strides of x and y (elements)
  std::int64_t pos_b, pos_s;  // strides of positions ([S]: pos_b = 0)
  std::int64_t offset;        // position_offset
  int half;                   // D / 2
  int nj;                     // items per head: half / W
  int items;                  // items per token: H * nj
  int xlog;                   // log2 of the threads per token
  float sign;                 // +1 forward, -1 inverse
  float inv_freq[kMaxHalf];
};

// W elements of one half of a head: one element of any stride, or a 16-byte vector kept as four
// 32-bit words (unpacked only where used, so a thread's items take 4 registers each rather than one
// per bf16). get(k) widens element k to f32; put(f) rounds W floats into the pack.
template <class T>
struct Element {
  T v;
  __device__ __forceinline__ float get(int) const { return to_float(v); }
  __device__ __forceinline__ void put(const float* f) { v = from_float<T>(f[0]); }
};
template <class T>
struct Vector {
  uint4 w;
  // k is a constant after unrolling. A bf16 element is the low (even k) or high half of word
  // k / 2, and widens to f32 exactly by a shift.
  __device__ __forceinline__ float get(int k) const {
    const unsigned word = (&w.x)[k * sizeof(T) / 4];
    if constexpr (std::is_same_v<T, float>) {
      return __uint_as_float(word);
    } else {
      return __uint_as_float(k % 2 == 0 ? word << 16 : word & 0xffff0000u);
    }
  }
  __device__ __forceinline__ void put(const float* f) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (std::is_same_v<T, float>) {
        (&w.x)[q] = __float_as_uint(f[q]);
      } else {
        const unsigned even = __bfloat16_as_ushort(from_float<T>(f[2 * q]));
        const unsigned odd = __bfloat16_as_ushort(from_float<T>(f[2 * q + 1]));
        (&w.x)[q] = even | (odd << 16);
      }
    }
  }
};
template <class T, int W>
using Pack = std::conditional_t<W == 1, Element<T>, Vector<T>>;

template <class T, class P, int W>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
    rope_kernel(const T* x, T* y, const P* positions, RopeArgs a) {
  static_assert(W == 1 || W == Vec16<T>::kCount, "an item is one element or one 16-byte vector");
  constexpr int K = kItemsPerThread;
  __shared__ __align__(16) float cos_table[kTableEntries];
  __shared__ __align__(16) float sin_table[kTableEntries];
  const int per_token = 1 << a.xlog;
  const int tx = static_cast<int>(threadIdx.x) & (per_token - 1);
  const int ty = static_cast<int>(threadIdx.x) >> a.xlog;
  const std::int64_t tokens_per_block = kThreads >> a.xlog;
  // This thread's token's entries (i < half); 16-byte aligned where W > 1 (half a multiple of W).
  float* const cs = cos_table + ty * a.half;
  float* const sn = sin_table + ty * a.half;
  for (std::int64_t g = blockIdx.x; g < a.groups; g += gridDim.x) {
    const std::int64_t tok = g * tokens_per_block + ty;
    const bool live = tok < a.tokens;
    std::int64_t xo = 0, yo = 0, p = 0;
    if (live) {
      const std::int64_t b = tok / a.seq, s = tok - b * a.seq;
      xo = b * a.xs[0] + s * a.xs[1];
      yo = b * a.ys[0] + s * a.ys[1];
      p = a.offset + (positions != nullptr
                          ? static_cast<std::int64_t>(positions[b * a.pos_b + s * a.pos_s])
                          : s);
    }
    Pack<T, W> lo[K], hi[K];
    // Item r of the token: head r / nj, elements j0 .. j0 + W - 1 of its lower half (recomputed
    // at the store rather than held across the table's computation, to spare registers).
    auto load = [&](int first) {
#pragma unroll
      for (int m = 0; m < K; ++m) {
        const int r = first + m * per_token + tx;
        if (live && r < a.items) {
          const int head = r / a.nj, j0 = (r - head * a.nj) * W;
          const T* xr = x + xo + head * a.xs[2];
          if constexpr (W == 1) {
            lo[m].v = xr[j0 * a.xs[3]];
            hi[m].v = xr[(j0 + a.half) * a.xs[3]];
          } else {
            lo[m].w = *reinterpret_cast<const uint4*>(xr + j0);
            hi[m].w = *reinterpret_cast<const uint4*>(xr + j0 + a.half);
          }
        }
      }
    };
    auto rotate_store = [&](int first) {
#pragma unroll
      for (int m = 0; m < K; ++m) {
        const int r = first + m * per_token + tx;
        if (!live || r >= a.items) continue;
        const int head = r / a.nj, j0 = (r - head * a.nj) * W;
        float c[W], s[W];
        if constexpr (W % 4 == 0) {
#pragma unroll
          for (int q = 0; q < W / 4; ++q) {
            const float4 c4 = reinterpret_cast<const float4*>(cs + j0)[q];
            const float4 s4 = reinterpret_cast<const float4*>(sn + j0)[q];
            c[4 * q] = c4.x, c[4 * q + 1] = c4.y, c[4 * q + 2] = c4.z, c[4 * q + 3] = c4.w;
            s[4 * q] = s4.x, s[4 * q + 1] = s4.y, s[4 * q + 2] = s4.z, s[4 * q + 3] = s4.w;
          }
        } else {
#pragma unroll
          for (int k = 0; k < W; ++k) c[k] = cs[j0 + k], s[k] = sn[j0 + k];
        }
        float fl[W], fh[W];
#pragma unroll
        for (int k = 0; k < W; ++k) {
          const float l = lo[m].get(k), h = hi[m].get(k);
          fl[k] = l * c[k] - h * s[k];
          fh[k] = h * c[k] + l * s[k];
        }
        Pack<T, W> ylo, yhi;
        ylo.put(fl);
        yhi.put(fh);
        T* yr = y + yo + head * a.ys[2];
        if constexpr (W == 1) {
          yr[j0 * a.ys[3]] = ylo.v;
          yr[(j0 + a.half) * a.ys[3]] = yhi.v;
        } else {
          *reinterpret_cast<uint4*>(yr + j0) = ylo.w;
          *reinterpret_cast<uint4*>(yr + j0 + a.half) = yhi.w;
        }
      }
    };
    load(0);
    if (live) {
      for (int i = tx; i < a.half; i += per_token) {
        float si, ci;
        sincosf(static_cast<float>(p) * a.inv_freq[i], &si, &ci);
        cs[i] = ci;
        sn[i] = si * a.sign;
      }
    }
    __syncthreads();
    rotate_store(0);
    for (int first = K * per_token; first < a.items; first += K * per_token) {
      load(first);
      rotate_store(first);
    }
    __syncthreads();  // every thread is done with the table before the next group's
  }
}

// Whether x and y can go as items of W = Vec16<T>::kCount: unit stride in D, halves of whole
// vectors, and every head's start 16-byte aligned (the strides of B, S and H multiples of the
// vector's count, where the dimension has more than one index).
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

int ceil_log2(std::int64_t n) {
  int l = 0;
  while ((std::int64_t{1} << l) < n) ++l;
  return l;
}

// Sets a.nj, a.items, a.xlog and a.groups for items of w elements: the most items per thread (up
// to kItemsPerThread) that leave the grid at least kMinBlocks blocks, with at least half / 8
// threads per token so that a block's table (kThreads >> xlog tokens of half entries) fits
// kTableEntries.
void plan(RopeArgs& a, std::int64_t heads, int w) {
  a.nj = a.half / w;
  a.items = static_cast<int>(heads * a.nj);
  const int min_xlog = ceil_log2((a.half + 7) / 8);
  const int max_xlog = ceil_log2(kThreads);
  for (int k = kItemsPerThread;; k /= 2) {
    a.xlog = std::min(max_xlog, std::max(min_xlog, ceil_log2((a.items + k - 1) / k)));
    const std::int64_t per_block = kThreads >> a.xlog;
    a.groups = (a.tokens + per_block - 1) / per_block;
    if (k == 1 || a.groups >= kMinBlocks) break;
  }
}

}  // namespace

void rope(const Tensor& x, const Tensor& y, const Tensor& positions,
          const std::vector<double>& inv_freq, std::int64_t position_offset, bool inverse,
          const Stream& stream) {
  const std::int64_t half = x.size(3) / 2;
  QUINTET_CHECK(half <= kMaxHalf, "rope: head_dim = {}; the CUDA kernel takes head_dim up to {}",
                x.size(3), 2 * kMaxHalf);
  QUINTET_CHECK(
      x.size(2) * half <= INT_MAX / 2,
      "rope: {} heads of head_dim {}; the CUDA kernel takes heads * head_dim / 2 up to {}",
      x.size(2), x.size(3), INT_MAX / 2);
  RopeArgs a{};
  a.tokens = x.size(0) * x.size(1);
  a.seq = x.size(1);
  a.half = static_cast<int>(half);
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
  if (a.tokens == 0 || x.size(2) == 0 || half == 0) return;
  dispatch_compute(x.dtype(), "rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = Vec16<T>::kCount;
    const bool vec = rope_vectorizable<T>(x, y, half);
    plan(a, x.size(2), vec ? V : 1);
    const auto grid = static_cast<unsigned>(std::min<std::int64_t>(a.groups, INT_MAX));
    const T* xp = ptr<T>(x);
    T* yp = ptr<T>(y);
    auto launch = [&](auto w) {
      constexpr int W = decltype(w)::value;
      if (positions.defined() && positions.dtype() == DType::i32) {
        rope_kernel<T, std::int32_t, W>
            <<<grid, kThreads, 0, stream.handle()>>>(xp, yp, ptr<std::int32_t>(positions), a);
      } else {
        rope_kernel<T, std::int64_t, W><<<grid, kThreads, 0, stream.handle()>>>(
            xp, yp, positions.defined() ? ptr<std::int64_t>(positions) : nullptr, a);
      }
    };
    if (vec) {
      launch(std::integral_constant<int, V>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
