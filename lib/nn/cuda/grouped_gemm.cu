// The grouped GEMM kernels of the grouped linear ops (quintet/nn/grouped_linear.hpp): one launch
// per op over every group, the groups' row offsets read from device memory, so no host
// synchronisation. A persistent grid walks the output tiles of all groups (grouped_gemm_tiles.hpp).
//
// Two kernels here (a third, for Hopper, in grouped_gemm_sm90a.cu; what they share in
// grouped_gemm_common.cuh):
//   - tensor cores (bf16 in, f32 accumulation; sm_80 and later): 128 x 128 x 32 tiles, 8 warps of
//     64 x 32, mma.sync m16n8k16 fed by ldmatrix from a 4-stage cp.async shared-memory pipeline.
//     Each operand tile is copied in its global layout (16-byte chunks, zero-filled past the
//     matrix) and ldmatrix transposes where the MMA wants the other one. It needs the
//     contiguous dimension of every operand to be a multiple of 8 elements (in and out % 8 == 0,
//     16-byte aligned rows) and 16-byte aligned base pointers.
//   - SIMT (f32, and bf16 shapes the tensor-core kernel does not take): 64 x 64 x 16 tiles, scalar
//     predicated loads, 4 x 4 outputs per thread, accumulated in f32.
// and their FP8 forms (the grouped FP8 ops; below, "FP8"): the same tiles and pipeline with
// mma.sync m16n8k32 on FP8 bytes, and a SIMT kernel. The FP8 mma.sync is native on sm_89 (Ada);
// on sm_90 (Hopper) ptxas emulates it by converting to f16 for the f16 tensor cores
// (NVIDIA/cutlass#1986: no FP8 rate, and more registers: the FP8 kernels spill 72-104 bytes a
// thread under the 2-CTA bound where the bf16 one spills none). Hopper's FP8 rate needs wgmma.
//
// The three products, row-major, with M x N the output and K the reduction:
//   forward  y_g  [m_g, out] = x_g [m_g, in] · w_gᵀ    A = x (K-contiguous), B = w_g (K-contiguous)
//   dgrad    dx_g [m_g, in]  = dy_g [m_g, out] · w_g   A = dy (K-contiguous), B = w_g
//   (N-contiguous) wgrad    dw_g [out, in] += dy_gᵀ · x_g, K = m_g    A = dy (M-contiguous), B = x
//   (N-contiguous)
// An operand is "K-contiguous" when its elements (mn, k) are at p[mn * ld + k], "MN-contiguous"
// when at p[k * ld + mn].
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/grouped_gemm_common.cuh"
#include "nn/cuda/grouped_gemm_tiles.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;
using namespace grouped;

namespace {

// ---- SIMT kernel ----------------------------------------------------------------------------

constexpr int kSimtTile = 64, kSimtK = 16, kSimtThreads = 256;

// Element (mn, k) of an operand (zero outside its extents).
template <bool KContiguous, class T>
__device__ __forceinline__ float load(const Operand<T>& o, std::int64_t mn, std::int64_t k) {
  if (mn >= o.mn_extent || k >= o.k_extent) return 0.0f;
  return to_float(KContiguous ? o.p[mn * o.ld + k] : o.p[k * o.ld + mn]);
}

// Stores (or, for wgrad, adds) a SIMT thread's 4 x 4 results, each times alpha (1 for bf16 / f32;
// the inverse scales for FP8), at rows ty * 4 + i and columns tx * 4 + j of tile t.
template <Product P, class Params>
__device__ __forceinline__ void store_simt_tile(const Params& prm, const Tile& t,
                                                const float (&acc)[4][4], int tx, int ty,
                                                float alpha) {
  std::int64_t ldc = 0;
  auto* c = group_output<P>(prm, t, ldc);
  for (int i = 0; i < 4; ++i) {
    const std::int64_t r = ty * 4 + i;
    if (r >= t.tile_rows) break;
    for (int j = 0; j < 4; ++j) {
      const std::int64_t col = tx * 4 + j;
      if (col < t.tile_cols) put<P>(c + (t.m0 + r) * ldc + t.n0 + col, alpha * acc[i][j]);
    }
  }
}

template <Product P, class T, class Out>
__global__ void __launch_bounds__(kSimtThreads)
    grouped_simt_kernel(const GroupedParams<T, Out> prm) {
  constexpr bool kAK = a_k_contiguous<P>(), kBK = b_k_contiguous<P>();
  __shared__ float as[kSimtK][kSimtTile];                  // [k][m]
  __shared__ float bs[kSimtK][kSimtTile];                  // [k][n]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // outputs m = ty*4 + i, n = tx*4 + j
  for_each_tile<P>(prm, [&](const Tile& t, const Operand<T>& a, const Operand<T>& b) {
    float acc[4][4] = {};
    for (std::int64_t k0 = 0; k0 < a.k_extent; k0 += kSimtK) {
      // Each thread loads 4 elements of each tile; consecutive threads take consecutive k for a
      // K-contiguous operand, consecutive m / n otherwise (coalesced either way).
      for (int e = threadIdx.x; e < kSimtK * kSimtTile; e += kSimtThreads) {
        const int k = kAK ? e % kSimtK : e / kSimtTile, mn = kAK ? e / kSimtK : e % kSimtTile;
        as[k][mn] = load<kAK>(a, t.m0 + mn, k0 + k);
      }
      for (int e = threadIdx.x; e < kSimtK * kSimtTile; e += kSimtThreads) {
        const int k = kBK ? e % kSimtK : e / kSimtTile, mn = kBK ? e / kSimtK : e % kSimtTile;
        bs[k][mn] = load<kBK>(b, t.n0 + mn, k0 + k);
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kSimtK; ++k) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = as[k][ty * 4 + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = bs[k][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
      }
      __syncthreads();  // the tiles are overwritten next
    }
    store_simt_tile<P>(prm, t, acc, tx, ty, 1.0f);
  });
}

// ---- tensor-core kernel (bf16) --------------------------------------------------------------

constexpr int kBM = 128, kBN = 128, kBK = 32;  // the CTA's output tile and k step
constexpr int kStages = 4;                     // cp.async pipeline depth
constexpr int kWarpsM = 2, kWarpsN = 4;        // 8 warps, each 64 x 32 of the tile
constexpr int kMmaThreads = kWarpsM * kWarpsN * 32;
constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;  // 64, 32
constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;     // 4 m16 x 4 n8 MMAs per k16
constexpr int kPad = 8;  // elements of padding per shared row: rows 16-byte aligned, and the 8
                         // rows one ldmatrix reads fall in distinct banks

// Shared elements of one stage of an operand tile of mn x kBK: K-contiguous [mn][kBK + pad],
// MN-contiguous [kBK][mn + pad].
template <bool KContiguous>
constexpr int stage_elems(int mn) {
  return KContiguous ? mn * (kBK + kPad) : kBK * (mn + kPad);
}
template <bool KContiguous>
constexpr int shared_ld(int mn) {
  return KContiguous ? kBK + kPad : mn + kPad;
}

// Four 8x8 b16 matrices from shared memory, lane l giving the address of row l % 8 of matrix
// l / 8; Trans loads each transposed.
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* p) {
#if __CUDA_ARCH__ >= 800
  if (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
  }
#endif
}

// d += a · b for one m16n8k16 bf16 MMA with f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Copies the k-step at k0 of an operand's mn x kBK tile (rows mn0.. of the operand) into shared
// s, as 16-byte chunks of 8 elements along the contiguous dimension, zero past the extents (the
// contiguous extent is a multiple of 8, so a chunk is wholly in or out).
template <bool KContiguous, int MN>
__device__ __forceinline__ void load_stage(bf16* s, const Operand<bf16>& o, std::int64_t mn0,
                                           std::int64_t k0) {
  constexpr int kChunks = MN * kBK / 8;
  static_assert(kChunks % kMmaThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < kChunks / kMmaThreads; ++i) {
    const int chunk = threadIdx.x + i * kMmaThreads;
    int mn, k;  // the chunk's first element within the tile
    if (KContiguous) {
      mn = chunk / (kBK / 8);
      k = (chunk % (kBK / 8)) * 8;
    } else {
      k = chunk / (MN / 8);
      mn = (chunk % (MN / 8)) * 8;
    }
    const std::int64_t gmn = mn0 + mn, gk = k0 + k;
    const bool valid = gmn < o.mn_extent && gk < o.k_extent;
    const bf16* src = valid ? (KContiguous ? o.p + gmn * o.ld + gk : o.p + gk * o.ld + gmn) : o.p;
    bf16* dst = KContiguous ? s + mn * (kBK + kPad) + k : s + k * (MN + kPad) + mn;
    cp_async_16(dst, src, valid);
  }
}

// The A fragments (kFragsM of m16 x k16) of a warp for the k16 step kk of a shared stage.
// A K-contiguous stage is [m][k]: matrix i of ldmatrix is rows m + (i % 2) * 8, columns
// k + (i / 2) * 8, as the MMA's a0..a3 are. An M-contiguous one is [k][m], loaded transposed:
// matrix i is stored rows k + (i / 2) * 8, columns m + (i % 2) * 8.
template <bool KContiguous>
__device__ __forceinline__ void load_a(unsigned (&a)[kFragsM][4], const bf16* s, int warp_m0,
                                       int kk) {
  const int lane = threadIdx.x % 32, i = lane / 8, r = lane % 8;
#pragma unroll
  for (int f = 0; f < kFragsM; ++f) {
    const int m0 = warp_m0 + f * 16;
    const bf16* p = KContiguous ? s + (m0 + r + (i % 2) * 8) * (kBK + kPad) + kk + (i / 2) * 8
                                : s + (kk + r + (i / 2) * 8) * (kBM + kPad) + m0 + (i % 2) * 8;
    ldmatrix_x4<!KContiguous>(a[f], p);
  }
}

// The B fragments (kFragsN of k16 x n8) of a warp, two n8 fragments per ldmatrix: matrix i holds
// b0 (i even) or b1 (i odd) of fragment pair member i / 2. A K-contiguous stage is [n][k]: matrix
// i is rows n + (i / 2) * 8, columns k + (i % 2) * 8. An N-contiguous one is [k][n], loaded
// transposed: matrix i is stored rows k + (i % 2) * 8, columns n + (i / 2) * 8.
template <bool KContiguous>
__device__ __forceinline__ void load_b(unsigned (&b)[kFragsN][2], const bf16* s, int warp_n0,
                                       int kk) {
  const int lane = threadIdx.x % 32, i = lane / 8, r = lane % 8;
#pragma unroll
  for (int f = 0; f < kFragsN; f += 2) {
    const int n0 = warp_n0 + f * 8;
    const bf16* p = KContiguous ? s + (n0 + r + (i / 2) * 8) * (kBK + kPad) + kk + (i % 2) * 8
                                : s + (kk + r + (i % 2) * 8) * (kBN + kPad) + n0 + (i / 2) * 8;
    unsigned q[4];
    ldmatrix_x4<!KContiguous>(q, p);
    b[f][0] = q[0];
    b[f][1] = q[1];
    b[f + 1][0] = q[2];
    b[f + 1][1] = q[3];
  }
}

template <Product P>
constexpr int mma_stage_elems() {
  return stage_elems<a_k_contiguous<P>()>(kBM) + stage_elems<b_k_contiguous<P>()>(kBN);
}
template <Product P>
constexpr std::size_t mma_shared_bytes() {
  return static_cast<std::size_t>(kStages) * mma_stage_elems<P>() * sizeof(bf16);
}

// The epilogue of the tensor-core kernels: accumulators d0, d1 of a warp's fragment (i, j) are
// output row warp_m0 + 16 i + lane / 4, columns warp_n0 + 8 j + 2 (lane % 4) and the next one; d2,
// d3 the same 8 rows down; each times alpha (1, exact, for bf16; the inverse scales for FP8). A
// pair inside the tile is written at once (the column is even, and so is ldc: 4-byte aligned for
// bf16, 8-byte for f32, whose base the host checked).
template <Product P, class Params>
__device__ __forceinline__ void store_accumulators(const Params& prm, const Tile& t,
                                                   const float (&acc)[kFragsM][kFragsN][4],
                                                   int warp_m0, int warp_n0, float alpha) {
  const int lane = threadIdx.x % 32;
  std::int64_t ldc = 0;
  auto* const c = group_output<P>(prm, t, ldc);
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_m0 + i * 16 + lane / 4 + h * 8;
        const int col = warp_n0 + j * 8 + (lane % 4) * 2;
        if (r >= t.tile_rows || col >= t.tile_cols) continue;
        auto* const p = c + (t.m0 + r) * ldc + t.n0 + col;
        const float v0 = alpha * acc[i][j][2 * h], v1 = alpha * acc[i][j][2 * h + 1];
        if (col + 1 < t.tile_cols) {
          put_pair<P>(p, v0, v1);
        } else {
          put<P>(p, v0);
        }
      }
    }
  }
}

// Two CTAs per SM (at most 128 registers a thread; 2 x 80 KB of shared memory fits), so one CTA's
// epilogue and prologue overlap the other's main loop.
template <Product P, class Out>
__global__ void __launch_bounds__(kMmaThreads, 2)
    grouped_mma_kernel(const GroupedParams<bf16, Out> prm) {
  constexpr bool kAK = a_k_contiguous<P>(), kBK_ = b_k_contiguous<P>();
  constexpr int kAElems = stage_elems<kAK>(kBM);
  extern __shared__ __align__(16) unsigned char shared_raw[];
  bf16* const shared = reinterpret_cast<bf16*>(shared_raw);
  // Stage s: A at shared + s * stage, B right after it.
  const auto a_stage = [&](int s) { return shared + s * mma_stage_elems<P>(); };
  const auto b_stage = [&](int s) { return shared + s * mma_stage_elems<P>() + kAElems; };
  const int warp = threadIdx.x / 32;
  const int warp_m0 = (warp / kWarpsN) * kWarpM, warp_n0 = (warp % kWarpsN) * kWarpN;

  for_each_tile<P>(prm, [&](const Tile& t, const Operand<bf16>& a, const Operand<bf16>& b) {
    const std::int64_t k_steps = grouped::ceil_div(a.k_extent, kBK);
    float acc[kFragsM][kFragsN][4] = {};

    // Prologue: the first kStages - 1 k-steps in flight, one commit group each (empty past the
    // end, so that the group count stays k-step + kStages - 1).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_steps) {
        load_stage<kAK, kBM>(a_stage(s), a, t.m0, s * kBK);
        load_stage<kBK_, kBN>(b_stage(s), b, t.n0, s * kBK);
      }
      cp_async_commit();
    }
    for (std::int64_t ks = 0; ks < k_steps; ++ks) {
      // k-step ks has landed (at most kStages - 2 newer groups pending), and every warp is done
      // with the stage the prefetch below overwrites (read at ks - 1).
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const std::int64_t next = ks + kStages - 1;
      if (next < k_steps) {
        const int s = static_cast<int>(next % kStages);
        load_stage<kAK, kBM>(a_stage(s), a, t.m0, next * kBK);
        load_stage<kBK_, kBN>(b_stage(s), b, t.n0, next * kBK);
      }
      cp_async_commit();
      const int s = static_cast<int>(ks % kStages);
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        unsigned af[kFragsM][4], bfr[kFragsN][2];
        load_a<kAK>(af, a_stage(s), warp_m0, kk);
        load_b<kBK_>(bfr, b_stage(s), warp_n0, kk);
#pragma unroll
        for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
          for (int j = 0; j < kFragsN; ++j) mma_bf16(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
        }
      }
    }
    // Drain the (empty) trailing groups and let every warp finish reading before the next tile's
    // prologue overwrites the stages.
    cp_async_wait<0>();
    __syncthreads();

    store_accumulators<P>(prm, t, acc, warp_m0, warp_n0, 1.0f);
  });
}

// ---- FP8 (the grouped FP8 ops of grouped_linear.hpp) -----------------------------------------
//
// Every operand of the three FP8 products is K-contiguous (the casts' transposes make it so):
//   forward  A = x_g [m_g, in] (rows of x)       B = w_g [out, in] (block g of w [G, out, in])
//   dgrad    A = dy_g [m_g, out] (rows of dy)    B = (w_g)ᵀ [in, out]: columns [g out, (g+1) out)
//                                                    of the cast's transpose wᵀ [in, G out]
//   wgrad    A = (dy_g)ᵀ [out, m_g]: columns [o_g, o_{g+1}) of dyᵀ [out, n], B = (x_g)ᵀ [in,
//            m_g]: the same columns of xᵀ [in, n]
// and the output is c = (a_scale[0] b_scale[0]) · A · Bᵀ, as fp8_gemm's (quintet/nn/fp8.hpp).

// The value of an FP8 byte (exact in half precision, NaN kept).
__device__ __forceinline__ float fp8_value(std::uint8_t bits, bool e4m3) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, e4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

// SIMT: the shapes and formats the MMA kernel does not take; the SIMT kernel's tiles above.
template <Product P, class Out>
__global__ void __launch_bounds__(kSimtThreads) grouped_fp8_simt_kernel(const Fp8Params<Out> prm) {
  __shared__ float as[kSimtK][kSimtTile];  // [k][m]
  __shared__ float bs[kSimtK][kSimtTile];  // [k][n]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const float alpha = prm.a_scale[0] * prm.b_scale[0];
  const auto load = [](const Fp8Operand& o, bool e4m3, std::int64_t mn, std::int64_t k) {
    if (mn >= o.mn_extent || k >= o.k_extent) return 0.0f;
    return fp8_value(o.p[mn * o.ld + k], e4m3);
  };
  for_each_tile<P>(prm, [&](const Tile& t, const Fp8Operand& a, const Fp8Operand& b) {
    float acc[4][4] = {};
    for (std::int64_t k0 = 0; k0 < a.k_extent; k0 += kSimtK) {
      for (int e = threadIdx.x; e < kSimtK * kSimtTile; e += kSimtThreads) {
        const int k = e % kSimtK, mn = e / kSimtK;
        as[k][mn] = load(a, prm.a_e4m3, t.m0 + mn, k0 + k);
        bs[k][mn] = load(b, prm.b_e4m3, t.n0 + mn, k0 + k);
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kSimtK; ++k) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += as[k][ty * 4 + i] * bs[k][tx * 4 + j];
        }
      }
      __syncthreads();
    }
    store_simt_tile<P>(prm, t, acc, tx, ty, alpha);
  });
}

// Tensor cores: the bf16 kernel's tiles, warps and pipeline with FP8 bytes. A k-step is kBK b16
// = 64 bytes, so a shared stage row is the bf16 kernel's K-contiguous row (80 bytes), and an
// m16n8k32 FP8 MMA reads the same registers from it as an m16n8k16 bf16 one: A's a0..a3 are
// rows g / g + 8 by bytes 4 t.. 4 t + 3 of k 0-15 / 16-31 (g = lane / 4, t = lane % 4), B's
// b0, b1 row g by bytes 4 t.. of k 0-15 / 16-31, which is what ldmatrix (non-transposed, on
// b16 pairs) gives each lane (load_a / load_b with KContiguous). The accumulators are laid out
// as the bf16 MMA's.

// d += a · b for one m16n8k32 MMA, A in E5M2 (dgrad, wgrad) or E4M3 (forward), B in E4M3.
template <bool AE5M2>
__device__ __forceinline__ void mma_fp8(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
#if __CUDA_ARCH__ >= 890
  if constexpr (AE5M2) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the host takes the SIMT kernel before sm_89
#endif
}

constexpr int kFp8RowBytes = 2 * (kBK + kPad);  // a shared row: 64 bytes of k and 16 of padding
constexpr int kFp8StageBytes = kFp8RowBytes * (kBM + kBN);

// Copies the k-step at byte k0 of an operand's MN x 64 tile (rows mn0..) into shared s, as
// 16-byte chunks, the bytes past k_extent and the rows past mn_extent zero. The operand's base
// and ld are multiples of 16 bytes, so every chunk's source is 16-byte aligned.
// Partial: k_extent may end inside a chunk (wgrad); else it is a multiple of 16 and every chunk is
// wholly in or out.
template <int MN, bool Partial>
__device__ __forceinline__ void load_stage_fp8(std::uint8_t* s, const Fp8Operand& o,
                                               std::int64_t mn0, std::int64_t k0) {
  constexpr int kChunksPerRow = 2 * kBK / 16;
  constexpr int kChunks = MN * kChunksPerRow;
  static_assert(kChunks % kMmaThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < kChunks / kMmaThreads; ++i) {
    const int chunk = threadIdx.x + i * kMmaThreads;
    const int mn = chunk / kChunksPerRow, k = (chunk % kChunksPerRow) * 16;
    const std::int64_t gmn = mn0 + mn, gk = k0 + k;
    const bool valid = gmn < o.mn_extent && gk < o.k_extent;
    int bytes = valid ? 16 : 0;
    if (Partial && valid && o.k_extent - gk < 16) bytes = static_cast<int>(o.k_extent - gk);
    cp_async_bytes(s + mn * kFp8RowBytes + k, valid ? o.p + gmn * o.ld + gk : o.p, bytes);
  }
}

template <Product P, class Out>
__global__ void __launch_bounds__(kMmaThreads, 2) grouped_fp8_mma_kernel(const Fp8Params<Out> prm) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  // Stage s: A's kBM rows at shared_raw + s * stage, B's kBN rows right after them.
  const auto a_stage = [&](int s) { return shared_raw + s * kFp8StageBytes; };
  const auto b_stage = [&](int s) { return shared_raw + s * kFp8StageBytes + kBM * kFp8RowBytes; };
  const int warp = threadIdx.x / 32;
  const int warp_m0 = (warp / kWarpsN) * kWarpM, warp_n0 = (warp % kWarpsN) * kWarpN;

  for_each_tile<P>(prm, [&](const Tile& t, const Fp8Operand& group_a, const Fp8Operand& group_b) {
    const int skip = fp8_skip<P>(t);  // wgrad: see fp8_skip
    const Fp8Operand a = widened(group_a, skip), b = widened(group_b, skip);
    const std::int64_t k_steps = grouped::ceil_div(a.k_extent, 2 * kBK);
    float acc[kFragsM][kFragsN][4] = {};
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_steps) {
        load_stage_fp8<kBM, P == Product::wgrad>(a_stage(s), a, t.m0, s * 2 * kBK);
        load_stage_fp8<kBN, P == Product::wgrad>(b_stage(s), b, t.n0, s * 2 * kBK);
      }
      cp_async_commit();
    }
    for (std::int64_t ks = 0; ks < k_steps; ++ks) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const int s = static_cast<int>(ks % kStages);
      if (ks == 0 && skip > 0) {  // the columns before o_g (another group's) read as zeros
        const int row = threadIdx.x % kBM;
        std::uint8_t* p = (threadIdx.x < kBM ? a_stage(0) : b_stage(0)) + row * kFp8RowBytes;
        for (int j = 0; j < skip; ++j) p[j] = 0;
        __syncthreads();
      }
      const std::int64_t next = ks + kStages - 1;
      if (next < k_steps) {
        const int sn = static_cast<int>(next % kStages);
        load_stage_fp8<kBM, P == Product::wgrad>(a_stage(sn), a, t.m0, next * 2 * kBK);
        load_stage_fp8<kBN, P == Product::wgrad>(b_stage(sn), b, t.n0, next * 2 * kBK);
      }
      cp_async_commit();
      const bf16* as = reinterpret_cast<const bf16*>(a_stage(s));
      const bf16* bs = reinterpret_cast<const bf16*>(b_stage(s));
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {  // b16 units: 32 bytes, one k32 MMA
        unsigned af[kFragsM][4], bfr[kFragsN][2];
        load_a<true>(af, as, warp_m0, kk);
        load_b<true>(bfr, bs, warp_n0, kk);
#pragma unroll
        for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
          for (int j = 0; j < kFragsN; ++j) {
            mma_fp8<P != Product::forward>(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
          }
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Times the inverse scales (read here, not kept in a register through the main loop).
    store_accumulators<P>(prm, t, acc, warp_m0, warp_n0, prm.a_scale[0] * prm.b_scale[0]);
  });
}

// ---- host side -------------------------------------------------------------------------------

// Runs product P: a [rows, *], b, offsets [G + 1] -> c; wgmma: the Hopper kernel where it applies.
template <Product P>
void run(const Tensor& a, const Tensor& b, const Tensor& offsets, const Tensor& c,
         std::int64_t groups, std::int64_t in, std::int64_t out, bool wgmma, const Stream& stream) {
  const std::int64_t rows = a.size(0);
  TileGrid grid;
  grid.total_rows = rows;
  grid.rows_are_k = P == Product::wgrad;
  grid.zero_tail = P != Product::wgrad;
  grid.m = out;                               // wgrad's output rows
  grid.n = P == Product::forward ? out : in;  // the output's columns
  const auto go = [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Out = std::conditional_t<P == Product::wgrad, float, T>;
    GroupedParams<T, Out> prm{ptr<T>(a), ptr<T>(b), ptr<Out>(c), ptr<std::int64_t>(offsets),
                              groups,    in,        out,         grid};
    // The tensor-core kernels: bf16, every contiguous dimension a multiple of 8 elements, 16-byte
    // aligned bases (the output's too: the epilogue writes pairs); wgmma when asked for (sm_90
    // only: it throws elsewhere), else mma.sync on sm_80 or later. Anything else takes the SIMT
    // kernel.
    if constexpr (std::is_same_v<T, bf16>) {
      const bool fits = in % 8 == 0 && out % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(c);
      if (fits && wgmma) {
        launch_wgmma<P>(prm, stream);
        return;
      }
      if (fits && device_sm() >= 80) {
        prm.grid.tile_m = kBM;
        prm.grid.tile_n = kBN;
        launch_persistent(grouped_mma_kernel<P, Out>, prm, kMmaThreads, mma_shared_bytes<P>(),
                          stream);
        return;
      }
    }
    prm.grid.tile_m = prm.grid.tile_n = kSimtTile;
    launch_persistent(grouped_simt_kernel<P, T, Out>, prm, kSimtThreads, 0, stream);
  };
  dispatch_compute(a.dtype(), "grouped_linear", go);
}

}  // namespace

void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& y, bool wgmma, const Stream& stream) {
  run<Product::forward>(x, w, offsets, y, w.size(0), w.size(2), w.size(1), wgmma, stream);
}

void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dx, bool wgmma, const Stream& stream) {
  run<Product::dgrad>(dy, w, offsets, dx, w.size(0), w.size(2), w.size(1), wgmma, stream);
}

void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, bool wgmma, const Stream& stream) {
  run<Product::wgrad>(dy, x, offsets, dw, dw.size(0), dw.size(2), dw.size(1), wgmma, stream);
}

namespace {
// Runs FP8 product P (cuda_ops.hpp's grouped_fp8_gemm).
template <Product P>
void run_fp8(const Tensor& a, const Tensor& a_scale, Fp8Format a_format, const Tensor& b,
             const Tensor& b_scale, Fp8Format b_format, const Tensor& offsets, const Tensor& c,
             bool wgmma, const Stream& stream) {
  const std::int64_t groups = offsets.size(0) - 1;
  std::int64_t rows, in, out;
  if (P == Product::forward) {
    rows = a.size(0), in = a.size(1), out = b.size(1);
  } else if (P == Product::dgrad) {
    rows = a.size(0), out = a.size(1), in = b.size(0);
  } else {
    out = a.size(0), rows = a.size(1), in = b.size(0);
  }
  TileGrid grid;
  grid.total_rows = rows;
  grid.rows_are_k = P == Product::wgrad;
  grid.zero_tail = P != Product::wgrad;
  grid.m = out;
  grid.n = P == Product::forward ? out : in;
  const bool a_e4m3 = a_format == Fp8Format::e4m3, b_e4m3 = b_format == Fp8Format::e4m3;
  const auto go = [&](auto tag) {
    using Out = typename decltype(tag)::type;
    Fp8Params<Out> prm{ptr<std::uint8_t>(a),
                       ptr<std::uint8_t>(b),
                       ptr<Out>(c),
                       ptr<float>(a_scale),
                       ptr<float>(b_scale),
                       ptr<std::int64_t>(offsets),
                       groups,
                       in,
                       out,
                       a_e4m3,
                       b_e4m3,
                       grid};
    // The tensor-core kernels: the formats of the hybrid recipe (E4M3 by E4M3 forward, E5M2 by
    // E4M3 backward), in, out and (wgrad: the transposes' rows) n multiples of 16 bytes, 16-byte
    // aligned bases; wgmma when asked for (sm_90 only: it throws elsewhere), else mma.sync on
    // sm_89 or later. Anything else takes the SIMT kernel.
    const bool formats = b_e4m3 && (P == Product::forward ? a_e4m3 : !a_e4m3);
    const bool fits = formats && in % 16 == 0 && out % 16 == 0 &&
                      (P != Product::wgrad || rows % 16 == 0) && aligned16(a) && aligned16(b) &&
                      aligned16(c);
    if (fits && wgmma) {
      launch_wgmma_fp8<P>(prm, stream);
      return;
    }
    if (fits && device_sm() >= 89) {
      prm.grid.tile_m = kBM;
      prm.grid.tile_n = kBN;
      launch_persistent(grouped_fp8_mma_kernel<P, Out>, prm, kMmaThreads,
                        static_cast<std::size_t>(kStages) * kFp8StageBytes, stream);
      return;
    }
    prm.grid.tile_m = prm.grid.tile_n = kSimtTile;
    launch_persistent(grouped_fp8_simt_kernel<P, Out>, prm, kSimtThreads, 0, stream);
  };
  if constexpr (P == Product::wgrad) {
    go(TypeTag<float>{});  // dw is f32
  } else {
    dispatch_compute(c.dtype(), "grouped_fp8_gemm", go);
  }
}
}  // namespace

void grouped_fp8_gemm(GroupedFp8Product product, const Tensor& a, const Tensor& a_scale,
                      Fp8Format a_format, const Tensor& b, const Tensor& b_scale,
                      Fp8Format b_format, const Tensor& offsets, const Tensor& c, bool wgmma,
                      const Stream& stream) {
  switch (product) {
    case GroupedFp8Product::forward:
      run_fp8<Product::forward>(a, a_scale, a_format, b, b_scale, b_format, offsets, c, wgmma,
                                stream);
      break;
    case GroupedFp8Product::dgrad:
      run_fp8<Product::dgrad>(a, a_scale, a_format, b, b_scale, b_format, offsets, c, wgmma,
                              stream);
      break;
    case GroupedFp8Product::wgrad:
      run_fp8<Product::wgrad>(a, a_scale, a_format, b, b_scale, b_format, offsets, c, wgmma,
                              stream);
      break;
  }
}

}  // namespace quintet::nn::cuda_ops
