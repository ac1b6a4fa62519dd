// Scaled dot-product attention on the GPU, flash-attention style: the scores are never stored;
// each block streams tiles of the other side through shared memory with an online softmax, and
// the backward recomputes the probabilities from the saved log-sum-exp.
//
// This is the correct-first SIMT version (f32 arithmetic for bf16 and f32 storage), for any
// head_dim up to 256 and any sequence lengths, offsets and mask. Work split:
//   forward  - a block owns 32 query rows (8 warps x 4 rows); lane j of a warp scores key j of a
//              32-key tile, then the warp accumulates P·V with lanes over head_dim.
//   backward - delta = rowsum(dout * out); then dq per query block (loop over key tiles) and dk,
//              dv per key block (loop over query tiles): no atomics, deterministic.
// Shared-memory rows have an odd pitch so that lane-per-row reads are free of bank conflicts.
//
// The entry points below dispatch on options.kernel: cuDNN's fused attention
// (lib/nn/cudnn/attention_cudnn.cpp; automatic: where it runs the call), the tensor-core GEMM path
// of attention_gemm.cu (automatic: when head_dim is a multiple of 16 bytes) or these kernels.
#include <string>

#include "nn/cuda/attention_gemm.hpp"
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"
#include "quintet/core/config.hpp"
#if QUINTET_HAS_CUDNN
#include "nn/cudnn/attention_cudnn.hpp"
#endif

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

constexpr int kTile = 32;  // query rows per block, keys per tile (one per lane)
constexpr int kWarps = 8;
constexpr int kRows = kTile / kWarps;  // rows of the block's own side per warp
constexpr int kBlock = kWarps * 32;
constexpr int kMaxHeadDim = 256;

struct AttnShape {
  std::int64_t sq, sk;  // query and key rows per (batch, head)
  int d;                // head_dim
  int pitch;            // shared-memory row pitch (odd, >= d)
  std::int64_t tiles;   // tiles of this kernel's own side per (batch, head)
  std::int64_t group;   // query heads per key/value head (grouped-query attention)
  std::int64_t q_offset, k_offset;
  bool causal;
  float scale;
};

__device__ __forceinline__ bool visible(const AttnShape& a, std::int64_t i, std::int64_t j) {
  return !a.causal || a.k_offset + j <= a.q_offset + i;
}

// The first key row past the last one any of query rows [i0, i0 + kTile) can see (may be <= 0).
__device__ __forceinline__ std::int64_t key_end(const AttnShape& a, std::int64_t i0) {
  if (!a.causal) return a.sk;
  const std::int64_t ilast = (i0 + kTile < a.sq ? i0 + kTile : a.sq) - 1;
  const std::int64_t jend = a.q_offset + ilast - a.k_offset + 1;
  return jend < a.sk ? jend : a.sk;
}

// Rows [row0, row0 + kTile) of a [rows, d] matrix into shared [kTile][pitch] as float times mul;
// rows past the end are zero.
template <class T>
__device__ void load_tile(float* dst, const T* src, std::int64_t row0, std::int64_t rows, int d,
                          int pitch, float mul) {
  for (int idx = threadIdx.x; idx < kTile * d; idx += blockDim.x) {
    const int r = idx / d, c = idx - r * d;
    const std::int64_t g = row0 + r;
    dst[r * pitch + c] = g < rows ? to_float(src[g * d + c]) * mul : 0.0f;
  }
}

// kDL = head_dim elements per lane (head_dim <= 32 * kDL).
template <class T, int kDL>
__global__ void __launch_bounds__(kBlock)
    attention_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, AttnShape a) {
  extern __shared__ float smem[];
  float* qs = smem;  // q * scale
  float* ks = qs + kTile * a.pitch;
  float* vs = ks + kTile * a.pitch;
  const std::int64_t bh = blockIdx.x / a.tiles;
  const std::int64_t i0 = (a.tiles - 1 - blockIdx.x % a.tiles) * kTile;  // longest rows first
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = a.d;
  q += bh * a.sq * d;
  out += bh * a.sq * d;
  lse += bh * a.sq;
  k += bh / a.group * a.sk * d;  // the key/value head of this query head's group
  v += bh / a.group * a.sk * d;

  load_tile(qs, q, i0, a.sq, d, a.pitch, a.scale);
  float m[kRows], l[kRows], acc[kRows][kDL];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < kDL; ++t) acc[r][t] = 0.0f;
  }
  const float* qw = qs + warp * kRows * a.pitch;
  const std::int64_t kend = key_end(a, i0);
  for (std::int64_t j0 = 0; j0 < kend; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and qs is written, on the first pass)
    load_tile(ks, k, j0, a.sk, d, a.pitch, 1.0f);
    load_tile(vs, v, j0, a.sk, d, a.pitch, 1.0f);
    __syncthreads();
    float s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = 0.0f;
    const float* kl = ks + lane * a.pitch;
    for (int c = 0; c < d; ++c) {
      const float kv = kl[c];
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] += qw[r * a.pitch + c] * kv;
    }
    const std::int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const std::int64_t i = i0 + warp * kRows + r;
      const bool ok = j < a.sk && i < a.sq && visible(a, i, j);
      const float sv = ok ? s[r] : -INFINITY;
      const float mnew = fmaxf(m[r], warp_max(sv));
      float p = 0.0f, corr = 1.0f;
      if (mnew != -INFINITY) {  // else nothing is visible yet: l and acc stay 0
        p = ok ? expf(sv - mnew) : 0.0f;
        corr = expf(m[r] - mnew);
      }
      l[r] = l[r] * corr + warp_sum(p);
      m[r] = mnew;
      s[r] = p;
#pragma unroll
      for (int t = 0; t < kDL; ++t) acc[r][t] *= corr;
    }
    for (int jj = 0; jj < kTile; ++jj) {
      float vv[kDL];
#pragma unroll
      for (int t = 0; t < kDL; ++t) {
        const int c = lane + 32 * t;
        vv[t] = c < d ? vs[jj * a.pitch + c] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float pj = __shfl_sync(0xffffffffu, s[r], jj);
#pragma unroll
        for (int t = 0; t < kDL; ++t) acc[r][t] += pj * vv[t];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t i = i0 + warp * kRows + r;
    if (i >= a.sq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int t = 0; t < kDL; ++t) {
      const int c = lane + 32 * t;
      if (c < d) out[i * d + c] = from_float<T>(acc[r][t] * inv);
    }
    if (lane == 0) lse[i] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// delta[i] = sum_c dout[i, c] * out[i, c], one warp per row.
template <class T>
__global__ void attention_delta_kernel(const T* dout, const T* out, float* delta, std::int64_t rows,
                                       int d) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (std::int64_t r =
           blockIdx.x * static_cast<std::int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       r < rows; r += warps) {
    float s = 0.0f;
    for (int c = lane; c < d; c += 32) s += to_float(dout[r * d + c]) * to_float(out[r * d + c]);
    s = warp_sum(s);
    if (lane == 0) delta[r] = s;
  }
}

// dq = scale * sum_j dS_ij k_j with P = exp(s - lse), dS = P * (dout·v - delta). Per query block.
template <class T, int kDL>
__global__ void __launch_bounds__(kBlock)
    attention_dq_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                        const float* delta, T* dq, AttnShape a) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* dos = qs + kTile * a.pitch;
  float* ks = dos + kTile * a.pitch;
  float* vs = ks + kTile * a.pitch;
  const std::int64_t bh = blockIdx.x / a.tiles;
  const std::int64_t i0 = (a.tiles - 1 - blockIdx.x % a.tiles) * kTile;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = a.d;
  q += bh * a.sq * d;
  dout += bh * a.sq * d;
  dq += bh * a.sq * d;
  lse += bh * a.sq;
  delta += bh * a.sq;
  k += bh / a.group * a.sk * d;
  v += bh / a.group * a.sk * d;

  load_tile(qs, q, i0, a.sq, d, a.pitch, a.scale);
  load_tile(dos, dout, i0, a.sq, d, a.pitch, 1.0f);
  float row_lse[kRows], row_delta[kRows], acc[kRows][kDL];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t i = i0 + warp * kRows + r;
    row_lse[r] = i < a.sq ? lse[i] : -INFINITY;
    row_delta[r] = i < a.sq ? delta[i] : 0.0f;
#pragma unroll
    for (int t = 0; t < kDL; ++t) acc[r][t] = 0.0f;
  }
  const float* qw = qs + warp * kRows * a.pitch;
  const float* dow = dos + warp * kRows * a.pitch;
  const std::int64_t kend = key_end(a, i0);
  for (std::int64_t j0 = 0; j0 < kend; j0 += kTile) {
    __syncthreads();
    load_tile(ks, k, j0, a.sk, d, a.pitch, 1.0f);
    load_tile(vs, v, j0, a.sk, d, a.pitch, 1.0f);
    __syncthreads();
    float s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = 0.0f;
    const float* kl = ks + lane * a.pitch;
    const float* vl = vs + lane * a.pitch;
    for (int c = 0; c < d; ++c) {
      const float kv = kl[c], vv = vl[c];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r] += qw[r * a.pitch + c] * kv;
        dp[r] += dow[r * a.pitch + c] * vv;
      }
    }
    const std::int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const std::int64_t i = i0 + warp * kRows + r;
      const bool ok = j < a.sk && i < a.sq && visible(a, i, j) && row_lse[r] != -INFINITY;
      const float p = ok ? expf(s[r] - row_lse[r]) : 0.0f;
      s[r] = p * (dp[r] - row_delta[r]);  // dS
    }
    for (int jj = 0; jj < kTile; ++jj) {
      float kk[kDL];
#pragma unroll
      for (int t = 0; t < kDL; ++t) {
        const int c = lane + 32 * t;
        kk[t] = c < d ? ks[jj * a.pitch + c] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float ds = __shfl_sync(0xffffffffu, s[r], jj);
#pragma unroll
        for (int t = 0; t < kDL; ++t) acc[r][t] += ds * kk[t];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t i = i0 + warp * kRows + r;
    if (i >= a.sq) continue;
#pragma unroll
    for (int t = 0; t < kDL; ++t) {
      const int c = lane + 32 * t;
      if (c < d) dq[i * d + c] = from_float<T>(acc[r][t] * a.scale);
    }
  }
}

// dv_j = sum_i P_ij dout_i, dk_j = scale * sum_i dS_ij q_i. Per key block (32 keys, 4 per warp) of
// one key/value head, summed over the query heads of its group; lane i of a warp takes query i of
// each 32-query tile.
template <class T, int kDL>
__global__ void __launch_bounds__(kBlock)
    attention_dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                         const float* delta, T* dk, T* dv, AttnShape a) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + kTile * a.pitch;
  float* qs = vs + kTile * a.pitch;  // q * scale
  float* dos = qs + kTile * a.pitch;
  float* lses = dos + kTile * a.pitch;
  float* deltas = lses + kTile;
  const std::int64_t bh = blockIdx.x / a.tiles;            // the key/value head
  const std::int64_t j0 = (blockIdx.x % a.tiles) * kTile;  // causal: the first keys do the most
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = a.d;
  k += bh * a.sk * d;
  v += bh * a.sk * d;
  dk += bh * a.sk * d;
  dv += bh * a.sk * d;

  load_tile(ks, k, j0, a.sk, d, a.pitch, 1.0f);
  load_tile(vs, v, j0, a.sk, d, a.pitch, 1.0f);
  float gk[kRows][kDL], gv[kRows][kDL];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < kDL; ++t) gk[r][t] = gv[r][t] = 0.0f;
  }
  // The first query that sees key j0: q_offset + i >= k_offset + j0.
  std::int64_t istart = 0;
  if (a.causal) {
    const std::int64_t imin = a.k_offset + j0 - a.q_offset;
    istart = imin > 0 ? imin / kTile * kTile : 0;
  }
  const float* kw = ks + warp * kRows * a.pitch;
  const float* vw = vs + warp * kRows * a.pitch;
  // The query tiles from istart on of each query head of the group, one head after the other.
  const std::int64_t per_head = istart < a.sq ? (a.sq - istart + kTile - 1) / kTile : 0;
  for (std::int64_t qi = 0; qi < a.group * per_head; ++qi) {
    const std::int64_t qh = bh * a.group + qi / per_head;
    const std::int64_t i0 = istart + (qi % per_head) * kTile;
    const T* qg = q + qh * a.sq * d;
    const T* dog = dout + qh * a.sq * d;
    const float* lseg = lse + qh * a.sq;
    const float* deltag = delta + qh * a.sq;
    __syncthreads();
    load_tile(qs, qg, i0, a.sq, d, a.pitch, a.scale);
    load_tile(dos, dog, i0, a.sq, d, a.pitch, 1.0f);
    if (threadIdx.x < kTile) {
      const std::int64_t i = i0 + threadIdx.x;
      lses[threadIdx.x] = i < a.sq ? lseg[i] : -INFINITY;
      deltas[threadIdx.x] = i < a.sq ? deltag[i] : 0.0f;
    }
    __syncthreads();
    float s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = 0.0f;
    const float* ql = qs + lane * a.pitch;
    const float* dol = dos + lane * a.pitch;
    for (int c = 0; c < d; ++c) {
      const float qv = ql[c], dov = dol[c];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r] += kw[r * a.pitch + c] * qv;
        dp[r] += vw[r * a.pitch + c] * dov;
      }
    }
    const std::int64_t i = i0 + lane;
    const float li = lses[lane], di = deltas[lane];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const std::int64_t j = j0 + warp * kRows + r;
      const bool ok = i < a.sq && j < a.sk && visible(a, i, j) && li != -INFINITY;
      const float p = ok ? expf(s[r] - li) : 0.0f;
      s[r] = p;
      dp[r] = p * (dp[r] - di);  // dS
    }
    for (int ii = 0; ii < kTile; ++ii) {
      float qq[kDL], oo[kDL];
#pragma unroll
      for (int t = 0; t < kDL; ++t) {
        const int c = lane + 32 * t;
        qq[t] = c < d ? qs[ii * a.pitch + c] : 0.0f;
        oo[t] = c < d ? dos[ii * a.pitch + c] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float p = __shfl_sync(0xffffffffu, s[r], ii);
        const float ds = __shfl_sync(0xffffffffu, dp[r], ii);
#pragma unroll
        for (int t = 0; t < kDL; ++t) {
          gv[r][t] += p * oo[t];
          gk[r][t] += ds * qq[t];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t j = j0 + warp * kRows + r;
    if (j >= a.sk) continue;
#pragma unroll
    for (int t = 0; t < kDL; ++t) {
      const int c = lane + 32 * t;
      if (c < d) {
        dk[j * d + c] = from_float<T>(gk[r][t]);
        dv[j * d + c] = from_float<T>(gv[r][t]);
      }
    }
  }
}

AttnShape make_shape(const Tensor& q, const Tensor& k, const AttentionOptions& o) {
  QUINTET_CHECK(q.size(3) <= kMaxHeadDim,
                "attention: head_dim = {} (q {}); the CUDA attention kernel supports head_dim up "
                "to {}; split the heads or run on the CPU",
                q.size(3), shape_str(q.shape()), kMaxHeadDim);
  AttnShape a;
  a.sq = q.size(2);
  a.sk = k.size(2);
  a.d = static_cast<int>(q.size(3));
  a.pitch = a.d | 1;
  a.tiles = 0;
  a.group = k.size(1) > 0 ? q.size(1) / k.size(1) : 1;
  a.q_offset = o.q_offset;
  a.k_offset = o.k_offset;
  a.causal = o.causal;
  a.scale = o.scale;
  return a;
}

std::size_t tiles_bytes(const AttnShape& a, int tiles, int extra_floats) {
  return (static_cast<std::size_t>(tiles) * kTile * a.pitch + extra_floats) * sizeof(float);
}

// Launches kernel<<<blocks, kBlock, smem>>>, raising the shared-memory limit when needed.
template <class Kernel, class... Args>
void launch(Kernel kernel, std::int64_t blocks, std::size_t smem, const Stream& stream,
            Args... args) {
  QUINTET_CHECK(blocks <= 0x7fffffff, "attention: {} thread blocks exceed the grid limit", blocks);
  if (smem > 48 * 1024) {
    QUINTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(blocks), kBlock, smem, stream.handle()>>>(args...);
  check_launch();
}

// Calls f(std::integral_constant<int, kDL>) for the head_dim.
template <class F>
void dispatch_head_dim(int d, F&& f) {
  if (d <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (d <= 128) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

bool use_gemm(const Tensor& q, const AttentionOptions& o) {
  switch (o.kernel) {
    case AttentionKernel::gemm:
      return true;
    case AttentionKernel::simt:
      return false;
    case AttentionKernel::automatic:
    case AttentionKernel::cudnn:  // only here when cuDNN declined an automatic call
      break;
  }
  return attention_gemm_preferred(q);
}

// True when cuDNN ran the call (run(&why) queues it or says why not): for kernel = cudnn, and for
// automatic first. An explicit cudnn that cuDNN cannot run throws InvalidArgument with the reason.
template <class Run>
bool ran_on_cudnn(const AttentionOptions& o, const char* op, Run&& run) {
  if (o.kernel != AttentionKernel::cudnn && o.kernel != AttentionKernel::automatic) return false;
  std::string why;
#if QUINTET_HAS_CUDNN
  if (run(&why)) return true;
#else
  (void)run;
  why = "this build of Quintet has no cuDNN (configure with QUINTET_WITH_CUDNN and cuDNN 9)";
#endif
  QUINTET_CHECK(o.kernel != AttentionKernel::cudnn,
                "{}: kernel = cudnn cannot run this call: {}; use AttentionKernel::automatic to "
                "fall back to Quintet's own kernels",
                op, why);
  return false;
}

// Our own kernels read and write contiguous tensors; cuDNN takes strided operands in place.
// Where a strided operand reaches our kernels, it is copied: inputs to contiguous copies, an
// output computed into a contiguous slot and copied back by copy_back.
Tensor output_slot(const Tensor& out, const Stream& stream) {
  return out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device(), stream);
}
void copy_back(const Tensor& slot, const Tensor& out, const Stream& stream) {
  if (!out.is_contiguous()) Tensor(out).copy_(slot, stream);  // a handle: writes out's storage
}

void attention_forward_own(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionOptions& options, const Tensor& out, const Tensor& lse,
                           const Stream& stream) {
  if (use_gemm(q, options)) {
    attention_forward_gemm(q, k, v, options, out, lse, stream);
    return;
  }
  AttnShape a = make_shape(q, k, options);
  const std::int64_t bh = q.size(0) * q.size(1);
  if (bh == 0 || a.sq == 0) return;
  a.tiles = (a.sq + kTile - 1) / kTile;
  dispatch_compute(q.dtype(), "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_head_dim(a.d, [&](auto dl) {
      constexpr int kDL = decltype(dl)::value;
      launch(attention_forward_kernel<T, kDL>, bh * a.tiles, tiles_bytes(a, 3, 0), stream,
             ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(out), ptr<float>(lse), a);
    });
  });
}

void attention_backward_own(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                            const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const Stream& stream) {
  if (use_gemm(q, options)) {
    attention_backward_gemm(dout, q, k, v, out, lse, options, dq, dk, dv, stream);
    return;
  }
  AttnShape a = make_shape(q, k, options);
  const std::int64_t bh = q.size(0) * q.size(1);
  if (bh == 0) return;
  if (a.sq == 0) {  // no query: the key gradients are zero
    QUINTET_CUDA_CHECK(cudaMemsetAsync(dk.data_ptr(), 0, dk.nbytes(), stream.handle()));
    QUINTET_CUDA_CHECK(cudaMemsetAsync(dv.data_ptr(), 0, dv.nbytes(), stream.handle()));
    return;
  }
  const Tensor delta = Tensor::empty({bh * a.sq}, DType::f32, stream.device(), stream);
  dispatch_compute(q.dtype(), "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t rows = bh * a.sq;
    attention_delta_kernel<T><<<grid_for(rows * 32), kThreads, 0, stream.handle()>>>(
        ptr<T>(dout), ptr<T>(out), ptr<float>(delta), rows, a.d);
    check_launch();
    dispatch_head_dim(a.d, [&](auto dl) {
      constexpr int kDL = decltype(dl)::value;
      AttnShape aq = a;
      aq.tiles = (a.sq + kTile - 1) / kTile;
      launch(attention_dq_kernel<T, kDL>, bh * aq.tiles, tiles_bytes(aq, 4, 0), stream, ptr<T>(q),
             ptr<T>(k), ptr<T>(v), ptr<T>(dout), ptr<float>(lse), ptr<float>(delta), ptr<T>(dq),
             aq);
      if (a.sk == 0) return;
      AttnShape ak = a;
      ak.tiles = (a.sk + kTile - 1) / kTile;
      launch(attention_dkv_kernel<T, kDL>, bh / a.group * ak.tiles, tiles_bytes(ak, 4, 2 * kTile),
             stream, ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dout), ptr<float>(lse),
             ptr<float>(delta), ptr<T>(dk), ptr<T>(dv), ak);
    });
  });
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionOptions& options, const Tensor& out, const Tensor& lse,
                       const Stream& stream) {
  if (ran_on_cudnn(options, "attention_forward", [&](std::string* why) {
#if QUINTET_HAS_CUDNN
        return attention_forward_cudnn(q, k, v, options, out, lse, stream, why);
#else
        (void)why;
        return false;
#endif
      })) {
    return;
  }
  const Tensor o = output_slot(out, stream);
  attention_forward_own(q.contiguous(stream), k.contiguous(stream), v.contiguous(stream), options,
                        o, lse, stream);
  copy_back(o, out, stream);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const Stream& stream) {
  if (ran_on_cudnn(options, "attention_backward", [&](std::string* why) {
#if QUINTET_HAS_CUDNN
        return attention_backward_cudnn(dout, q, k, v, out, lse, options, dq, dk, dv, stream, why);
#else
        (void)why;
        return false;
#endif
      })) {
    return;
  }
  const Tensor gq = output_slot(dq, stream), gk = output_slot(dk, stream),
               gv = output_slot(dv, stream);
  attention_backward_own(dout.contiguous(stream), q.contiguous(stream), k.contiguous(stream),
                         v.contiguous(stream), out.contiguous(stream), lse, options, gq, gk, gv,
                         stream);
  copy_back(gq, dq, stream);
  copy_back(gk, dk, stream);
  copy_back(gv, dv, stream);
}

namespace {

template <class T>
__global__ void attention_merge_kernel(T* out, float* lse, const T* out_b, const float* lse_b,
                                       std::int64_t rows, std::int64_t d) {
  for (std::int64_t i = global_index(); i < rows * d; i += global_stride()) {
    const std::int64_t r = i / d;
    const float a = lse[r], b = lse_b[r];
    const float m = fmaxf(a, b);
    if (m == -INFINITY) continue;
    const float wa = expf(a - m), wb = expf(b - m);
    out[i] = from_float<T>((to_float(out[i]) * wa + to_float(out_b[i]) * wb) / (wa + wb));
  }
}

__global__ void attention_merge_lse_kernel(float* lse, const float* lse_b, std::int64_t rows) {
  for (std::int64_t r = global_index(); r < rows; r += global_stride()) {
    const float a = lse[r], b = lse_b[r];
    const float m = fmaxf(a, b);
    if (m == -INFINITY) continue;
    lse[r] = m + logf(expf(a - m) + expf(b - m));
  }
}

}  // namespace

void attention_merge_(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                      const Tensor& lse_b, const Stream& stream) {
  const std::int64_t rows = lse.numel(), d = out.size(3);
  if (rows == 0 || d == 0) return;
  dispatch_compute(out.dtype(), "attention_merge_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The outputs first (they read the old lse), then the lse, on the same stream.
    attention_merge_kernel<T><<<grid_for(rows * d), kThreads, 0, stream.handle()>>>(
        ptr<T>(out), ptr<float>(lse), ptr<T>(out_b), ptr<float>(lse_b), rows, d);
    attention_merge_lse_kernel<<<grid_for(rows), kThreads, 0, stream.handle()>>>(
        ptr<float>(lse), ptr<float>(lse_b), rows);
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
