// FP8 on the GPU (quintet/nn/fp8.hpp): the casts (with the amax and the transpose in the same
// pass), the dequantisation, the scale kernel of Fp8TensorScale::scale_on_device, the bias
// gradient of an FP8 output gradient, and the FP8 GEMM through the linear op's cuBLASLt matmul.
//
// The scalar encode and decode are the CPU's (lib/nn/cpu/fp8.cpp) line for line, in f32 bit
// arithmetic, so a cast is bit for bit the CPU's: round to nearest even, saturation to the
// largest finite value, NaN to 0x7f, subnormals kept. (nvcc's defaults keep subnormals and IEEE
// division; the build does not use --use_fast_math.)
#include <algorithm>
#include <cfloat>
#include <vector>

#include "nn/cuda/cublaslt.hpp"
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

// The layout of a format, as lib/nn/cpu/fp8.cpp's.
template <bool E4M3>
struct Fp8Bits {
  static constexpr int bias = E4M3 ? 7 : 15;
  static constexpr int mantissa = E4M3 ? 3 : 2;
  static constexpr unsigned max_bits = E4M3 ? 0x7eu : 0x7bu;
  static constexpr float max_value = E4M3 ? 448.0f : 57344.0f;
  static constexpr float min_normal = E4M3 ? 0x1p-6f : 0x1p-14f;  // 2^(1 - bias)
  static constexpr float unit_inv = E4M3 ? 0x1p9f : 0x1p16f;      // 2^(bias - 1 + mantissa)
  static constexpr float unit = E4M3 ? 0x1p-9f : 0x1p-16f;        // the smallest subnormal
};

template <bool E4M3>
__device__ __forceinline__ std::uint8_t encode(float f) {
  using L = Fp8Bits<E4M3>;
  if (isnan(f)) return 0x7f;
  const unsigned bits = __float_as_uint(f);
  const unsigned sign = (bits >> 24) & 0x80u;
  const float a = fabsf(f);
  if (a >= L::max_value) return static_cast<std::uint8_t>(sign | L::max_bits);
  if (a < L::min_normal) {
    const float units = a * L::unit_inv;  // exact: a power of two, the result below 2^mantissa
    float whole = floorf(units);
    const float rest = units - whole;
    if (rest > 0.5f || (rest == 0.5f && fmodf(whole, 2.0f) != 0.0f)) whole += 1.0f;
    return static_cast<std::uint8_t>(sign | static_cast<unsigned>(whole));
  }
  constexpr int shift = 23 - L::mantissa;
  const unsigned rebiased = __float_as_uint(a) - (static_cast<unsigned>(127 - L::bias) << 23);
  const unsigned rounded =
      (rebiased + (1u << (shift - 1)) - 1u + ((rebiased >> shift) & 1u)) >> shift;
  return static_cast<std::uint8_t>(sign | rounded);
}

template <bool E4M3>
__device__ __forceinline__ float decode(std::uint8_t bits) {
  using L = Fp8Bits<E4M3>;
  const bool negative = (bits & 0x80u) != 0;
  const int exponent_field = (bits & 0x7f) >> L::mantissa;
  const int mantissa = bits & ((1 << L::mantissa) - 1);
  constexpr int all_ones = (1 << (7 - L::mantissa)) - 1;
  float value;
  if (E4M3 && exponent_field == all_ones && mantissa == 7) {
    value = __uint_as_float(0x7fc00000u);
  } else if (!E4M3 && exponent_field == all_ones) {
    value = mantissa == 0 ? __uint_as_float(0x7f800000u) : __uint_as_float(0x7fc00000u);
  } else if (exponent_field == 0) {
    value = static_cast<float>(mantissa) * L::unit;  // exact
  } else {
    value = ldexpf(static_cast<float>(mantissa + (1 << L::mantissa)),
                   exponent_field - L::bias - L::mantissa);
  }
  return negative ? -value : value;
}

constexpr int kTile = 32;     // the cast's tile: 32 x 32 elements
constexpr int kTileRows = 8;  // threads per tile column (blockDim 32 x 8, 4 rows per thread)

// One pass over x [rows, cols]: q = fp8(x * scale[1]) (q may be null: amax only), qt [cols, rows]
// its transpose (null: none), amax (null: none) max'ed with the largest |x| as unsigned bits of
// the float (|x|'s bits order as the values do, NaN above infinity: the CPU's NaN rule). A block
// per 32 x 32 tile; grid.y strides over the tile rows.
template <class T, bool E4M3>
__global__ void __launch_bounds__(kTile* kTileRows)
    cast_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t cols,
                const float* __restrict__ scale, std::uint8_t* __restrict__ q,
                std::uint8_t* __restrict__ qt, unsigned* amax) {
  __shared__ std::uint8_t tile[kTile][kTile + 4];
  __shared__ unsigned warp_max_bits[kTileRows];
  const float s = scale != nullptr ? scale[1] : 1.0f;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kTile + threadIdx.x;
  unsigned max_bits = 0;
  for (std::int64_t tr = blockIdx.y; tr * kTile < rows; tr += gridDim.y) {
    const std::int64_t r0 = tr * kTile;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const std::int64_t r = r0 + j;
      if (r < rows && c < cols) {
        const float v = to_float(x[r * cols + c]);
        max_bits = max(max_bits, __float_as_uint(fabsf(v)));
        if (q != nullptr) {
          const std::uint8_t code = encode<E4M3>(v * s);
          q[r * cols + c] = code;
          tile[j][threadIdx.x] = code;
        }
      }
    }
    if (qt != nullptr) {
      __syncthreads();
      // qt[c', r'] = q[r', c'] with c' along the tile's rows, r' along its columns (coalesced).
      const std::int64_t rt = r0 + threadIdx.x;
      for (int j = threadIdx.y; j < kTile; j += kTileRows) {
        const std::int64_t ct = static_cast<std::int64_t>(blockIdx.x) * kTile + j;
        if (rt < rows && ct < cols) qt[ct * rows + rt] = tile[threadIdx.x][j];
      }
      __syncthreads();  // the tile is rewritten by the next tile row
    }
  }
  if (amax == nullptr) return;
  max_bits = __reduce_max_sync(0xffffffffu, max_bits);
  if (threadIdx.x == 0) warp_max_bits[threadIdx.y] = max_bits;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    unsigned m = 0;
    for (int w = 0; w < kTileRows; ++w) m = max(m, warp_max_bits[w]);
    atomicMax(amax, m);
  }
}

// The vectorized cast: cast_kernel's arithmetic per element (bit for bit) on 16-byte vectors of x
// (V elements: 8 bf16 or 4 f32). A block of kVecThreads threads takes tiles of kVecTileCols
// columns by VecTile<T>::rows rows (128 bf16 rows, 64 f32 rows), kVecLoads vectors a thread, all
// loaded before any is converted; a thread's V codes of a vector leave for q in one V-byte store
// and, where qt is wanted, go to the tile in shared memory as V / 4 words (4 codes of one row a
// word, column j of the 4 in byte j). Then a thread per strip of 4 columns x kStripRows rows reads
// the strip as 16 words, transposes it in registers and writes 4 rows of qt, 16 bytes each.
//
// Shared memory: a tile row is kTileWords words (64 codes) with no padding, so two rows share the
// 32 banks, and tile row r sits in slot r ^ ((r / kStripRows) & 1): in every odd band of 16 rows
// the rows trade places with their neighbours. A warp reads 32 strips at once, 16 of an even band
// and 16 of an odd one, whose rows then lie in slots of opposite parity: all 32 banks once. The
// writes too: a warp's 4-byte stores (f32) and a half-warp's 8-byte stores (bf16) are two
// consecutive rows of one band, in slots of opposite parity.
//
// Up to kCastJobs casts (of one T and format) a launch: cast i takes blocks [first_block[i],
// first_block[i + 1]), tiles_x of them a tile row (block b of the cast: tile column b % tiles_x,
// tile rows b / tiles_x, then every (blocks / tiles_x)-th), so a layer's x and w share one launch
// and one tail. Each cast needs cols a multiple of V, x 16-byte and q V-byte aligned; where qt is
// written, rows a multiple of kStripRows and qt 16-byte aligned (qt + c * rows + r then is for
// every strip): cast_vectorizable.
constexpr int kVecThreads = 256, kVecLoads = 4, kVecTileCols = 64, kCastJobs = 4;
constexpr int kTileWords = kVecTileCols / 4;  // a tile row's words of 4 codes
constexpr int kStripRows = 16;                // a 16-byte store of qt: 16 rows of one column

template <class T>
struct VecTile {
  static constexpr int V = Vec16<T>::kCount;
  static constexpr int vecs = kVecTileCols / V;                  // vectors of a tile row: 8 or 16
  static constexpr int rows_a_load = kVecThreads / vecs;         // tile rows one load step covers
  static constexpr int rows = kVecLoads * rows_a_load;           // 128 (bf16) or 64 (f32)
  static constexpr int strips = rows / kStripRows * kTileWords;  // strips a tile: 128 or 64
  // Blocks an SM holds at least: registers capped at 80 a thread for bf16 (nvcc's own choice,
  // 105, let 2 blocks in) and 64 for f32, met without spilling.
  static constexpr int min_blocks = V == 8 ? 3 : 4;
  static_assert(kVecThreads % vecs == 0 && rows % (2 * kStripRows) == 0 && strips <= kVecThreads);
};

// The shared-memory slot of tile row r (see above): a bijection on each band of kStripRows rows.
__device__ __forceinline__ int tile_slot(int r) { return r ^ ((r / kStripRows) & 1); }

// V codes as V / 4 words, byte j of word w the code of element 4 w + j (little endian: the codes
// in memory order).
template <int V>
struct alignas(V) Codes {
  unsigned w[V / 4];
};

// Four rows of four codes (row i a word, column j in its byte j) into four columns (column j a
// word, row i in its byte i).
__device__ __forceinline__ void transpose4x4(unsigned r0, unsigned r1, unsigned r2, unsigned r3,
                                             unsigned& c0, unsigned& c1, unsigned& c2,
                                             unsigned& c3) {
  // __byte_perm(a, b, s): byte n of the result is byte (nibble n of s) of b:a (0-3 a, 4-7 b).
  const unsigned lo01 = __byte_perm(r0, r1, 0x5140);  // r0.0 r1.0 r0.1 r1.1
  const unsigned hi01 = __byte_perm(r0, r1, 0x7362);  // r0.2 r1.2 r0.3 r1.3
  const unsigned lo23 = __byte_perm(r2, r3, 0x5140);
  const unsigned hi23 = __byte_perm(r2, r3, 0x7362);
  c0 = __byte_perm(lo01, lo23, 0x5410);  // r0.0 r1.0 r2.0 r3.0
  c1 = __byte_perm(lo01, lo23, 0x7632);  // r0.1 r1.1 r2.1 r3.1
  c2 = __byte_perm(hi01, hi23, 0x5410);
  c3 = __byte_perm(hi01, hi23, 0x7632);
}

template <class T>
struct CastJob {
  const Vec16<T>* x;
  std::int64_t rows, cols;
  const float* scale;  // null: 1
  std::uint8_t* q;     // null: none (the amax only)
  std::uint8_t* qt;    // null: none
  unsigned* amax;      // null: none
  unsigned tiles_x;    // tile columns: ceil(cols / kVecTileCols)
};
template <class T>
struct CastJobs {
  CastJob<T> job[kCastJobs];
  unsigned first_block[kCastJobs + 1];
  int count;
};

template <class T, bool E4M3>
__global__ void __launch_bounds__(kVecThreads, VecTile<T>::min_blocks)
    cast_vec_kernel(CastJobs<T> jobs) {
  using Tile = VecTile<T>;
  constexpr int V = Tile::V;
  __shared__ alignas(16) unsigned tile[Tile::rows * kTileWords];  // 8-byte Codes stores
  __shared__ unsigned warp_max_bits[kVecThreads / 32];
  int k = 0;  // the block's cast: the same for the whole block
  while (k + 1 < jobs.count && blockIdx.x >= jobs.first_block[k + 1]) ++k;
  const CastJob<T>& job = jobs.job[k];
  const Vec16<T>* __restrict__ x = job.x;
  const std::int64_t rows = job.rows, cols = job.cols;
  std::uint8_t* __restrict__ q = job.q;
  std::uint8_t* __restrict__ qt = job.qt;
  const unsigned block = blockIdx.x - jobs.first_block[k];
  const unsigned tile_col = block % job.tiles_x;
  const unsigned grid_rows = (jobs.first_block[k + 1] - jobs.first_block[k]) / job.tiles_x;
  const float s = job.scale != nullptr ? job.scale[1] : 1.0f;
  const bool encoding = q != nullptr || qt != nullptr;
  const std::int64_t nvec = cols / V;
  // Load step l: tile row l * rows_a_load + row, vector vec of it (kVecThreads is a multiple of
  // vecs, so vec is the same every step).
  const int row = threadIdx.x / Tile::vecs, vec = threadIdx.x % Tile::vecs;
  const std::int64_t cv = static_cast<std::int64_t>(tile_col) * Tile::vecs + vec;
  // The transpose (threads below Tile::strips): the strip of band `band` (tile rows
  // kStripRows band ...) and of the 4 columns of tile word `word`.
  const int word = threadIdx.x % kTileWords, band = threadIdx.x / kTileWords;
  const std::int64_t ct = static_cast<std::int64_t>(tile_col) * kVecTileCols + 4 * word;
  unsigned max_bits = 0;
  for (std::int64_t tr = block / job.tiles_x; tr * Tile::rows < rows; tr += grid_rows) {
    const std::int64_t r0 = tr * Tile::rows;
    Vec16<T> v[kVecLoads];
#pragma unroll
    for (int l = 0; l < kVecLoads; ++l) {
      const std::int64_t r = r0 + l * Tile::rows_a_load + row;
      if (r < rows && cv < nvec) v[l] = x[r * nvec + cv];
    }
#pragma unroll
    for (int l = 0; l < kVecLoads; ++l) {
      const int tile_row = l * Tile::rows_a_load + row;
      const std::int64_t r = r0 + tile_row;
      if (r >= rows || cv >= nvec) continue;
      Codes<V> codes{};
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float f = to_float(v[l].v[e]);
        max_bits = max(max_bits, __float_as_uint(fabsf(f)));
        if (encoding) codes.w[e / 4] |= static_cast<unsigned>(encode<E4M3>(f * s)) << (8 * (e % 4));
      }
      if (q != nullptr) reinterpret_cast<Codes<V>*>(q + r * cols)[cv] = codes;
      if (qt != nullptr) {
        *reinterpret_cast<Codes<V>*>(tile + tile_slot(tile_row) * kTileWords + vec * (V / 4)) =
            codes;
      }
    }
    if (qt != nullptr) {
      __syncthreads();
      // rows and r0 are multiples of kStripRows, cols of 4: a strip is wholly in or wholly out.
      const std::int64_t rt = r0 + band * kStripRows;
      if (static_cast<int>(threadIdx.x) < Tile::strips && rt < rows && ct < cols) {
        unsigned in[kStripRows];
#pragma unroll
        for (int i = 0; i < kStripRows; ++i) {
          in[i] = tile[tile_slot(band * kStripRows + i) * kTileWords + word];
        }
        unsigned out[4][4];  // out[j][m]: column ct + j, rows rt + 4 m .. rt + 4 m + 3
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          transpose4x4(in[4 * m], in[4 * m + 1], in[4 * m + 2], in[4 * m + 3], out[0][m], out[1][m],
                       out[2][m], out[3][m]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          *reinterpret_cast<uint4*>(qt + (ct + j) * rows + rt) =
              make_uint4(out[j][0], out[j][1], out[j][2], out[j][3]);
        }
      }
      __syncthreads();  // the tile is rewritten by the next tile row
    }
  }
  if (job.amax == nullptr) return;
  max_bits = __reduce_max_sync(0xffffffffu, max_bits);
  if (threadIdx.x % 32 == 0) warp_max_bits[threadIdx.x / 32] = max_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned m = 0;
    for (int w = 0; w < kVecThreads / 32; ++w) m = max(m, warp_max_bits[w]);
    atomicMax(job.amax, m);
  }
}

// Whether cast_vec_kernel takes x [rows, cols] of T into q and qt (either may be null).
template <class T>
bool cast_vectorizable(std::int64_t rows, std::int64_t cols, const void* x, const void* q,
                       const void* qt) {
  constexpr int V = Vec16<T>::kCount;
  return cols % V == 0 && (qt == nullptr || rows % kStripRows == 0) && aligned_to(x, 16) &&
         aligned_to(q, V) && aligned_to(qt, 16);
}

// The amax pass of up to kAmaxTensors tensors in one launch: tensor i takes blocks
// [first_block[i], first_block[i + 1]), which stride over its 16-byte vectors (kAmaxUnroll loads
// in flight a thread) and then its scalar head and tail (row_split: any 2- or 4-byte-aligned
// pointer); each block max's its largest |x| into amax[i] once, with cast_kernel's unsigned-bits
// rule (NaN above infinity).
constexpr int kAmaxTensors = 4, kAmaxUnroll = 4;

template <class T>
struct AmaxJobs {
  const T* x[kAmaxTensors];
  std::int64_t n[kAmaxTensors];
  unsigned* amax[kAmaxTensors];
  unsigned first_block[kAmaxTensors + 1];
  int count;
};

__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(fabsf(v)); }

template <class T>
__device__ __forceinline__ unsigned vec_abs_bits(const Vec16<T>& v) {
  unsigned m = 0;
#pragma unroll
  for (int e = 0; e < Vec16<T>::kCount; ++e) m = max(m, abs_bits(to_float(v.v[e])));
  return m;
}

template <class T>
__global__ void __launch_bounds__(kThreads) amax_kernel(AmaxJobs<T> jobs) {
  __shared__ unsigned scratch[32];
  int i = 0;
  while (i + 1 < jobs.count && blockIdx.x >= jobs.first_block[i + 1]) ++i;
  const T* x = jobs.x[i];
  const std::int64_t block = blockIdx.x - jobs.first_block[i];
  const std::int64_t blocks = jobs.first_block[i + 1] - jobs.first_block[i];
  const std::int64_t start = block * blockDim.x + threadIdx.x, stride = blocks * blockDim.x;
  const RowSplit split = row_split(x, jobs.n[i]);
  const auto* v = reinterpret_cast<const Vec16<T>*>(x + split.head);
  unsigned m = 0;
  std::int64_t k = start;
  for (; k + (kAmaxUnroll - 1) * stride < split.vectors; k += kAmaxUnroll * stride) {
    Vec16<T> a[kAmaxUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) a[u] = v[k + u * stride];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) m = max(m, vec_abs_bits(a[u]));
  }
  for (; k < split.vectors; k += stride) m = max(m, vec_abs_bits(v[k]));
  for (std::int64_t c = start; c < split.scalars(); c += stride)
    m = max(m, abs_bits(to_float(x[split.scalar(c)])));
  m = block_reduce(m, scratch, 0u, [](unsigned u) { return __reduce_max_sync(0xffffffffu, u); });
  if (threadIdx.x == 0) atomicMax(jobs.amax[i], m);
}

template <class T, bool E4M3>
__global__ void dequantize_kernel(const std::uint8_t* q, const float* scale, T* x, std::int64_t n) {
  const float inv = scale[0];
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    x[i] = from_float<T>(decode<E4M3>(q[i]) * inv);
  }
}

// db[c] += sum over rows of decode(q[r, c]) * scale[0]; as linear.cu's column sum.
template <bool E4M3>
__global__ void column_sum_kernel(const std::uint8_t* q, const float* scale, float* db,
                                  std::int64_t rows, std::int64_t cols, std::int64_t chunk) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const float inv = scale[0];
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * chunk;
  const std::int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float sum = 0.0f;
  for (std::int64_t r = r0; r < r1; ++r) sum += decode<E4M3>(q[r * cols + c]) * inv;
  atomicAdd(db + c, sum);
}

// Fp8TensorScale::scale on the device (lib/nn/fp8.cpp's fp8_scale_from_amax and scale(), with a
// non-finite amax recorded as +inf instead of thrown: inf survives the max-reductions of the
// step's end, which may drop a NaN). A thread per scale, up to kAmaxTensors scales a launch; a
// null amax (a scale that does not use it, recording nothing) reads as 0.
struct ScaleJob {
  const float* amax;
  float* state;
  float* out;
  float fp8_max;
  int margin;
  bool use_amax;
};
struct ScaleJobs {
  ScaleJob job[kAmaxTensors];
  int count;
  bool record;
};

__global__ void scale_kernel(ScaleJobs jobs) {
  if (static_cast<int>(threadIdx.x) >= jobs.count) return;
  const ScaleJob j = jobs.job[threadIdx.x];
  const float a = j.amax != nullptr ? j.amax[0] : 0.0f;
  float now = 1.0f;  // an all-zero tensor (or a non-finite one, refused at the step's end)
  if (isfinite(a) && a > 0.0f) {
    const float s = ldexpf(__fdiv_rn(j.fp8_max, a), -j.margin);
    now = isfinite(s) ? s : FLT_MAX;
  }
  if (jobs.record) j.state[1] = isfinite(a) ? fmaxf(j.state[1], a) : INFINITY;
  const float s = j.use_amax ? now : j.state[0];
  j.out[0] = __fdiv_rn(1.0f, s);
  j.out[1] = s;
}

// y = T(tmp + b) (b null: none), or y += tmp (accumulate, y f32): the fallback GEMM's epilogue.
template <class T>
__global__ void store_kernel(const float* tmp, const T* b, T* y, std::int64_t rows,
                             std::int64_t cols, bool accumulate) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    float v = tmp[i];
    if (accumulate) v += to_float(y[i]);
    if (b != nullptr) v += to_float(b[i % cols]);
    y[i] = from_float<T>(v);
  }
}

template <class F>
void dispatch_format(Fp8Format format, F&& f) {
  if (format == Fp8Format::e4m3) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

cudaDataType_t fp8_type(Fp8Format format) {
  return format == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// Row-major y [n, m] = a [n, k] · b [m, k]ᵀ, as cuBLAS counts it column-major yᵀ [m, n] =
// op_T(b as [k, m]) · (a as [k, n]): "TN", the one layout of Hopper's FP8 kernels.
LtMatmul nt_matmul(std::int64_t n, std::int64_t m, std::int64_t k, const void* a, const void* b,
                   void* y) {
  LtMatmul mm;
  mm.trans_a = true;
  mm.m = m;
  mm.n = n;
  mm.k = k;
  mm.a = b;
  mm.lda = k;
  mm.b = a;
  mm.ldb = k;
  mm.d = y;
  mm.ldd = m;
  return mm;
}

// Rows of x viewed as [rows, cols] (cols its last dimension).
std::int64_t rows_of(const Tensor& x) {
  const std::int64_t cols = x.dim() == 0 ? 1 : x.size(x.dim() - 1);
  return cols == 0 ? 0 : x.numel() / cols;
}

// A cast as the kernels see it (tiles_x left 0; x as 16-byte vectors whether or not it is
// aligned: cast_vectorizable decides).
template <class T>
CastJob<T> cast_job(const Fp8CastJob& c) {
  CastJob<T> job{};
  job.x = reinterpret_cast<const Vec16<T>*>(c.x.data_ptr());
  job.cols = c.x.dim() == 0 ? 1 : c.x.size(c.x.dim() - 1);
  job.rows = rows_of(c.x);
  job.scale = c.scale.defined() ? ptr<float>(c.scale) : nullptr;
  job.q = c.q.defined() ? ptr<std::uint8_t>(c.q) : nullptr;
  job.qt = c.qt.defined() ? ptr<std::uint8_t>(c.qt) : nullptr;
  job.amax = c.amax.defined() ? static_cast<unsigned*>(c.amax.data_ptr()) : nullptr;
  return job;
}

}  // namespace

void fp8_cast(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& q,
              const Tensor& qt, const Tensor& amax, const Stream& stream) {
  fp8_casts({Fp8CastJob{x, scale, format, q, qt, amax}}, stream);
}

void fp8_casts(const std::vector<Fp8CastJob>& casts, const Stream& stream) {
  // The scalar kernel's casts launch one by one; the vectorized kernel's go in one launch per run
  // of up to kCastJobs of one dtype and format (a linear layer's x and w).
  std::vector<const Fp8CastJob*> vec;
  for (const Fp8CastJob& c : casts) {
    dispatch_compute(c.x.dtype(), "fp8_cast", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const CastJob<T> j = cast_job<T>(c);
      if (j.rows == 0 || j.cols == 0) return;
      if (cast_vectorizable<T>(j.rows, j.cols, j.x, j.q, j.qt)) {
        vec.push_back(&c);
        return;
      }
      const std::int64_t tile_rows = (j.rows + kTile - 1) / kTile;
      const dim3 grid(static_cast<unsigned>((j.cols + kTile - 1) / kTile),
                      static_cast<unsigned>(std::min<std::int64_t>(tile_rows, 65535)));
      dispatch_format(c.format, [&](auto e4m3) {
        cast_kernel<T, decltype(e4m3)::value><<<grid, dim3(kTile, kTileRows), 0, stream.handle()>>>(
            ptr<T>(c.x), j.rows, j.cols, j.scale, j.q, j.qt, j.amax);
        check_launch();
      });
    });
  }
  std::size_t i = 0;
  while (i < vec.size()) {
    const DType dtype = vec[i]->x.dtype();
    const Fp8Format format = vec[i]->format;
    std::size_t end = i;
    while (end < vec.size() && end - i < kCastJobs && vec[end]->x.dtype() == dtype &&
           vec[end]->format == format) {
      ++end;
    }
    dispatch_compute(dtype, "fp8_cast", [&](auto tag) {
      using T = typename decltype(tag)::type;
      CastJobs<T> jobs{};
      unsigned blocks = 0;
      for (std::size_t k = i; k < end; ++k) {
        CastJob<T>& job = jobs.job[jobs.count];
        job = cast_job<T>(*vec[k]);
        const std::int64_t tiles_x = (job.cols + kVecTileCols - 1) / kVecTileCols;
        const std::int64_t tiles_y = (job.rows + VecTile<T>::rows - 1) / VecTile<T>::rows;
        // Up to 65535 blocks down a tile column (more tile rows: the blocks stride), and the
        // launch's blocks within a grid's 2^31 - 1.
        constexpr std::int64_t kMostBlocks = std::int64_t{0x7fffffff} / kCastJobs;
        const std::int64_t grid_rows = std::max<std::int64_t>(
            1, std::min<std::int64_t>({tiles_y, 65535, kMostBlocks / tiles_x}));
        job.tiles_x = static_cast<unsigned>(tiles_x);
        jobs.first_block[jobs.count++] = blocks;
        blocks += static_cast<unsigned>(tiles_x * grid_rows);
      }
      jobs.first_block[jobs.count] = blocks;
      dispatch_format(format, [&](auto e4m3) {
        cast_vec_kernel<T, decltype(e4m3)::value>
            <<<blocks, kVecThreads, 0, stream.handle()>>>(jobs);
        check_launch();
      });
    });
    i = end;
  }
}

void fp8_amaxes(const std::vector<Tensor>& xs, const Tensor& amax, const Stream& stream) {
  // One launch per run of up to kAmaxTensors tensors of one dtype (the linear layers' x and w
  // share theirs).
  const std::int64_t cap = 4 * static_cast<std::int64_t>(multiprocessors(amax.device()));
  std::size_t i = 0;
  while (i < xs.size()) {
    const DType dtype = xs[i].dtype();
    std::size_t end = i;
    while (end < xs.size() && end - i < kAmaxTensors && xs[end].dtype() == dtype) ++end;
    dispatch_compute(dtype, "fp8_amax", [&](auto tag) {
      using T = typename decltype(tag)::type;
      AmaxJobs<T> jobs{};
      unsigned blocks = 0;
      for (std::size_t j = i; j < end; ++j) {
        const int t = jobs.count++;
        jobs.x[t] = ptr<T>(xs[j]);
        jobs.n[t] = xs[j].numel();
        jobs.amax[t] = static_cast<unsigned*>(amax.data_ptr()) + j;
        jobs.first_block[t] = blocks;
        const std::int64_t per_block = std::int64_t{kThreads} * kAmaxUnroll * Vec16<T>::kCount;
        blocks += static_cast<unsigned>(
            std::clamp<std::int64_t>((jobs.n[t] + per_block - 1) / per_block, 1, cap));
      }
      jobs.first_block[jobs.count] = blocks;
      amax_kernel<T><<<blocks, kThreads, 0, stream.handle()>>>(jobs);
      check_launch();
    });
    i = end;
  }
}

void fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& x,
                    const Stream& stream) {
  const std::int64_t n = q.numel();
  if (n == 0) return;
  dispatch_compute(x.dtype(), "fp8_dequantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_format(format, [&](auto e4m3) {
      dequantize_kernel<T, decltype(e4m3)::value><<<grid_for(n), kThreads, 0, stream.handle()>>>(
          ptr<std::uint8_t>(q), ptr<float>(scale), ptr<T>(x), n);
      check_launch();
    });
  });
}

void fp8_column_sum(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& db,
                    const Stream& stream) {
  const std::int64_t cols = q.size(q.dim() - 1), rows = rows_of(q);
  if (rows == 0 || cols == 0) return;
  const std::int64_t chunk = std::max<std::int64_t>(256, (rows + 65534) / 65535);
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>((rows + chunk - 1) / chunk));
  dispatch_format(format, [&](auto e4m3) {
    column_sum_kernel<decltype(e4m3)::value><<<grid, kThreads, 0, stream.handle()>>>(
        ptr<std::uint8_t>(q), ptr<float>(scale), ptr<float>(db), rows, cols, chunk);
    check_launch();
  });
}

void fp8_scale(const Tensor& amax, const Tensor& state, const Tensor& out, Fp8Format format,
               int margin, bool use_amax, bool record, const Stream& stream) {
  fp8_scales({Fp8ScaleArgs{amax, state, out, format, margin, use_amax}}, record, stream);
}

void fp8_scales(const std::vector<Fp8ScaleArgs>& scales, bool record, const Stream& stream) {
  for (std::size_t i = 0; i < scales.size(); i += kAmaxTensors) {
    ScaleJobs jobs{};
    jobs.record = record;
    for (std::size_t j = i; j < scales.size() && j - i < kAmaxTensors; ++j) {
      const Fp8ScaleArgs& a = scales[j];
      jobs.job[jobs.count++] = ScaleJob{a.amax.defined() ? ptr<float>(a.amax) : nullptr,
                                        ptr<float>(a.state),
                                        ptr<float>(a.out),
                                        fp8_max(a.format),
                                        a.margin,
                                        a.use_amax};
    }
    scale_kernel<<<1, 32, 0, stream.handle()>>>(jobs);
    check_launch();
  }
}

void fp8_gemm(const Tensor& a, const Tensor& a_scale, Fp8Format a_format, const Tensor& b,
              const Tensor& b_scale, Fp8Format b_format, const Tensor& bias, const Tensor& y,
              bool accumulate, bool fast_accum, const Stream& stream) {
  const std::int64_t n = a.size(0), k = a.size(1), m = b.size(0);
  if (n == 0 || m == 0) return;
  if (k == 0) {  // an empty product: y = bias (or 0), or y unchanged
    if (accumulate) return;
    Tensor zeros = Tensor::empty({n, m}, DType::f32, y.device(), stream);
    zeros.fill_(0.0, stream);
    dispatch_compute(y.dtype(), "fp8_gemm", [&](auto tag) {
      using T = typename decltype(tag)::type;
      store_kernel<T><<<grid_for(n * m), kThreads, 0, stream.handle()>>>(
          ptr<float>(zeros), bias.defined() ? ptr<T>(bias) : nullptr, ptr<T>(y), n, m, false);
      check_launch();
    });
    return;
  }
  LtMatmul mm = nt_matmul(n, m, k, a.data_ptr(), b.data_ptr(), y.data_ptr());
  mm.ab_type = fp8_type(b_format);
  mm.b_type = fp8_type(a_format);
  mm.d_type = y.dtype() == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  mm.beta = accumulate ? 1.0f : 0.0f;
  mm.bias = bias.defined() ? bias.data_ptr() : nullptr;
  // The inverse scales lead their tensors, so these pointers are as aligned as the allocations:
  // cuBLASLt 13.1 runs no FP8 algorithm with a scale pointer 4 bytes past a 16-byte boundary
  // (scripts/bench/cublaslt_fp8_probe.cu, on an H100 and an H200).
  mm.a_scale = static_cast<const float*>(b_scale.data_ptr());
  mm.b_scale = static_cast<const float*>(a_scale.data_ptr());
  mm.fast_accum = fast_accum;
  // cuBLASLt's FP8 kernels need every dimension a multiple of 16 (and 16-byte-aligned data,
  // which its heuristic checks); otherwise, or where it has no FP8 algorithm, the fallback.
  if (m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && try_lt_matmul(mm, stream)) return;

  // Fallback: both operands dequantised to f32, an f32 product into a scratch, then the bias or
  // the accumulation added in f32 and y written in its dtype.
  const Tensor ad = Tensor::empty({n, k}, DType::f32, y.device(), stream);
  const Tensor bd = Tensor::empty({m, k}, DType::f32, y.device(), stream);
  fp8_dequantize(a, a_scale, a_format, ad, stream);
  fp8_dequantize(b, b_scale, b_format, bd, stream);
  const Tensor tmp = Tensor::empty({n, m}, DType::f32, y.device(), stream);
  LtMatmul f = nt_matmul(n, m, k, ad.data_ptr(), bd.data_ptr(), tmp.data_ptr());
  f.ab_type = f.d_type = CUDA_R_32F;
  lt_matmul(f, stream);
  dispatch_compute(y.dtype(), "fp8_gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    store_kernel<T><<<grid_for(n * m), kThreads, 0, stream.handle()>>>(
        ptr<float>(tmp), bias.defined() ? ptr<T>(bias) : nullptr, ptr<T>(y), n, m, accumulate);
    check_launch();
  });
}

}  // namespace quintet::nn::cuda_ops
