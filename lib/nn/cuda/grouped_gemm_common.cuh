// Private: the parts the grouped GEMM kernels share (lib/nn/cuda/grouped_gemm.cu's mma.sync, FP8
// and SIMT kernels, lib/nn/cuda/grouped_gemm_sm90a.cu's wgmma kernel): a group's operands and
// output, the epilogue's stores, the persistent tile loop, cp.async, and the persistent launch.
// The three products and the operand conventions are described at the top of grouped_gemm.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "nn/cuda/grouped_gemm_tiles.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops::grouped {

using namespace ::quintet::nn::cuda_ops::detail;

enum class Product { forward, dgrad, wgrad };

// How a product's operands lie in memory (the table of grouped_gemm.cu): A is K-contiguous except
// in wgrad (dy, M-contiguous there); B is K-contiguous in forward only (w; N-contiguous in dgrad's
// w and wgrad's x).
template <Product P>
constexpr bool a_k_contiguous() {
  return P != Product::wgrad;
}
template <Product P>
constexpr bool b_k_contiguous() {
  return P == Product::forward;
}

// One operand of a group: its base pointer (the group's first element), its leading dimension,
// and the extents past which it reads zeros.
template <class T>
struct Operand {
  const T* p;
  std::int64_t ld;
  std::int64_t mn_extent, k_extent;
};

// What every tile of a launch needs. T: the input type; Out: y / dx's type (T), or float (dw).
template <class T, class Out>
struct GroupedParams {
  using OperandType = Operand<T>;
  const T* a;                   // x (forward) or dy (dgrad, wgrad): [total_rows, a_cols]
  const T* b;                   // w (forward, dgrad) [G, out, in] or x (wgrad) [total_rows, in]
  Out* c;                       // y [total_rows, out], dx [total_rows, in] or dw [G, out, in]
  const std::int64_t* offsets;  // [G + 1], device
  std::int64_t groups;
  std::int64_t in, out;  // the layer's widths
  TileGrid grid;
};

// The operands of tile t's group for product P.
template <Product P, class T, class Out>
__device__ __forceinline__ void group_operands(const GroupedParams<T, Out>& prm, const Tile& t,
                                               Operand<T>& a, Operand<T>& b) {
  const std::int64_t in = prm.in, out = prm.out;
  if (P == Product::forward) {  // A = x_g [m_g, in], B = w_g [out, in]
    a = {prm.a + t.first_row * in, in, t.rows, in};
    b = {prm.b + t.group * out * in, in, out, in};
  } else if (P == Product::dgrad) {  // A = dy_g [m_g, out], B[k = j][n = i] = w_g[j, i]
    a = {prm.a + t.first_row * out, out, t.rows, out};
    b = {prm.b + t.group * out * in, in, in, out};
  } else {  // wgrad: A[m = j][k = r] = dy[r, j], B[k = r][n = i] = x[r, i]
    a = {prm.a + t.first_row * out, out, out, t.rows};
    b = {prm.b + t.first_row * in, in, in, t.rows};
  }
}

// A K-contiguous FP8 operand: element (mn, k) at p[mn * ld + k], zero past the extents.
struct Fp8Operand {
  const std::uint8_t* p;
  std::int64_t ld;
  std::int64_t mn_extent, k_extent;
};

template <class Out>
struct Fp8Params {
  using OperandType = Fp8Operand;
  const std::uint8_t* a;  // x, dy or dyᵀ (above)
  const std::uint8_t* b;  // w, wᵀ or xᵀ
  Out* c;                 // y [n, out], dx [n, in] or dw [G, out, in]
  const float* a_scale;   // f32 [2] {1 / scale, scale}, device
  const float* b_scale;
  const std::int64_t* offsets;  // [G + 1], device
  std::int64_t groups;
  std::int64_t in, out;
  bool a_e4m3, b_e4m3;  // the formats (the SIMT kernel; the MMA kernel's are fixed by P)
  TileGrid grid;
};

template <Product P, class Out>
__device__ __forceinline__ void group_operands(const Fp8Params<Out>& prm, const Tile& t,
                                               Fp8Operand& a, Fp8Operand& b) {
  const std::int64_t in = prm.in, out = prm.out, n = prm.grid.total_rows;
  if (P == Product::forward) {
    a = {prm.a + t.first_row * in, in, t.rows, in};
    b = {prm.b + t.group * out * in, in, out, in};
  } else if (P == Product::dgrad) {
    a = {prm.a + t.first_row * out, out, t.rows, out};
    b = {prm.b + t.group * out, prm.groups * out, in, out};
  } else {
    a = {prm.a + t.first_row, n, out, t.rows};
    b = {prm.b + t.first_row, n, in, t.rows};
  }
}

// wgrad of the FP8 tensor-core kernels: the group's first column o_g of the transposes need not
// be 16-byte aligned, so the copies start at the aligned column below it, skip = o_g % 16 columns
// earlier (0 for the other products); the kernel zeroes those columns (another group's) once
// they landed. o, widened to start there.
template <Product P>
__device__ __forceinline__ int fp8_skip(const Tile& t) {
  return P == Product::wgrad ? static_cast<int>(t.first_row % 16) : 0;
}
__device__ __forceinline__ Fp8Operand widened(const Fp8Operand& o, int skip) {
  return {o.p - skip, o.ld, o.mn_extent, o.k_extent + skip};
}

// The output of tile t's group: its base and leading dimension (forward, dgrad: the group's rows
// of y / dx; wgrad: dw_g).
template <Product P, class Params>
__device__ __forceinline__ auto group_output(const Params& prm, const Tile& t, std::int64_t& ldc) {
  if (P == Product::forward) {
    ldc = prm.out;
    return prm.c + t.first_row * prm.out;
  }
  if (P == Product::dgrad) {
    ldc = prm.in;
    return prm.c + t.first_row * prm.in;
  }
  ldc = prm.in;
  return prm.c + t.group * prm.out * prm.in;
}

// Stores (forward, dgrad) or adds (wgrad, f32) one f32 result.
template <Product P, class Out>
__device__ __forceinline__ void put(Out* c, float v) {
  if (P == Product::wgrad) {
    *c = from_float<Out>(to_float(*c) + v);
  } else {
    *c = from_float<Out>(v);
  }
}

// put of two adjacent results, p aligned to two elements: a bf16 or f32 pair (forward, dgrad) or
// an f32 pair added (wgrad).
template <Product P, class Out>
__device__ __forceinline__ void put_pair(Out* p, float v0, float v1) {
  if constexpr (P == Product::wgrad) {
    float2* q = reinterpret_cast<float2*>(p);
    float2 o = *q;
    o.x += v0;
    o.y += v1;
    *q = o;
  } else if constexpr (std::is_same_v<Out, float>) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
  }
}

// Zeroes a padding tile (rows past the last group) of y / dx (prm: GroupedParams or Fp8Params).
template <class Params>
__device__ void zero_tile(const Params& prm, const Tile& t) {
  using Out = std::remove_pointer_t<decltype(prm.c)>;
  const std::int64_t ldc = prm.grid.n;
  Out* c = prm.c + t.first_row * ldc;
  for (std::int64_t i = threadIdx.x; i < t.tile_rows * t.tile_cols; i += blockDim.x) {
    const std::int64_t r = t.m0 + i / t.tile_cols, col = t.n0 + i % t.tile_cols;
    c[r * ldc + col] = from_float<Out>(0.0f);
  }
}

// Runs body(tile, a, b) for each tile of this CTA (persistent: tiles blockIdx.x, + gridDim.x, ...),
// with its group's operands; zeroes the padding tiles itself. Every thread of the CTA walks the
// same tiles, so body may synchronise the CTA.
template <Product P, class Params, class Body>
__device__ __forceinline__ void for_each_tile(const Params& prm, Body&& body) {
  TileWalker walker(prm.offsets, prm.groups, prm.grid);
  Tile t;
  for (std::int64_t index = blockIdx.x; walker.find(index, t); index += gridDim.x) {
    if (t.group == prm.groups) {
      zero_tile(prm, t);
      continue;
    }
    typename Params::OperandType a, b;
    group_operands<P>(prm, t, a, b);
    body(t, a, b);
  }
}

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes into shared dst: the first `bytes` (0 to 16) from global src (16-byte aligned), zeros
// after them (src is not read past them).
__device__ __forceinline__ void cp_async_bytes(void* dst, const void* src, int bytes) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(bytes));
#else
  __trap();  // the host takes the SIMT kernel before sm_80; never silently skip a copy
#endif
}
// 16 bytes from global src into shared dst, or zeros when !valid (src is not read then).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  cp_async_bytes(dst, src, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

// The compute capability of the current device as 10 major + minor (90 for sm_90), read once per
// device.
inline int device_sm() {
  int device = 0;
  QUINTET_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<int, int> sms;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = sms.find(device);
  if (it == sms.end()) {
    int major = 0, minor = 0;
    QUINTET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    QUINTET_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    it = sms.emplace(device, 10 * major + minor).first;
  }
  return it->second;
}

inline bool aligned16(const Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The resident CTAs of kernel (threads, shared bytes) on the current device, all SMs together,
// set up (shared-memory limit, occupancy query) once per kernel and device: a small launch pays
// no query.
template <class Kernel>
std::int64_t resident_ctas(Kernel kernel, int threads, std::size_t shared) {
  int device = 0;
  QUINTET_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, std::int64_t> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, reinterpret_cast<const void*>(kernel));
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (shared > 48 * 1024) {
      QUINTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(shared)));
    }
    int per_sm = 0, sms = 0;
    QUINTET_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared));
    QUINTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    QUINTET_CHECK(per_sm > 0,
                  "grouped GEMM: the kernel cannot run with {} threads and {} bytes of shared "
                  "memory on this GPU",
                  threads, shared);
    it = cache.emplace(key, std::int64_t{per_sm} * sms).first;
  }
  return it->second;
}

// Launches kernel over a persistent grid of at most (resident CTAs) blocks.
template <class Kernel, class Params>
void launch_persistent(Kernel kernel, const Params& prm, int threads, std::size_t shared,
                       const Stream& stream) {
  const std::int64_t tiles = grouped::max_tiles(prm.grid, prm.groups);
  if (tiles == 0) return;
  const std::int64_t blocks = std::min(tiles, resident_ctas(kernel, threads, shared));
  kernel<<<static_cast<unsigned>(blocks), threads, shared, stream.handle()>>>(prm);
  check_launch();
}

// The Hopper kernel (grouped_gemm_sm90a.cu, built for sm_90a only): product P over every tile of
// prm (it sets the tile sizes), bf16 with every contiguous dimension a multiple of 8 and 16-byte
// aligned bases, as the mma.sync kernel. Throws InvalidArgument on a GPU that is not sm_90.
template <Product P, class Out>
void launch_wgmma(GroupedParams<bf16, Out> prm, const Stream& stream);
// Its FP8 form: product P of the FP8 mma.sync kernel's formats and shapes (E4M3 by E4M3 forward,
// E5M2 by E4M3 dgrad and wgrad; in, out and wgrad's n multiples of 16; 16-byte aligned bases).
// Throws InvalidArgument on a GPU that is not sm_90.
template <Product P, class Out>
void launch_wgmma_fp8(Fp8Params<Out> prm, const Stream& stream);

}  // namespace quintet::nn::cuda_ops::grouped
