// The CUDA mixture-of-experts ops (quintet/nn/ops.hpp, cuda_ops.hpp): the fused router (a warp
// per token: scores, top-k by k rounds of a warp argmax, weights, the tile's statistics; then one
// small kernel summing the tiles' statistics), its fused backward (a warp per token), the
// capacity rule and the permutation (stable CUB radix sorts of the assignments), the permutation's
// scatter fused with the gather of the rows, and the un-permutation fused with the weighted
// combine and its backward (rows moved as 16-byte vectors, a warp per row, where d and the
// pointers allow). Every sum that lands in a result runs in a fixed order, so a run
// repeats bit for bit.
#include <cub/cub.cuh>

#include <climits>

#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

constexpr int kWarps = 8;              // warps per block of the router's kernels
constexpr int kTokensPerWarp = 4;      // tokens per warp of a forward tile
constexpr int kSmemBytes = 48 * 1024;  // the router's shared memory, at most

// Scratch memory for CUB on the stream's pool.
Tensor scratch(std::size_t bytes, const Stream& stream) {
  return Tensor::empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes, 1))}, DType::u8,
                       stream.device(), stream);
}

int bits_for(std::uint64_t max_value) {
  int b = 1;
  while ((std::uint64_t{1} << b) <= max_value) ++b;
  return b;
}

// ---- routing ------------------------------------------------------------------------------

// The better of two candidates of the selection: the larger score, ties to the lower expert; an
// index of INT_MAX is "none".
__device__ __forceinline__ bool better(float s, int i, float best_s, int best_i) {
  return i != INT_MAX && (best_i == INT_MAX || s > best_s || (s == best_s && i < best_i));
}

// One block per tile of tokens, tiles never straddling a group (tile b covers tokens [g n + i
// TILE, min(.. + TILE, (g + 1) n)) with g = b / tiles_per_group, i = b % tiles_per_group), one
// warp per token. Lane l owns the experts e = l (mod 32): it computes their scores, and it alone
// updates their entries of its warp's statistics in shared memory, so nothing races. The tile's
// statistics (per expert, and the sum of lse² for the z loss) go to part_* in a fixed order.
__global__ void route_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                             std::int64_t E, int k, bool softmax, bool renormalize,
                             std::int64_t group_tokens, std::int64_t tiles_per_group, int tile,
                             float* probs, std::int32_t* __restrict__ experts,
                             float* __restrict__ weights, std::uint8_t* __restrict__ kept,
                             float* __restrict__ lse, float* __restrict__ part_counts,
                             float* __restrict__ part_psum, double* __restrict__ part_z) {
  extern __shared__ double smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double* warp_z = smem;                                  // [warps]
  float* stats = reinterpret_cast<float*>(smem + warps);  // [warps][2 E] when counted
  const bool counted = part_counts != nullptr;
  float* cnt = counted ? stats + warp * 2 * E : nullptr;
  float* psum = counted ? cnt + E : nullptr;
  if (counted) {
    for (std::int64_t e = lane; e < E; e += 32) cnt[e] = psum[e] = 0.0f;
  }
  const std::int64_t g = blockIdx.x / tiles_per_group, i = blockIdx.x % tiles_per_group;
  const std::int64_t first = g * group_tokens + i * tile;
  const std::int64_t group_end = (g + 1) * group_tokens;
  const std::int64_t end = first + tile < group_end ? first + tile : group_end;
  double z = 0.0;  // lane 0's sum of lse² over the warp's tokens
  for (std::int64_t t = first + warp; t < end; t += warps) {
    const float* row = logits + t * E;
    float* p = probs + t * E;
    float m = -INFINITY;
    for (std::int64_t e = lane; e < E; e += 32) m = fmaxf(m, row[e]);
    m = warp_max(m);
    float s = 0.0f;
    for (std::int64_t e = lane; e < E; e += 32) s += expf(row[e] - m);
    const float l = m + logf(warp_sum(s));
    if (lane == 0) {
      lse[t] = l;
      z += static_cast<double>(l) * l;
    }
    for (std::int64_t e = lane; e < E; e += 32) {
      const float v = softmax ? expf(row[e] - l) : 1.0f / (1.0f + expf(-row[e]));
      p[e] = v;  // read back below by this lane only
      if (counted) psum[e] += v;
    }
    // k rounds: each picks the best selection score strictly after the previous pick in the
    // order (score decreasing, expert increasing); lane j keeps pick j.
    float prev_s = INFINITY, sum = 0.0f, my_p = 0.0f;
    int prev_i = -1, my_i = 0;
    for (int r = 0; r < k; ++r) {
      float best_s = -INFINITY, best_p = 0.0f;
      int best_i = INT_MAX;
      for (std::int64_t e = lane; e < E; e += 32) {
        const float pv = p[e];
        const float sv = pv + (bias != nullptr ? bias[e] : 0.0f);
        const int ei = static_cast<int>(e);
        const bool after = r == 0 || sv < prev_s || (sv == prev_s && ei > prev_i);
        if (after && better(sv, ei, best_s, best_i)) {
          best_s = sv;
          best_i = ei;
          best_p = pv;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float os = __shfl_xor_sync(0xffffffffu, best_s, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        const float op = __shfl_xor_sync(0xffffffffu, best_p, o);
        if (better(os, oi, best_s, best_i)) {
          best_s = os;
          best_i = oi;
          best_p = op;
        }
      }
      // Nothing comparable was left (NaN scores): expert 0 (whose prob lane 0 holds), so that
      // every index stays in range. The shuffle runs on every lane, outside the branch.
      const float p0 = __shfl_sync(0xffffffffu, lane == 0 ? p[0] : 0.0f, 0);
      if (best_i == INT_MAX) {
        best_i = 0;
        best_p = p0;
      }
      if (lane == r) {
        my_i = best_i;
        my_p = best_p;
      }
      sum += best_p;
      if (counted && lane == (best_i & 31)) cnt[best_i] += 1.0f;
      prev_s = best_s;
      prev_i = best_i;
    }
    if (lane < k) {
      const std::int64_t a = t * k + lane;
      experts[a] = my_i;
      weights[a] = renormalize ? my_p / sum : my_p;
      kept[a] = 1;
    }
  }
  if (lane == 0) warp_z[warp] = z;
  __syncthreads();
  if (counted) {
    for (std::int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      float c = 0.0f, ps = 0.0f;
      for (int w = 0; w < warps; ++w) {
        c += stats[w * 2 * E + e];
        ps += stats[w * 2 * E + E + e];
      }
      part_counts[blockIdx.x * E + e] = c;
      part_psum[blockIdx.x * E + e] = ps;
    }
  }
  if (part_z != nullptr && threadIdx.x == 0) {
    double zt = 0.0;
    for (int w = 0; w < warps; ++w) zt += warp_z[w];
    part_z[blockIdx.x] = zt;
  }
}

// The tiles' statistics summed in tile order: counts / prob_sum [G, E] (G E threads), and thread
// 0 adds z_scale * (sum of part_z) into z_sum.
__global__ void route_stats_kernel(const float* part_counts, const float* part_psum,
                                   const double* part_z, std::int64_t G, std::int64_t E,
                                   std::int64_t tiles_per_group, double z_scale, float* counts,
                                   float* prob_sum, double* z_sum) {
  for (std::int64_t ge = global_index(); ge < (counts != nullptr ? G * E : 0);
       ge += global_stride()) {
    const std::int64_t g = ge / E, e = ge % E;
    float c = 0.0f, ps = 0.0f;
    for (std::int64_t i = 0; i < tiles_per_group; ++i) {
      c += part_counts[(g * tiles_per_group + i) * E + e];
      ps += part_psum[(g * tiles_per_group + i) * E + e];
    }
    counts[ge] = c;
    prob_sum[ge] = ps;
  }
  if (z_sum != nullptr && global_index() == 0) {
    double zt = 0.0;
    const std::int64_t tiles = (G > 0 ? G : 1) * tiles_per_group;
    for (std::int64_t b = 0; b < tiles; ++b) zt += part_z[b];
    z_sum[0] += z_scale * zt;
  }
}

// d(probs) of token t at expert e: through the weights (dropped ones: none) and the aux loss.
// S and gp: the sum of the k probs and sum_j dw_j p_j over the kept ones (renormalize only).
__device__ __forceinline__ float dprob(const float* p, const std::int32_t* ex,
                                       const std::uint8_t* kp, const float* dw, int k,
                                       bool renormalize, double S, double gp, const float* cnt,
                                       double aux_scale, std::int64_t e) {
  float d = 0.0f;
  for (int j = 0; j < k; ++j) {
    if (ex[j] != e) continue;
    if (!renormalize) {
      if (kp[j] != 0) d += dw[j];
    } else {
      const double g = kp[j] != 0 ? dw[j] : 0.0;
      d += static_cast<float>(g / S - gp / (S * S));
    }
  }
  if (cnt != nullptr) d += static_cast<float>(aux_scale * cnt[e]);
  return d;
}

// One warp per token (grid-stride over tokens).
__global__ void route_backward_kernel(const float* dweights, const float* logits,
                                      const float* probs, const std::int32_t* experts,
                                      const std::uint8_t* kept, const float* lse,
                                      const float* counts, std::int64_t T, std::int64_t E, int k,
                                      std::int64_t group_tokens, bool softmax, bool renormalize,
                                      double aux_scale, double z_scale, float* dlogits) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (std::int64_t t =
           blockIdx.x * static_cast<std::int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       t < T; t += warps) {
    const float* p = probs + t * E;
    const std::int32_t* ex = experts + t * k;
    const std::uint8_t* kp = kept + t * k;
    const float* dw = dweights + t * k;
    const float* cnt = counts != nullptr ? counts + (t / group_tokens) * E : nullptr;
    double S = 0.0, gp = 0.0;
    if (renormalize) {
      for (int j = 0; j < k; ++j) S += p[ex[j]];
      for (int j = 0; j < k; ++j) {
        if (kp[j] != 0) gp += static_cast<double>(dw[j]) * p[ex[j]];
      }
    }
    double dot = 0.0;
    if (softmax) {
      for (std::int64_t e = lane; e < E; e += 32) {
        dot += static_cast<double>(p[e]) *
               dprob(p, ex, kp, dw, k, renormalize, S, gp, cnt, aux_scale, e);
      }
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    }
    const float* row = logits + t * E;
    const float l = lse[t];
    const float f = static_cast<float>(z_scale * 2.0) * l;
    for (std::int64_t e = lane; e < E; e += 32) {
      const float d = dprob(p, ex, kp, dw, k, renormalize, S, gp, cnt, aux_scale, e);
      float out = softmax ? static_cast<float>(p[e] * (d - dot)) : d * p[e] * (1.0f - p[e]);
      if (z_scale != 0.0) out += f * expf(row[e] - l);
      dlogits[t * E + e] = out;
    }
  }
}

// Sort keys of the capacity rule: the expert, then the probability decreasing; dropped
// assignments sort last (key E).
__global__ void capacity_keys_kernel(const float* probs, const std::int32_t* experts,
                                     const std::uint8_t* kept, std::int64_t A, std::int64_t E,
                                     int k, std::uint64_t* keys, std::int32_t* ids) {
  for (std::int64_t a = global_index(); a < A; a += global_stride()) {
    const std::int32_t e = experts[a];
    const float p = probs[(a / k) * E + e];
    const std::uint32_t bits = __float_as_uint(p);  // p >= 0: the bits order as the values
    keys[a] = kept[a] != 0 ? (static_cast<std::uint64_t>(e) << 32) | (0xffffffffu - bits)
                           : static_cast<std::uint64_t>(E) << 32;
    ids[a] = static_cast<std::int32_t>(a);
  }
}

__global__ void capacity_drop_kernel(const std::uint64_t* keys, const std::int32_t* ids,
                                     std::int64_t A, std::int64_t E, std::int64_t capacity,
                                     float* weights, std::uint8_t* kept) {
  for (std::int64_t i = global_index(); i < A; i += global_stride()) {
    const std::uint64_t seg = keys[i] >> 32;
    if (seg >= static_cast<std::uint64_t>(E)) continue;  // dropped already
    // The first position of this expert's run of the sorted keys.
    std::int64_t lo = 0, hi = i;
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) / 2;
      if ((keys[mid] >> 32) < seg) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (i - lo >= capacity) {
      kept[ids[i]] = 0;
      weights[ids[i]] = 0.0f;
    }
  }
}

// ---- permutation --------------------------------------------------------------------------

__global__ void permute_keys_kernel(const std::int32_t* experts, const std::uint8_t* kept,
                                    std::int64_t A, std::uint32_t E, std::uint32_t* keys,
                                    std::int32_t* ids, unsigned long long* counts) {
  for (std::int64_t a = global_index(); a < A; a += global_stride()) {
    const bool k = kept[a] != 0;
    keys[a] = k ? static_cast<std::uint32_t>(experts[a]) : E;
    ids[a] = static_cast<std::int32_t>(a);
    if (k) atomicAdd(counts + experts[a], 1ull);  // integer counts: order-free
  }
}

// One block per sorted row i (grid-stride): its source and slot entries, and the row itself,
// x[token] or zeros past the kept ones.
template <class T>
__global__ void permute_gather_kernel(const T* x, const std::uint32_t* keys,
                                      const std::int32_t* ids, std::int64_t A, std::int64_t d,
                                      std::uint32_t E, int k, T* rows, std::int32_t* source,
                                      std::int32_t* slot) {
  for (std::int64_t i = blockIdx.x; i < A; i += gridDim.x) {
    const std::int32_t a = ids[i];
    const bool kept = keys[i] < E;
    if (threadIdx.x == 0) {
      source[i] = kept ? a : -1;
      slot[a] = kept ? static_cast<std::int32_t>(i) : -1;
    }
    T* out = rows + i * d;
    if (kept) {
      const T* in = x + static_cast<std::int64_t>(a / k) * d;
      for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) out[c] = in[c];
    } else {
      for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) out[c] = from_float<T>(0.0f);
    }
  }
}

// One block per token, threads over the columns.
template <class T>
__global__ void unpermute_kernel(const T* rows, const std::int32_t* slot, const float* weights,
                                 std::int64_t n, std::int64_t d, int k, T* out) {
  for (std::int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) {
        const std::int32_t s = slot[t * k + j];
        if (s < 0) continue;
        const float w = weights != nullptr ? weights[t * k + j] : 1.0f;
        acc += w * to_float(rows[static_cast<std::int64_t>(s) * d + c]);
      }
      out[t * d + c] = from_float<T>(acc);
    }
  }
}

// One block per sorted row i < R (grid-stride): drows[i] = w[a] dy[token of a], dweights[a] =
// dy[token] . rows[i] for a = source[i]; rows of no assignment get zeros. The dweights of dropped
// assignments are zeroed before.
template <class T>
__global__ void unpermute_backward_kernel(const T* dy, const T* rows, const std::int32_t* source,
                                          const float* weights, std::int64_t R, std::int64_t d,
                                          int k, T* drows, float* dweights) {
  __shared__ float scratch[32];
  for (std::int64_t i = blockIdx.x; i < R; i += gridDim.x) {
    const std::int32_t a = source[i];  // the same for every thread of the block
    T* dr = drows + i * d;
    if (a < 0) {
      for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) dr[c] = from_float<T>(0.0f);
      continue;
    }
    const T* g = dy + static_cast<std::int64_t>(a / k) * d;
    const T* y = rows + i * d;
    const float w = weights[a];
    float dot = 0.0f;
    for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      const float gv = to_float(g[c]);
      dr[c] = from_float<T>(w * gv);
      dot += gv * to_float(y[c]);
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dweights[a] = dot;
  }
}

// ---- the permutation's row kernels as 16-byte vectors ---------------------------------------
//
// When d is a whole number of Vec16<T> and the row pointers are 16-byte aligned, one warp per row
// (kThreads / 32 rows a block, grid-stride over rows) moves the row as vectors, each lane taking
// vectors lane, lane + 32, ... kUnroll at a time (loads issued together before their stores). At
// d = 1024 a bf16 row is 128 vectors (4 a lane), an f32 row 256 (8 a lane). The per-element
// arithmetic is the scalar kernels' above, which stay for other shapes.

constexpr int kRowWarps = kThreads / 32;  // rows a block of the vector kernels
constexpr int kUnroll = 4;                // vectors a lane loads before storing

// permute_gather_kernel with nv = d / Vec16<T>::kCount vectors a row.
template <class T>
__global__ void permute_gather_vec_kernel(const Vec16<T>* __restrict__ x,
                                          const std::uint32_t* __restrict__ keys,
                                          const std::int32_t* __restrict__ ids, std::int64_t A,
                                          std::int64_t nv, std::uint32_t E, int k,
                                          Vec16<T>* __restrict__ rows,
                                          std::int32_t* __restrict__ source,
                                          std::int32_t* __restrict__ slot) {
  const int lane = threadIdx.x & 31;
  for (std::int64_t i = warp_row(); i < A; i += warp_row_stride()) {
    const std::int32_t a = ids[i];
    const bool kept = keys[i] < E;
    if (lane == 0) {
      source[i] = kept ? a : -1;
      slot[a] = kept ? static_cast<std::int32_t>(i) : -1;
    }
    Vec16<T>* out = rows + i * nv;
    if (!kept) {
      const Vec16<T> z = vec_zero<T>();
      for (std::int64_t v = lane; v < nv; v += 32) out[v] = z;
      continue;
    }
    const Vec16<T>* in = x + static_cast<std::int64_t>(a / k) * nv;
    for (std::int64_t v0 = lane; v0 < nv; v0 += 32 * kUnroll) {
      Vec16<T> buf[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + u * 32 < nv) buf[u] = in[v0 + u * 32];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + u * 32 < nv) out[v0 + u * 32] = buf[u];
      }
    }
  }
}

// unpermute_kernel with one warp per token: per element, f32 accumulation over the k slots in
// slot order.
template <class T>
__global__ void unpermute_vec_kernel(const Vec16<T>* __restrict__ rows,
                                     const std::int32_t* __restrict__ slot,
                                     const float* __restrict__ weights, std::int64_t n,
                                     std::int64_t nv, int k, Vec16<T>* __restrict__ out) {
  constexpr int K = Vec16<T>::kCount;
  const int lane = threadIdx.x & 31;
  for (std::int64_t t = warp_row(); t < n; t += warp_row_stride()) {
    for (std::int64_t v0 = lane; v0 < nv; v0 += 32 * kUnroll) {
      float acc[kUnroll][K];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int e = 0; e < K; ++e) acc[u][e] = 0.0f;
      }
      for (int j = 0; j < k; ++j) {
        const std::int32_t s = slot[t * k + j];
        if (s < 0) continue;
        const float w = weights != nullptr ? weights[t * k + j] : 1.0f;
        const Vec16<T>* src = rows + static_cast<std::int64_t>(s) * nv;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (v0 + u * 32 >= nv) continue;
          const Vec16<T> r = src[v0 + u * 32];
#pragma unroll
          for (int e = 0; e < K; ++e) acc[u][e] += w * to_float(r.v[e]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + u * 32 >= nv) continue;
        Vec16<T> o;
#pragma unroll
        for (int e = 0; e < K; ++e) o.v[e] = from_float<T>(acc[u][e]);
        out[t * nv + v0 + u * 32] = o;
      }
    }
  }
}

// unpermute_backward_kernel with one warp per sorted row: each lane sums its elements' products
// (its vectors in order, a vector's elements in order), then a warp sum; a fixed order, so a run
// repeats bit for bit.
template <class T>
__global__ void unpermute_backward_vec_kernel(const Vec16<T>* __restrict__ dy,
                                              const Vec16<T>* __restrict__ rows,
                                              const std::int32_t* __restrict__ source,
                                              const float* __restrict__ weights, std::int64_t R,
                                              std::int64_t nv, int k, Vec16<T>* __restrict__ drows,
                                              float* __restrict__ dweights) {
  constexpr int K = Vec16<T>::kCount;
  const int lane = threadIdx.x & 31;
  for (std::int64_t i = warp_row(); i < R; i += warp_row_stride()) {
    const std::int32_t a = source[i];  // the same for every lane of the warp
    Vec16<T>* dr = drows + i * nv;
    if (a < 0) {
      const Vec16<T> z = vec_zero<T>();
      for (std::int64_t v = lane; v < nv; v += 32) dr[v] = z;
      continue;
    }
    const Vec16<T>* g = dy + static_cast<std::int64_t>(a / k) * nv;
    const Vec16<T>* y = rows + i * nv;
    const float w = weights[a];
    float dot = 0.0f;
    for (std::int64_t v0 = lane; v0 < nv; v0 += 32 * kUnroll) {
      Vec16<T> gb[kUnroll], yb[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + u * 32 < nv) {
          gb[u] = g[v0 + u * 32];
          yb[u] = y[v0 + u * 32];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + u * 32 >= nv) continue;
        Vec16<T> o;
#pragma unroll
        for (int e = 0; e < K; ++e) {
          const float gv = to_float(gb[u].v[e]);
          o.v[e] = from_float<T>(w * gv);
          dot += gv * to_float(yb[u].v[e]);
        }
        dr[v0 + u * 32] = o;
      }
    }
    dot = warp_sum(dot);
    if (lane == 0) dweights[a] = dot;
  }
}

unsigned blocks_for_warp_rows(std::int64_t rows) {
  return grid_for(std::max<std::int64_t>(1, rows), kRowWarps);
}

unsigned blocks_for_rows(std::int64_t rows) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(rows, 65535)));
}

}  // namespace

void moe_route_forward(const Tensor& logits, const Tensor& bias, const RouteOptions& options,
                       const Tensor& probs, const Tensor& experts, const Tensor& weights,
                       const Tensor& kept, const Tensor& lse, const Tensor& counts,
                       const Tensor& prob_sum, const Tensor& z_sum, const Stream& stream) {
  const std::int64_t T = logits.size(0), E = logits.size(1);
  const bool counted = counts.defined();
  const std::int64_t G = counted ? options.groups : 0;
  if (T == 0) {
    if (counted) {
      const auto bytes = static_cast<std::size_t>(G * E) * sizeof(float);
      QUINTET_CUDA_CHECK(cudaMemsetAsync(counts.data_ptr(), 0, bytes, stream.handle()));
      QUINTET_CUDA_CHECK(cudaMemsetAsync(prob_sum.data_ptr(), 0, bytes, stream.handle()));
    }
    return;
  }
  // Warps per block: 8, fewer when a warp's statistics (2 E floats) would not fit.
  const std::int64_t per_warp = 8 + (counted ? 8 * E : 0);
  const int warps = static_cast<int>(std::clamp<std::int64_t>(kSmemBytes / per_warp, 1, kWarps));
  const int tile = warps * kTokensPerWarp;
  const std::int64_t group_tokens = G > 0 ? T / G : T;
  const std::int64_t tiles_per_group = (group_tokens + tile - 1) / tile;
  const std::int64_t tiles = (G > 0 ? G : 1) * tiles_per_group;
  const Device dev = stream.device();
  Tensor part_counts, part_psum, part_z;
  if (counted) {
    part_counts = Tensor::empty({tiles, E}, DType::f32, dev, stream);
    part_psum = Tensor::empty({tiles, E}, DType::f32, dev, stream);
  }
  if (z_sum.defined()) part_z = Tensor::empty({tiles}, DType::f64, dev, stream);
  const std::size_t smem = static_cast<std::size_t>(warps * per_warp);
  route_kernel<<<static_cast<unsigned>(tiles), warps * 32, smem, stream.handle()>>>(
      ptr<const float>(logits), bias.defined() ? ptr<const float>(bias) : nullptr, E, options.top_k,
      options.score == RouteScore::softmax, options.renormalize, group_tokens, tiles_per_group,
      tile, ptr<float>(probs), ptr<std::int32_t>(experts), ptr<float>(weights),
      ptr<std::uint8_t>(kept), ptr<float>(lse), counted ? ptr<float>(part_counts) : nullptr,
      counted ? ptr<float>(part_psum) : nullptr, z_sum.defined() ? ptr<double>(part_z) : nullptr);
  check_launch();
  if (!counted && !z_sum.defined()) return;
  route_stats_kernel<<<grid_for(std::max<std::int64_t>(1, G * E)), kThreads, 0, stream.handle()>>>(
      counted ? ptr<const float>(part_counts) : nullptr,
      counted ? ptr<const float>(part_psum) : nullptr,
      z_sum.defined() ? ptr<const double>(part_z) : nullptr, G, E, tiles_per_group, options.z_scale,
      counted ? ptr<float>(counts) : nullptr, counted ? ptr<float>(prob_sum) : nullptr,
      z_sum.defined() ? ptr<double>(z_sum) : nullptr);
  check_launch();
}

void moe_drop_over_capacity_(const Tensor& probs, const Tensor& experts, std::int64_t capacity,
                             const Tensor& weights, const Tensor& kept, const Stream& stream) {
  const std::int64_t A = experts.numel(), E = probs.size(1);
  const int k = static_cast<int>(experts.size(1));
  if (A == 0) return;
  const Device dev = stream.device();
  Tensor keys = Tensor::empty({A}, DType::i64, dev, stream);
  Tensor keys_sorted = Tensor::empty({A}, DType::i64, dev, stream);
  Tensor ids = Tensor::empty({A}, DType::i32, dev, stream);
  Tensor ids_sorted = Tensor::empty({A}, DType::i32, dev, stream);
  capacity_keys_kernel<<<grid_for(A), kThreads, 0, stream.handle()>>>(
      ptr<const float>(probs), ptr<const std::int32_t>(experts), ptr<const std::uint8_t>(kept), A,
      E, k, ptr<std::uint64_t>(keys), ptr<std::int32_t>(ids));
  check_launch();
  const int end_bit = 32 + bits_for(static_cast<std::uint64_t>(E));
  std::size_t bytes = 0;
  QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, ptr<std::uint64_t>(keys), ptr<std::uint64_t>(keys_sorted),
      ptr<std::int32_t>(ids), ptr<std::int32_t>(ids_sorted), static_cast<int>(A), 0, end_bit,
      stream.handle()));
  Tensor temp = scratch(bytes, stream);
  QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.data_ptr(), bytes, ptr<std::uint64_t>(keys), ptr<std::uint64_t>(keys_sorted),
      ptr<std::int32_t>(ids), ptr<std::int32_t>(ids_sorted), static_cast<int>(A), 0, end_bit,
      stream.handle()));
  capacity_drop_kernel<<<grid_for(A), kThreads, 0, stream.handle()>>>(
      ptr<const std::uint64_t>(keys_sorted), ptr<const std::int32_t>(ids_sorted), A, E, capacity,
      ptr<float>(weights), ptr<std::uint8_t>(kept));
  check_launch();
}

void moe_route_backward(const Tensor& dweights, const Tensor& logits, const Tensor& probs,
                        const Tensor& experts, const Tensor& kept, const Tensor& lse,
                        const Tensor& counts, double aux_scale, double z_scale,
                        const RouteOptions& options, const Tensor& dlogits, const Stream& stream) {
  const std::int64_t T = logits.size(0), E = logits.size(1);
  if (T == 0) return;
  const std::int64_t group_tokens = counts.defined() ? T / counts.size(0) : T;
  const unsigned blocks = grid_for(T, kWarps);
  route_backward_kernel<<<blocks, kWarps * 32, 0, stream.handle()>>>(
      ptr<const float>(dweights), ptr<const float>(logits), ptr<const float>(probs),
      ptr<const std::int32_t>(experts), ptr<const std::uint8_t>(kept), ptr<const float>(lse),
      counts.defined() ? ptr<const float>(counts) : nullptr, T, E, options.top_k, group_tokens,
      options.score == RouteScore::softmax, options.renormalize, aux_scale, z_scale,
      ptr<float>(dlogits));
  check_launch();
}

void moe_permute(const Tensor& x, const Tensor& experts, const Tensor& kept, const Tensor& rows,
                 const Tensor& counts, const Tensor& offsets, const Tensor& source,
                 const Tensor& slot, const Stream& stream) {
  const std::int64_t A = experts.numel(), d = x.size(1), num_experts = counts.numel();
  const int k = static_cast<int>(experts.size(1));
  QUINTET_CUDA_CHECK(cudaMemsetAsync(counts.data_ptr(), 0,
                                     static_cast<std::size_t>(num_experts) * 8, stream.handle()));
  // offsets[0] = 0 and, after the counts, offsets[1 + e] = counts[0] + ... + counts[e].
  QUINTET_CUDA_CHECK(cudaMemsetAsync(
      offsets.data_ptr(), 0, static_cast<std::size_t>(num_experts + 1) * 8, stream.handle()));
  if (A == 0) return;
  const Device dev = stream.device();
  const auto E = static_cast<std::uint32_t>(num_experts);
  Tensor keys = Tensor::empty({A}, DType::i32, dev, stream);
  Tensor keys_sorted = Tensor::empty({A}, DType::i32, dev, stream);
  Tensor ids = Tensor::empty({A}, DType::i32, dev, stream);
  Tensor ids_sorted = Tensor::empty({A}, DType::i32, dev, stream);
  permute_keys_kernel<<<grid_for(A), kThreads, 0, stream.handle()>>>(
      ptr<const std::int32_t>(experts), ptr<const std::uint8_t>(kept), A, E,
      ptr<std::uint32_t>(keys), ptr<std::int32_t>(ids), ptr<unsigned long long>(counts));
  check_launch();
  std::size_t scan_bytes = 0;
  QUINTET_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, ptr<std::int64_t>(counts),
                                                   ptr<std::int64_t>(offsets) + 1,
                                                   static_cast<int>(num_experts), stream.handle()));
  const Tensor scan_temp = scratch(scan_bytes, stream);
  QUINTET_CUDA_CHECK(cub::DeviceScan::InclusiveSum(
      scan_temp.data_ptr(), scan_bytes, ptr<std::int64_t>(counts), ptr<std::int64_t>(offsets) + 1,
      static_cast<int>(num_experts), stream.handle()));
  const int end_bit = bits_for(E);
  std::size_t bytes = 0;
  QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, ptr<std::uint32_t>(keys), ptr<std::uint32_t>(keys_sorted),
      ptr<std::int32_t>(ids), ptr<std::int32_t>(ids_sorted), static_cast<int>(A), 0, end_bit,
      stream.handle()));
  Tensor temp = scratch(bytes, stream);
  QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.data_ptr(), bytes, ptr<std::uint32_t>(keys), ptr<std::uint32_t>(keys_sorted),
      ptr<std::int32_t>(ids), ptr<std::int32_t>(ids_sorted), static_cast<int>(A), 0, end_bit,
      stream.handle()));
  dispatch_compute(x.dtype(), "moe_permute", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = d > 0 ? ptr<const T>(x) : nullptr;
    T* rp = d > 0 ? ptr<T>(rows) : nullptr;
    if (vectorizable<T>(d, {xp, rp})) {
      permute_gather_vec_kernel<T><<<blocks_for_warp_rows(A), kThreads, 0, stream.handle()>>>(
          reinterpret_cast<const Vec16<T>*>(xp), ptr<const std::uint32_t>(keys_sorted),
          ptr<const std::int32_t>(ids_sorted), A, d / Vec16<T>::kCount, E, k,
          reinterpret_cast<Vec16<T>*>(rp), ptr<std::int32_t>(source), ptr<std::int32_t>(slot));
    } else {
      permute_gather_kernel<T><<<blocks_for_rows(A), row_threads(d), 0, stream.handle()>>>(
          xp, ptr<const std::uint32_t>(keys_sorted), ptr<const std::int32_t>(ids_sorted), A, d, E,
          k, rp, ptr<std::int32_t>(source), ptr<std::int32_t>(slot));
    }
  });
  check_launch();
}

void moe_unpermute(const Tensor& rows, const Tensor& slot, const Tensor& weights, const Tensor& y,
                   const Stream& stream) {
  const std::int64_t n = y.size(0), d = y.size(1);
  const int k = static_cast<int>(slot.size(1));
  if (n * d == 0) return;
  dispatch_compute(y.dtype(), "moe_unpermute", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* rp = rows.numel() > 0 ? ptr<const T>(rows) : nullptr;
    const float* wp = weights.defined() ? ptr<const float>(weights) : nullptr;
    if (vectorizable<T>(d, {rp, y.data_ptr()})) {
      unpermute_vec_kernel<T><<<blocks_for_warp_rows(n), kThreads, 0, stream.handle()>>>(
          reinterpret_cast<const Vec16<T>*>(rp), ptr<const std::int32_t>(slot), wp, n,
          d / Vec16<T>::kCount, k, reinterpret_cast<Vec16<T>*>(ptr<T>(y)));
    } else {
      unpermute_kernel<T><<<blocks_for_rows(n), row_threads(d), 0, stream.handle()>>>(
          rp, ptr<const std::int32_t>(slot), wp, n, d, k, ptr<T>(y));
    }
  });
  check_launch();
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                            const Tensor& source, const Tensor& weights, const Tensor& drows,
                            const Tensor& dweights, const Stream& stream) {
  const std::int64_t R = rows.size(0), d = dy.size(1);
  const int k = static_cast<int>(slot.size(1));
  QUINTET_CUDA_CHECK(cudaMemsetAsync(
      dweights.data_ptr(), 0, static_cast<std::size_t>(dweights.numel()) * 4, stream.handle()));
  if (R == 0) return;
  dispatch_compute(dy.dtype(), "moe_unpermute_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = d > 0 ? ptr<const T>(dy) : nullptr;
    const T* rp = d > 0 ? ptr<const T>(rows) : nullptr;
    T* drp = d > 0 ? ptr<T>(drows) : nullptr;
    if (vectorizable<T>(d, {gp, rp, drp})) {
      unpermute_backward_vec_kernel<T><<<blocks_for_warp_rows(R), kThreads, 0, stream.handle()>>>(
          reinterpret_cast<const Vec16<T>*>(gp), reinterpret_cast<const Vec16<T>*>(rp),
          ptr<const std::int32_t>(source), ptr<const float>(weights), R, d / Vec16<T>::kCount, k,
          reinterpret_cast<Vec16<T>*>(drp), ptr<float>(dweights));
    } else {
      unpermute_backward_kernel<T><<<blocks_for_rows(R), row_threads(d), 0, stream.handle()>>>(
          gp, rp, ptr<const std::int32_t>(source), ptr<const float>(weights), R, d, k, drp,
          ptr<float>(dweights));
    }
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
