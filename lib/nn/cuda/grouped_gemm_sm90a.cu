// The Hopper (sm_90a) kernels of the bf16 and FP8 grouped GEMMs (quintet/nn/grouped_linear.hpp),
// taken when QUINTET_GROUPED_GEMM=wgmma: the same products, operands and persistent tile walk as
// grouped_gemm.cu's mma.sync kernels (see its top and grouped_gemm_common.cuh), computed by
// warpgroup MMAs reading both operands from shared memory. The FP8 kernel (below, "FP8") keeps
// the first design (every thread copies and computes); this top describes the bf16 one.
//
// bf16: warp-specialised. A CTA of three warpgroups computes a 128 x 256 output tile: warpgroup 0
// (the producer) only copies operand tiles into shared memory, warpgroups 1 and 2 (the consumers)
// only run wgmma.mma_async m64n256k16 (f32 accumulators, 128 a thread) and the epilogue, consumer
// c rows 64 c .. 64 c + 63 of the tile, four wgmmas per 64-deep k-step. The operand tiles (A 128 x
// 64, B 256 x 64 bf16: 16 + 32 KB) go through 4 shared stages, each with two mbarriers:
//   - full[s] (128 arrivals): each producer thread, after issuing its cp.async copies of a k-step
//     into stage s, makes cp.async.mbarrier.arrive.noinc arrive on it once those copies land;
//   - empty[s] (256 arrivals): each consumer thread arrives once the wgmmas reading stage s have
//     completed (wgmma.wait_group 1 after the next k-step's are issued, 0 at the tile's end).
// The producer waits for empty[s] before refilling stage s, a consumer for full[s] (then a
// fence.proxy.async: cp.async writes through the generic proxy, wgmma reads through the async
// one) before reading it. Producer and consumers walk the same tiles and count the same k-steps,
// k-step i (over all the CTA's tiles) using stage i % 4 in its lap i / 4, whose parity is the
// phase waited for (the producer's empty waits one lap behind, a fresh barrier's "previous"
// phase counting as complete). So the loads run up to 4 k-steps ahead, across tiles too: the
// producer fills the next tile's stages while the consumers store the last one, and no CTA-wide
// barrier is needed after the start. setmaxnreg moves registers from the producer (168 -> 88) to
// the consumers (168 -> 208), which hold 128 accumulators each; with less, either side spills
// (ptxas -v).
//
// Why cp.async rather than TMA: a group's rows are a sub-range of the operand, and the rows past
// its end must read as zeros (wgrad, where they are the reduction dimension) or be at least
// harmless. cp.async's zero-fill does that per 16-byte chunk with the extents the mma.sync
// kernel already computes (Operand), while TMA would need a tensor map per group made on the
// device from the offsets. The producer's 128 threads issue 24 copies each a k-step, the price.
//
// Shared memory layouts (byte offsets in an operand tile, 1024-byte aligned: the swizzle is
// applied by the hardware to address bits, chunk bits [4, 7) xor row bits [7, 10)):
//   - K-contiguous operand (x and w in forward, dy in dgrad), "K-major": row mn of 64 k values is
//     128 bytes at mn * 128; its 16-byte chunk c (k = 8c..8c+7) sits at chunk slot c ^ (mn % 8).
//     Descriptor: SBO = 1024 (the next 8 rows), LBO unused (16); the k16 step kk starts 32 kk
//     bytes further.
//   - MN-contiguous operand (w in dgrad, dy and x in wgrad), "MN-major", read with wgmma's
//     transpose bit: 64-element atoms of MN, atom a (mn = 64a..64a+63) at 8192 a; in it, row k
//     (0..63) is 128 bytes at k * 128, chunk c (mn = 64a + 8c..) at slot c ^ (k % 8).
//     Descriptor: LBO = 8192 (the next 64 MN), SBO = 1024 (the next 8 k); the k16 step kk starts
//     2048 kk bytes further.
// The accumulators follow PTX's m64nN D layout (the same for k16 and k32): register 4 j + 2 h + e
// of thread (warp w of the warpgroup, lane l) is row 16 w + l / 4 + 8 h, column 8 j + 2 (l % 4)
// + e.
#include <cuda_runtime.h>

#include <cstdint>

#include "nn/cuda/grouped_gemm_common.cuh"

namespace quintet::nn::cuda_ops::grouped {

namespace {

constexpr int kWgK = 64;          // one bf16 k-step: 64 bf16 = one 128-byte swizzle row
constexpr int kAtomBytes = 8192;  // an MN-major atom: 64 MN x 64 k

// The bf16 kernel (see the top).
constexpr int kWsTileM = 128, kWsTileN = 256;  // the CTA's output tile
constexpr int kWsStages = 4;                   // shared-memory stages
constexpr int kWsProducers = 128;              // warpgroup 0
constexpr int kWsConsumers = 256;              // warpgroups 1 and 2
constexpr int kWsThreads = kWsProducers + kWsConsumers;
constexpr int kWsABytes = kWsTileM * kWgK * 2;                  // 16 KB
constexpr int kWsStageBytes = kWsABytes + kWsTileN * kWgK * 2;  // A, then B (32 KB)
// The stages, then full[4] and empty[4] (8 bytes each), + the alignment slack.
constexpr std::size_t kWsShared = kWsStages * kWsStageBytes + 2 * kWsStages * 8 + 1024;
// Registers a thread: at entry, 65536 / 384 rounded down to 8 (__launch_bounds__(384, 1)), then
// moved by setmaxnreg from the producer to the consumers within the same 64 K.
constexpr int kWsEntryRegisters = 168;
constexpr int kWsProducerRegisters = 88, kWsConsumerRegisters = 208;
static_assert(kWsThreads * kWsEntryRegisters <= 65536 &&
              kWsProducers * kWsProducerRegisters + kWsConsumers * kWsConsumerRegisters <=
                  kWsThreads * kWsEntryRegisters);

// The FP8 kernel (below).
constexpr int kWgTile = 128;                    // the CTA's output tile is kWgTile x kWgTile
constexpr int kWgK8 = 128;                      // an FP8 k-step: 128 bytes
constexpr int kFp8Promote = 4;                  // k-steps (512 deep) summed in the wgmmas
constexpr int kWgStages = 5;                    // shared-memory stages
constexpr int kWgAhead = kWgStages - 2;         // k-steps loaded ahead of the one computed
constexpr int kWgThreads = 256;                 // two warpgroups
constexpr int kOperandBytes = kWgTile * kWgK8;  // 16 KB
constexpr int kStageBytes = 2 * kOperandBytes;  // A then B
constexpr std::size_t kWgShared = kWgStages * kStageBytes + 1024;  // + the alignment slack

// The byte offset of element (mn, k) of a bf16 operand tile (see the top); for a chunk's first
// element (k % 8 == 0, or mn % 8 == 0) it is the chunk's slot.
template <bool KContiguous>
__device__ __forceinline__ unsigned swizzled_offset(int mn, int k) {
  if (KContiguous) return mn * 128 + (((k / 8) ^ (mn % 8)) * 16) + (k % 8) * 2;
  return (mn / 64) * kAtomBytes + k * 128 + ((((mn % 64) / 8) ^ (k % 8)) * 16) + (mn % 8) * 2;
}

// Copies the k-step at k0 of an operand's Rows x 64 tile (rows mn0.. of the operand) into the
// shared tile at s, 16-byte chunks along the contiguous dimension, zero past the extents (the
// contiguous extent is a multiple of 8, so a chunk is wholly in or out). Thread `thread` (of
// Threads) keeps one chunk position c along the contiguous dimension and walks the strided one
// (mn for a K-contiguous operand, else k) from r0 in passes of Threads / (chunks a row): one
// pointer increment and one compare a copy.
template <bool KContiguous, int Rows, int Threads>
__device__ __forceinline__ void load_swizzled(unsigned char* s, const Operand<bf16>& o,
                                              std::int64_t mn0, std::int64_t k0, int thread) {
  constexpr int kPerRow = KContiguous ? kWgK / 8 : Rows / 8;  // chunks along the contiguous dim
  constexpr int kStrided = KContiguous ? Rows : kWgK;         // the tile's extent across it
  constexpr int kPass = Threads / kPerRow;                    // strided rows a pass
  static_assert(Threads % kPerRow == 0 && kStrided % kPass == 0);
  const int c = thread % kPerRow, r0 = thread / kPerRow;
  const std::int64_t contiguous = (KContiguous ? k0 : mn0) + 8 * c;
  const std::int64_t strided = (KContiguous ? mn0 : k0) + r0;
  const std::int64_t strided_extent = KContiguous ? o.mn_extent : o.k_extent;
  const bool in = contiguous < (KContiguous ? o.k_extent : o.mn_extent);
  const bf16* src = o.p + strided * o.ld + contiguous;  // read only where valid
#pragma unroll
  for (int i = 0; i < kStrided / kPass; ++i) {
    const int r = r0 + i * kPass;
    const bool valid = in && strided + i * kPass < strided_extent;
    const unsigned offset =
        KContiguous ? swizzled_offset<true>(r, 8 * c) : swizzled_offset<false>(8 * c, r);
    cp_async_16(s + offset, valid ? src : o.p, valid);
    src += kPass * o.ld;
  }
}

// A wgmma matrix descriptor: start address, leading and stride byte offsets (16-byte units, 14
// bits each at bits 0, 16 and 32), base offset 0 (the tiles are 1024-byte aligned), 128-byte
// swizzle (1 at bits 62-63).
__device__ __forceinline__ std::uint64_t matrix_descriptor(unsigned address, unsigned lbo,
                                                           unsigned sbo) {
  return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<std::uint64_t>(lbo >> 4) << 16) |
         (static_cast<std::uint64_t>(sbo >> 4) << 32) | (std::uint64_t{1} << 62);
}

// The descriptor of the k16 step kk of an operand tile at shared address tile, for MN rows
// mn0.. (mn0: 0 for B, 64 w for warpgroup w's A; a multiple of 64).
template <bool KContiguous>
__device__ __forceinline__ std::uint64_t operand_descriptor(unsigned tile, int mn0, int kk) {
  if (KContiguous) return matrix_descriptor(tile + mn0 * 128 + kk * 32, 16, 1024);
  return matrix_descriptor(tile + (mn0 / 64) * kAtomBytes + kk * 16 * 128, kAtomBytes, 1024);
}

// The 64 accumulator operands of an m64n128 wgmma, %0 .. %63, and their constraints.
#define QUINTET_WGMMA_D64                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define QUINTET_WGMMA_D64_OUT(d)                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d += A · B for one FP8 m64n128k32, A in E5M2 (dgrad, wgrad) or E4M3 (forward), B in E4M3. For
// 8-bit types wgmma has no transpose: both operands are K-major.
template <bool AE5M2>
__device__ __forceinline__ void wgmma_m64n128k32_fp8(float (&d)[64], std::uint64_t desc_a,
                                                     std::uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (AE5M2) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e4m3 " QUINTET_WGMMA_D64
        ", %64, %65, p, 1, 1;\n}\n"
        : QUINTET_WGMMA_D64_OUT(d)
        : "l"(desc_a), "l"(desc_b), "r"(1));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " QUINTET_WGMMA_D64
        ", %64, %65, p, 1, 1;\n}\n"
        : QUINTET_WGMMA_D64_OUT(d)
        : "l"(desc_a), "l"(desc_b), "r"(1));
  }
#else
  __trap();
#endif
}
// The 128 accumulator operands of an m64n256 wgmma, %0 .. %127 (their constraints: the 64 of
// QUINTET_WGMMA_D64_OUT twice, for d and d + 64).
#define QUINTET_WGMMA_D128                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "  \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "  \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "    \
  "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "  \
  "%123, %124, %125, %126, %127}"

// d += A · B for one m64n256k16 (TransA / TransB: the operand is MN-major).
template <int TransA, int TransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], std::uint64_t desc_a,
                                                 std::uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float* const hi = d + 64;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " QUINTET_WGMMA_D128
      ", %128, %129, p, 1, 1, %131, %132;\n}\n"
      : QUINTET_WGMMA_D64_OUT(d), QUINTET_WGMMA_D64_OUT(hi)
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(TransA), "n"(TransB));
#else
  __trap();  // built for sm_90a only (cmake/QuintetLayers.cmake); never silently skip a product
#endif
}
#undef QUINTET_WGMMA_D128
#undef QUINTET_WGMMA_D64_OUT
#undef QUINTET_WGMMA_D64

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}
// Orders generic-proxy writes of shared memory this thread has seen (cp.async copies: its own,
// waited for, or the producer's, acquired through an mbarrier) before its later async-proxy reads
// (the wgmmas).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accumulator accesses across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The bf16 kernel's synchronisation (see the top). mbarriers are named by shared address.
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Makes the initialisations visible to the asynchronous arrivals (before a CTA barrier).
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Waits (acquire) until the phase of parity `parity` of bar has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
#else
  __trap();
#endif
}
// Arrives (release) on bar.
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
#endif
}
// Arrives on bar once every cp.async this thread issued before has landed (no pending-count
// increment: the arrival is one of those bar was initialised to expect).
__device__ __forceinline__ void cp_async_arrive_noinc(unsigned bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Sets this warpgroup's registers a thread (every thread of the warpgroup executes it).
template <int Registers>
__device__ __forceinline__ void set_max_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (Registers > kWsEntryRegisters) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
  }
#endif
}

// The stages, 1024-byte aligned (the swizzle reads address bits), in the dynamic shared memory.
__device__ __forceinline__ unsigned char* aligned_stages(unsigned char* shared_raw) {
  return shared_raw + ((1024 - smem_address(shared_raw) % 1024) % 1024);
}

// The pipelined k-loop of one tile of the FP8 kernel (every thread copies and computes): load(step,
// s) copies k-step `step` of both operands into the stage at s (A at s, B at s + kOperandBytes);
// issue(stage) issues one k-step's wgmmas into acc from the stage at shared address `stage`;
// first_landed(s) may rewrite k-step 0's stage s with generic stores once every copy of it has
// landed, returning whether it did (the same answer in every thread). The result is in sum. Promote
// (FP8): every Promote k-steps the wgmmas are waited for and acc is added into sum in f32 and
// restarted from zero, as CUTLASS's FP8 GEMMs do: Hopper's FP8 wgmma adds into its accumulator with
// about 14 bits kept (DeepSeek-V3's report, section 3.3.2), so a long K summed in it alone loses
// what cuBLASLt's FP8 matmul keeps. 0: sum is acc, the wgmmas never wait for all.
template <int Promote, class Load, class FirstLanded, class Issue>
__device__ __forceinline__ void wgmma_k_loop(unsigned char* shared, std::int64_t k_steps,
                                             float (&acc)[64], float (&sum)[64], Load&& load,
                                             FirstLanded&& first_landed, Issue&& issue) {
  constexpr int kEvery = Promote > 0 ? Promote : 1;  // (a divisor even when not promoting)
  const unsigned shared_address = smem_address(shared);
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = sum[i] = 0.0f;
    // Prologue: the first kWgAhead k-steps in flight, one commit group each (empty past the end,
    // so that k-step ks is always group ks).
#pragma unroll
  for (int s = 0; s < kWgAhead; ++s) {
    if (s < k_steps) load(s, shared + s * kStageBytes);
    cp_async_commit();
  }
  for (std::int64_t ks = 0; ks < k_steps; ++ks) {
    // k-step ks has landed for every thread, and every warpgroup has finished the wgmmas of
    // ks - 2 (waited at ks - 1), whose stage the prefetch below overwrites.
    cp_async_wait<kWgAhead - 1>();
    fence_proxy_async();
    __syncthreads();
    if (ks == 0 && first_landed(shared)) {
      fence_proxy_async();
      __syncthreads();
    }
    if (ks + kWgAhead < k_steps) {
      load(ks + kWgAhead, shared + ((ks + kWgAhead) % kWgStages) * kStageBytes);
    }
    cp_async_commit();
    fence_accumulators(acc);
    wgmma_fence();
    issue(shared_address + static_cast<unsigned>(ks % kWgStages) * kStageBytes);
    wgmma_commit();
    fence_accumulators(acc);
    if (Promote > 0 && (ks + 1) % kEvery == 0) {  // every wgmma done: sum += acc, acc = 0
      wgmma_wait<0>();
      fence_accumulators(acc);
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        sum[i] += acc[i];
        acc[i] = 0.0f;
      }
    } else {
      wgmma_wait<1>();  // k-step ks - 1 done: its stage may be refilled after the next barrier
    }
    fence_accumulators(acc);
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (Promote > 0) {
#pragma unroll
    for (int i = 0; i < 64; ++i) sum[i] += acc[i];
  }
  // Drain the (empty) trailing copy groups and let both warpgroups finish reading before the
  // next tile's prologue overwrites the stages.
  cp_async_wait<0>();
  __syncthreads();
}

// The epilogue: register 4 j + 2 h + e of thread `thread` (0..127) of warpgroup `warpgroup` is
// row 64 warpgroup + 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e (see the top), times
// alpha (1, exact, for bf16; the inverse scales for FP8); pairs written as in the mma.sync kernel.
template <Product P, int N, class Params>
__device__ __forceinline__ void store_wgmma_accumulators(const Params& prm, const Tile& t,
                                                         const float (&acc)[N], float alpha,
                                                         int warpgroup, int thread) {
  const int warp = thread / 32, lane = thread % 32;
  std::int64_t ldc = 0;
  auto* const c = group_output<P>(prm, t, ldc);
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warpgroup * 64 + warp * 16 + lane / 4 + h * 8;
      const int col = j * 8 + (lane % 4) * 2;
      if (r >= t.tile_rows || col >= t.tile_cols) continue;
      auto* const p = c + (t.m0 + r) * ldc + t.n0 + col;
      const float v0 = alpha * acc[4 * j + 2 * h], v1 = alpha * acc[4 * j + 2 * h + 1];
      if (col + 1 < t.tile_cols) {
        put_pair<P>(p, v0, v1);
      } else {
        put<P>(p, v0);
      }
    }
  }
}

// The bf16 kernel (see the top).
template <Product P, class Out>
__global__ void __launch_bounds__(kWsThreads, 1)
    grouped_wgmma_kernel(const GroupedParams<bf16, Out> prm) {
  constexpr bool kAK = a_k_contiguous<P>(), kBK = b_k_contiguous<P>();
  extern __shared__ unsigned char shared_raw[];
  unsigned char* const stages = aligned_stages(shared_raw);
  const unsigned stages_address = smem_address(stages);
  const unsigned full = stages_address + kWsStages * kWsStageBytes;  // full[s] at full + 8 s
  const unsigned empty = full + kWsStages * 8;                       // empty[s] at empty + 8 s
  if (threadIdx.x == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      mbarrier_init(full + 8 * s, kWsProducers);
      mbarrier_init(empty + 8 * s, kWsConsumers);
    }
    fence_mbarrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier

  const int warpgroup = threadIdx.x / 128, thread = threadIdx.x % 128;
  std::uint32_t step = 0;  // the k-steps of this CTA's earlier tiles, then of this one
  if (warpgroup == 0) {    // the producer
    set_max_registers<kWsProducerRegisters>();
    for_each_tile<P>(prm, [&](const Tile& t, const Operand<bf16>& a, const Operand<bf16>& b) {
      const std::int64_t k_steps = ceil_div(a.k_extent, kWgK);
      for (std::int64_t ks = 0; ks < k_steps; ++ks, ++step) {
        const unsigned s = step % kWsStages;
        mbarrier_wait(empty + 8 * s, ((step / kWsStages) & 1) ^ 1);  // its lap - 1 was read
        unsigned char* const stage = stages + s * kWsStageBytes;
        load_swizzled<kAK, kWsTileM, kWsProducers>(stage, a, t.m0, ks * kWgK, thread);
        load_swizzled<kBK, kWsTileN, kWsProducers>(stage + kWsABytes, b, t.n0, ks * kWgK, thread);
        cp_async_arrive_noinc(full + 8 * s);
      }
    });
    // Leave once the consumers have read every stage (so every copy has landed).
    for (int i = 0; i < kWsStages; ++i, ++step) {
      mbarrier_wait(empty + 8 * (step % kWsStages), ((step / kWsStages) & 1) ^ 1);
    }
    return;
  }

  // A consumer.
  set_max_registers<kWsConsumerRegisters>();
  const int consumer = warpgroup - 1;  // its rows of the tile: 64 consumer ..
  for_each_tile<P>(prm, [&](const Tile& t, const Operand<bf16>& a, const Operand<bf16>&) {
    const std::int64_t k_steps = ceil_div(a.k_extent, kWgK);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
    for (std::int64_t ks = 0; ks < k_steps; ++ks, ++step) {
      const unsigned s = step % kWsStages;
      mbarrier_wait(full + 8 * s, (step / kWsStages) & 1);
      __syncwarp();  // converged for the .aligned wgmma instructions
      fence_proxy_async();
      fence_accumulators(acc);
      wgmma_fence();
      const unsigned stage = stages_address + s * kWsStageBytes;
#pragma unroll
      for (int kk = 0; kk < kWgK / 16; ++kk) {
        wgmma_m64n256k16<kAK ? 0 : 1, kBK ? 0 : 1>(
            acc, operand_descriptor<kAK>(stage, consumer * 64, kk),
            operand_descriptor<kBK>(stage + kWsABytes, 0, kk));
      }
      wgmma_commit();
      fence_accumulators(acc);
      wgmma_wait<1>();  // k-step ks - 1's wgmmas are done: its stage may be refilled
      fence_accumulators(acc);
      if (ks > 0) mbarrier_arrive(empty + 8 * ((step - 1) % kWsStages));
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (k_steps > 0) mbarrier_arrive(empty + 8 * ((step - 1) % kWsStages));
    store_wgmma_accumulators<P>(prm, t, acc, 1.0f, consumer, thread);
    __syncwarp();
  });
}

// ---- FP8 -----------------------------------------------------------------------------------
//
// The FP8 products of grouped_gemm.cu's FP8 kernels (every operand K-contiguous, the casts'
// transposes making it so; see there), in the first design, not warp-specialised: a CTA of two
// warpgroups computes a 128 x 128 output tile, warpgroup w rows 64 w .. 64 w + 63, with
// m64n128k32 wgmmas (64 f32 accumulators a thread); every thread copies operand tiles by cp.async
// into 5 shared stages, 3 k-steps ahead, and one k-step of wgmmas stays in flight while the next
// is issued (wgmma_k_loop). A k-step is 128 FP8 bytes, one 128-byte swizzle row, so an operand
// tile is 128 x 128 bytes (16 KB): row mn at mn * 128, its 16-byte chunk c (k = 16c..16c+15) at
// slot c ^ (mn % 8), the bf16 K-major layout byte for byte, with the same descriptors (SBO =
// 1024); the k32 step kk of the m64n128k32 wgmmas starts 32 kk bytes further. wgrad's group may
// start at a column o_g that is not a multiple of 16 (a chunk): as the mma.sync kernel, the
// copies start at the aligned column below it and the skip = o_g % 16 bytes before it (another
// group's) are zeroed in k-step 0's stage (chunk 0 of row mn, at slot mn % 8) once landed; the
// group's end inside a chunk is cp.async's zero fill. The accumulators are summed into f32 every
// kFp8Promote k-steps (see wgmma_k_loop).

// Copies the k-step at byte k0 of an operand's 128 x 128-byte tile (rows mn0..) into the shared
// tile at s, zero past the extents. Partial: k_extent may end inside a chunk (wgrad); else it is
// a multiple of 16 and a chunk is wholly in or out.
template <bool Partial>
__device__ __forceinline__ void load_swizzled_fp8(unsigned char* s, const Fp8Operand& o,
                                                  std::int64_t mn0, std::int64_t k0) {
  constexpr int kChunks = kWgTile * kWgK8 / 16;
#pragma unroll
  for (int i = 0; i < kChunks / kWgThreads; ++i) {
    const int chunk = threadIdx.x + i * kWgThreads;
    const int mn = chunk / 8, c = chunk % 8;
    const std::int64_t gmn = mn0 + mn, gk = k0 + c * 16;
    const bool valid = gmn < o.mn_extent && gk < o.k_extent;
    int bytes = valid ? 16 : 0;
    if (Partial && valid && o.k_extent - gk < 16) bytes = static_cast<int>(o.k_extent - gk);
    cp_async_bytes(s + mn * 128 + (c ^ (mn % 8)) * 16, valid ? o.p + gmn * o.ld + gk : o.p, bytes);
  }
}

template <Product P, class Out>
__global__ void __launch_bounds__(kWgThreads, 1)
    grouped_fp8_wgmma_kernel(const Fp8Params<Out> prm) {
  constexpr bool kPartial = P == Product::wgrad;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* const shared = aligned_stages(shared_raw);
  const int warpgroup = threadIdx.x / 128;

  for_each_tile<P>(prm, [&](const Tile& t, const Fp8Operand& group_a, const Fp8Operand& group_b) {
    const int skip = fp8_skip<P>(t);  // wgrad: see fp8_skip and the FP8 part's top
    const Fp8Operand a = widened(group_a, skip), b = widened(group_b, skip);
    float acc[64], sum[64];
    wgmma_k_loop<kFp8Promote>(
        shared, ceil_div(a.k_extent, kWgK8), acc, sum,
        [&](std::int64_t step, unsigned char* s) {
          load_swizzled_fp8<kPartial>(s, a, t.m0, step * kWgK8);
          load_swizzled_fp8<kPartial>(s + kOperandBytes, b, t.n0, step * kWgK8);
        },
        [&](unsigned char* s) {  // threads 0-127: A's row threadIdx.x, 128-255: B's
          if (skip == 0) return false;
          const int row = threadIdx.x % kWgTile;
          unsigned char* p =
              s + (threadIdx.x < kWgTile ? 0 : kOperandBytes) + row * 128 + (row % 8) * 16;
          for (int j = 0; j < skip; ++j) p[j] = 0;
          return true;
        },
        [&](unsigned stage) {
#pragma unroll
          for (int kk = 0; kk < kWgK8 / 32; ++kk) {
            wgmma_m64n128k32_fp8<P != Product::forward>(
                acc, operand_descriptor<true>(stage, warpgroup * 64, kk),
                operand_descriptor<true>(stage + kOperandBytes, 0, kk));
          }
        });
    // Times the inverse scales (read here, not kept in a register through the k-loop).
    store_wgmma_accumulators<P>(prm, t, sum, prm.a_scale[0] * prm.b_scale[0], threadIdx.x / 128,
                                threadIdx.x % 128);
  });
}

// Throws unless the current GPU is a Hopper (sm_90), the only one this file is built for.
void check_hopper() {
  const int sm = device_sm();
  QUINTET_CHECK(
      sm == 90,
      "grouped_linear: QUINTET_GROUPED_GEMM=wgmma needs a Hopper GPU (sm_90), this one is "
      "sm_{}; unset it or set it to kernel",
      sm);
}

}  // namespace

template <Product P, class Out>
void launch_wgmma(GroupedParams<bf16, Out> prm, const Stream& stream) {
  check_hopper();
  prm.grid.tile_m = kWsTileM;
  prm.grid.tile_n = kWsTileN;
  launch_persistent(grouped_wgmma_kernel<P, Out>, prm, kWsThreads, kWsShared, stream);
}

template <Product P, class Out>
void launch_wgmma_fp8(Fp8Params<Out> prm, const Stream& stream) {
  check_hopper();
  prm.grid.tile_m = prm.grid.tile_n = kWgTile;
  launch_persistent(grouped_fp8_wgmma_kernel<P, Out>, prm, kWgThreads, kWgShared, stream);
}

template void launch_wgmma<Product::forward, bf16>(GroupedParams<bf16, bf16>, const Stream&);
template void launch_wgmma<Product::dgrad, bf16>(GroupedParams<bf16, bf16>, const Stream&);
template void launch_wgmma<Product::wgrad, float>(GroupedParams<bf16, float>, const Stream&);
template void launch_wgmma_fp8<Product::forward, bf16>(Fp8Params<bf16>, const Stream&);
template void launch_wgmma_fp8<Product::forward, float>(Fp8Params<float>, const Stream&);
template void launch_wgmma_fp8<Product::dgrad, bf16>(Fp8Params<bf16>, const Stream&);
template void launch_wgmma_fp8<Product::dgrad, float>(Fp8Params<float>, const Stream&);
template void launch_wgmma_fp8<Product::wgrad, float>(Fp8Params<float>, const Stream&);

}  // namespace quintet::nn::cuda_ops::grouped