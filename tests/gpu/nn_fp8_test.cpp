// FP8 on the GPU against the CPU (quintet/nn/fp8.hpp): the casts bit for bit on edge inputs
// (zeros, -0, FP8 and f32 subnormals, ties, the largest values, overflow, infinities, NaN) in f32
// and bf16, with the transpose and the amax of the same pass, without the transpose, and the amax
// alone, at shapes straddling both cast kernels' tiles and taller than their grids, and several
// casts in shared launches (fp8_casts); every pattern dequantised bit for bit; the scale kernel;
// and the FP8 GEMM (the forward, dgrad and wgrad forms, cuBLASLt's FP8 kernels at multiples of 16
// and the f32 fallback elsewhere) against the CPU emulation within one ULP of the output.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpu/nn_gpu_compare.hpp"
#include "nn/cuda/cuda_ops.hpp"
#include "quintet/nn/fp8.hpp"

using namespace quintet;
using namespace quintet::nn;
using namespace nn_gpu_test;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();
const Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

// Edge values of both formats (before the scale): signed zeros, FP8 subnormals and the ties
// between them, the smallest normals, ties between normals, the largest finite values and just
// above and below, overflow, infinities, NaN, f32 subnormals.
std::vector<float> edge_values() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          std::ldexp(1.0f, -9),
                          std::ldexp(1.0f, -10),  // tie between 0 and E4M3's smallest: to 0
                          std::ldexp(3.0f, -10),  // tie between 1 and 2 units: to 2
                          std::ldexp(5.0f, -10),
                          -std::ldexp(7.0f, -10),
                          std::ldexp(1.0f, -6),
                          std::ldexp(15.0f, -10),
                          std::ldexp(1.0f, -16),
                          std::ldexp(1.0f, -17),
                          std::ldexp(3.0f, -17),
                          std::ldexp(1.0f, -14),
                          1.0625f,  // tie in E4M3 (1 + 1/16): to 1
                          1.1875f,  // tie in E4M3: to 1.25
                          1.125f,   // tie in E5M2: to 1
                          1.375f,   // tie in E5M2: to 1.5
                          240.0f,
                          447.0f,
                          448.0f,
                          449.0f,
                          464.0f,
                          -500.0f,
                          57343.0f,
                          57344.0f,
                          61440.0f,
                          -1e6f,
                          FLT_MAX,
                          kInf,
                          -kInf,
                          kNan,
                          -kNan,
                          std::ldexp(1.0f, -130),  // f32 subnormal
                          -std::ldexp(1.0f, -149),
                          FLT_MIN,
                          0.3f,
                          -2.7f,
                          100.0f};
  return v;
}

// rows x cols values: the edge values and, after them, random ones of spread magnitudes; NaN and
// infinities only where `finite` is false.
std::vector<float> cast_input(std::int64_t rows, std::int64_t cols, bool finite,
                              std::uint64_t seed) {
  std::vector<float> edges;
  for (const float e : edge_values()) {
    if (!finite || std::isfinite(e)) edges.push_back(e);
  }
  const std::vector<float> r = Tensor::randn({rows * cols}, seed).to_vector<float>();
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = i < edges.size() ? edges[i] : r[i] * std::ldexp(1.0f, static_cast<int>(i % 24) - 12);
  }
  return v;
}

std::vector<std::uint8_t> bytes(const Tensor& t, const Stream& stream) {
  stream.synchronize();
  return t.to(Device::cpu()).to_vector<std::uint8_t>();
}

// A GPU tensor's values as f32 once the stream's work is done (a copy into pinned memory does
// not wait by itself).
std::vector<float> floats(const Tensor& t, const Stream& stream) {
  const Tensor h = t.to(DType::f32, stream).to(Device::cpu(), stream);
  stream.synchronize();
  return h.to_vector<float>();
}

// The unit in the last place of |v| in a format of `bits` significant bits (normal range).
double ulp(double v, int bits) {
  const double a = std::abs(v);
  if (a == 0.0) return 0.0;
  return std::ldexp(1.0, std::ilogb(a) - (bits - 1));
}

// Casts x [rows, cols] (f32 or bf16) on the GPU every way the kernels take it and checks each
// against the CPU: q with its transpose and the amax (fp8_cast), q alone (transposed = false) with
// the amax, the amax alone (cuda_ops::fp8_cast with no q: the cast kernels' amax-only form), and
// the host amax (fp8_amax, the amax kernel).
void check_casts(const Tensor& x_cpu, Fp8Format f, float scale, const Stream& s) {
  const Device gpu = Device::cuda(0);
  const Stream cpu;
  const std::int64_t rows = x_cpu.size(0), cols = x_cpu.size(1);
  const Tensor x_gpu = x_cpu.to(gpu, s);
  const std::vector<std::uint8_t> want =
      fp8_quantize(x_cpu, scale, f, cpu).to_vector<std::uint8_t>();
  const float a_want = fp8_amax(x_cpu, cpu);
  const auto check_amax = [&](const char* form, float a) {
    INFO("amax of " << form);
    if (std::isnan(a_want)) {
      CHECK(std::isnan(a));
    } else {
      CHECK(a == a_want);
    }
  };
  const auto zero_amax = [&] {
    Tensor amax = Tensor::empty({1}, DType::f32, gpu, s);
    amax.fill_(0.0, s);
    return amax;
  };
  const Tensor sc = fp8_scale_tensor(scale, gpu, s);

  const Tensor amax = zero_amax();
  const Fp8Tensor q = fp8_cast(x_gpu, sc, f, true, amax, s);
  CHECK(bytes(q.data, s) == want);
  const std::vector<std::uint8_t> qt = bytes(q.transposed, s);
  REQUIRE(q.transposed.shape() == Shape{cols, rows});
  std::int64_t transpose_wrong = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t k = 0; k < cols; ++k)
      transpose_wrong += qt[k * rows + r] != want[r * cols + k];
  }
  CHECK(transpose_wrong == 0);
  check_amax("the cast with its transpose", floats(amax, s)[0]);

  const Tensor amax_q = zero_amax();
  const Fp8Tensor q_alone = fp8_cast(x_gpu, sc, f, false, amax_q, s);
  CHECK(!q_alone.transposed.defined());
  CHECK(bytes(q_alone.data, s) == want);
  check_amax("the cast without its transpose", floats(amax_q, s)[0]);

#if QUINTET_HAS_CUDA
  const Tensor amax_alone = zero_amax();
  cuda_ops::fp8_cast(x_gpu, Tensor(), f, Tensor(), Tensor(), amax_alone, s);
  check_amax("the cast kernel without q", floats(amax_alone, s)[0]);
#endif

  const float a_host = fp8_amax(x_gpu, s);  // the host form, through the amax kernel
  CHECK((a_host == a_want || (std::isnan(a_want) && std::isnan(a_host))));
}

}  // namespace

TEST_CASE("FP8 casts on the GPU equal the CPU's bit for bit, with the transpose and amax") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  struct Case {
    std::int64_t rows, cols;
    bool finite;
  };
  // The scalar kernel (cols not a multiple of a 16-byte vector: 8 bf16, 4 f32): one tile, tiles
  // cut at both edges, a single row and column, a tall thin one. The vectorized kernel (tiles of
  // 64 columns by 128 bf16 or 64 f32 rows; the transpose in strips of 4 columns by 16 rows, so
  // rows a multiple of 16 where qt is written, else the cast with its transpose is scalar and q
  // alone vectorized): rows a multiple of 8 but not of 16, rows not a multiple of 8, one row of
  // one vector; one band of 16 rows, of one vector (bf16) or two (f32), and of one f32 vector;
  // three bands (an odd one between); a tile and a band (bf16) or two tiles and a band (f32) by
  // three tiles and a vector; whole tiles both ways; tiles cut at both edges; columns not whole
  // words of a tile (10 f32 or 5 bf16 vectors); three f32 vectors (bf16 scalar).
  const Case cases[] = {{32, 32, true},    {37, 45, false},  {1, 70, false},    {70, 1, true},
                        {129, 97, true},   {4100, 3, false}, {72, 200, true},   {40, 128, false},
                        {33, 64, true},    {1, 8, false},    {16, 8, false},    {16, 16, true},
                        {16, 4, true},     {48, 64, true},   {144, 200, false}, {256, 192, true},
                        {272, 136, false}, {32, 40, true},   {80, 12, true}};
  std::uint64_t seed = 500;
  for (const Case& c : cases) {
    for (const DType t : {DType::f32, DType::bf16}) {
      for (const Fp8Format f : kFormats) {
        for (const float scale : {1.0f, 3.7f, 0.01f}) {
          INFO("[" << c.rows << ", " << c.cols << "] " << dtype_name(t) << " " << fp8_format_name(f)
                   << " scale " << scale);
          const Tensor x = Tensor::from_vector<float>(cast_input(c.rows, c.cols, c.finite, ++seed),
                                                      {c.rows, c.cols})
                               .to(t);
          check_casts(x, f, scale, s);
        }
      }
    }
  }
}

TEST_CASE("FP8 casts on the GPU of tensors taller than the grid equal the CPU's") {
  // More tile rows than a grid's 65535: the blocks stride over the tile rows (some take two).
  // The vectorized kernel's f32 and bf16 tiles (64 and 128 rows) and the scalar kernel's (32),
  // each with a band of 16 rows past the last whole tile.
  const Stream s = Stream::create(Device::cuda(0));
  struct Case {
    std::int64_t rows, cols;
    DType dtype;
  };
  const Case cases[] = {{65535 * 64 + 80, 4, DType::f32},
                        {65535 * 128 + 144, 8, DType::bf16},
                        {65535 * 32 + 48, 3, DType::f32}};
  std::uint64_t seed = 600;
  for (const Case& c : cases) {
    INFO("[" << c.rows << ", " << c.cols << "] " << dtype_name(c.dtype));
    const Tensor x =
        Tensor::from_vector<float>(cast_input(c.rows, c.cols, true, ++seed), {c.rows, c.cols})
            .to(c.dtype);
    check_casts(x, Fp8Format::e4m3, 3.7f, s);
  }
}

TEST_CASE("FP8 casts of several tensors on the GPU, in shared launches, equal one at a time") {
  // Six bf16 E4M3 casts the vectorized kernel takes (two launches: four a launch), of different
  // tile counts (one tile; columns and rows cut; one band; past a tile row; more rows than
  // columns), one without its transpose; between them casts the scalar kernel takes (rows not a
  // multiple of 16 with the transpose, odd columns), which launch alone; then an f32 cast and an
  // E5M2 one (launches of their own), an empty one, and two sharing an amax. Each against fp8_cast
  // alone on the GPU and against the CPU.
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  struct Case {
    std::int64_t rows, cols;
    DType dtype;
    Fp8Format format;
    bool transposed;
    int amax;  // the amax slot (-1: none)
  };
  const Fp8Format e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
  const DType bf = DType::bf16, f32 = DType::f32;
  const Case cases[] = {
      {128, 64, bf, e4, true, 0},   {144, 200, bf, e4, true, 1}, {72, 200, bf, e4, true, 2},
      {16, 8, bf, e4, true, 3},     {272, 136, bf, e4, true, 4}, {37, 45, bf, e4, true, 5},
      {256, 192, bf, e4, false, 6}, {400, 24, bf, e4, true, -1}, {48, 64, f32, e4, true, 7},
      {80, 64, bf, e5, true, 8},    {0, 64, bf, e4, true, 9},    {32, 40, bf, e4, true, 9}};
  constexpr std::int64_t kSlots = 10;
  std::vector<Tensor> xs_cpu;
  std::vector<Fp8CastArgs> casts;
  Tensor amax = Tensor::empty({kSlots}, DType::f32, gpu, s);
  amax.fill_(0.0, s);
  std::uint64_t seed = 650;
  for (const Case& c : cases) {
    xs_cpu.push_back(
        Tensor::from_vector<float>(cast_input(c.rows, c.cols, true, ++seed), {c.rows, c.cols})
            .to(c.dtype));
    casts.push_back({xs_cpu.back().to(gpu, s),
                     fp8_scale_tensor(c.rows % 3 == 0 ? 3.7f : 0.01f, gpu, s), c.format,
                     c.transposed, c.amax >= 0 ? amax.narrow(0, c.amax, 1) : Tensor()});
  }
  const std::vector<Fp8Tensor> got = fp8_casts(casts, s);
  REQUIRE(got.size() == casts.size());
  std::vector<float> amax_want(kSlots, 0.0f);
  for (std::size_t i = 0; i < casts.size(); ++i) {
    const Case& c = cases[i];
    INFO("cast " << i << ": [" << c.rows << ", " << c.cols << "] " << dtype_name(c.dtype) << " "
                 << fp8_format_name(c.format) << (c.transposed ? " with its transpose" : ""));
    const Fp8CastArgs& a = casts[i];
    const Fp8Tensor alone = fp8_cast(a.x, a.scale, a.format, a.transposed, Tensor(), s);
    const std::vector<std::uint8_t> want = bytes(alone.data, s);
    CHECK(bytes(got[i].data, s) == want);
    const float scale = floats(a.scale, s)[1];
    CHECK(want == fp8_quantize(xs_cpu[i], scale, c.format, cpu).to_vector<std::uint8_t>());
    REQUIRE(got[i].transposed.defined() == c.transposed);
    if (c.transposed) CHECK(bytes(got[i].transposed, s) == bytes(alone.transposed, s));
    if (c.amax >= 0) {
      amax_want[c.amax] = std::max(amax_want[c.amax], fp8_amax(xs_cpu[i], cpu));
    }
  }
  CHECK(floats(amax, s) == amax_want);
}

TEST_CASE("FP8 amaxes of several tensors on the GPU, in one pass each, equal the CPU's") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  // Each tensor a view `offset` elements into a 1-D buffer (an offset not a multiple of 16 bytes:
  // the scalar head), with its largest magnitude at `peak` (-1: the edge values lead, NaN and
  // infinities among them where not finite).
  struct Case {
    std::int64_t n, offset, peak;
    DType dtype;
    bool finite;
  };
  // Empty, one value, fewer than a vector, a tail, NaN and infinities, more vectors than the
  // unrolled loop takes a thread (several blocks), and over the blocks' cap (5M bf16: grid-stride
  // rounds); then seven of one dtype (two launches) and the dtypes mixed (a launch per run).
  const std::vector<std::vector<Case>> sets = {{{0, 0, -1, DType::bf16, true},
                                                {1, 0, 0, DType::bf16, true},
                                                {7, 3, 6, DType::bf16, true},
                                                {12301, 1, 12300, DType::bf16, true},
                                                {2049, 1, -1, DType::bf16, false},
                                                {300001, 5, 0, DType::bf16, true},
                                                {5000000, 0, 4999999, DType::bf16, true}},
                                               {{45, 0, -1, DType::f32, false},
                                                {70001, 2, 70000, DType::f32, true},
                                                {9, 1, 4, DType::f32, true},
                                                {8192, 0, 8191, DType::f32, true},
                                                {4100, 3, -1, DType::f32, true},
                                                {33, 0, 32, DType::f32, true},
                                                {1000, 0, 0, DType::f32, true}},
                                               {{129, 0, 128, DType::bf16, true},
                                                {97, 1, -1, DType::f32, false},
                                                {640, 0, 639, DType::bf16, true},
                                                {3, 0, 1, DType::f32, true}}};
  std::uint64_t seed = 700;
  for (const std::vector<Case>& set : sets) {
    std::vector<Tensor> xs_cpu, xs_gpu;
    std::vector<float> before;
    for (const Case& c : set) {
      std::vector<float> v = cast_input(1, c.offset + c.n, c.finite, ++seed);
      if (c.peak >= 0) {
        for (float& e : v) e = std::fmod(e, 100.0f);  // finite, below the peak
        v[static_cast<std::size_t>(c.offset + c.peak)] = -1000.0f - static_cast<float>(c.n);
      } else {
        std::rotate(v.rbegin(), v.rbegin() + c.offset, v.rend());  // the edge values after offset
      }
      const Tensor buf = Tensor::from_vector<float>(v, {c.offset + c.n}).to(c.dtype);
      xs_cpu.push_back(buf.narrow(0, c.offset, c.n));
      xs_gpu.push_back(buf.to(gpu, s).narrow(0, c.offset, c.n));
      before.push_back(static_cast<float>(xs_cpu.size() % 3));  // what each amax holds first
    }
    const auto n = static_cast<std::int64_t>(set.size());
    const Tensor amax = Tensor::from_vector<float>(before, {n}).to(gpu, s);
    fp8_amaxes_into(xs_gpu, amax, s);
    const std::vector<float> got = floats(amax, s);
    for (std::size_t i = 0; i < set.size(); ++i) {
      INFO("tensor " << i << ": " << set[i].n << " " << dtype_name(set[i].dtype) << " at offset "
                     << set[i].offset);
      const float want = std::fmax(before[i], fp8_amax(xs_cpu[i], cpu));
      if (std::isnan(fp8_amax(xs_cpu[i], cpu))) {
        CHECK(std::isnan(got[i]));
      } else {
        CHECK(got[i] == want);
      }
    }
  }
  REQUIRE_THROWS_QUINTET(fp8_amaxes_into({Tensor::zeros({4}, DType::f32, gpu)},
                                         Tensor::zeros({2}, DType::f32, gpu), s),
                         InvalidArgument, "expected a contiguous f32 [1]");
}

TEST_CASE("FP8 scales of several tensors on the GPU in one launch equal the host's") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  for (const Fp8Scaling scaling : {Fp8Scaling::current, Fp8Scaling::delayed}) {
    // Five scales (two launches: four a launch), the formats and margins mixed.
    std::vector<Fp8TensorScale> host, dev;
    for (int i = 0; i < 5; ++i) {
      const Fp8Format f = i % 2 == 0 ? Fp8Format::e4m3 : Fp8Format::e5m2;
      const Fp8Recipe recipe{Fp8Mode::hybrid, scaling, 2, i % 3};
      host.emplace_back(f, recipe, "t" + std::to_string(i));
      dev.emplace_back(f, recipe, "t" + std::to_string(i));
    }
    std::vector<Fp8TensorScale*> ptrs;
    for (Fp8TensorScale& d : dev) ptrs.push_back(&d);
    const std::vector<std::vector<float>> steps{{3.0f, 0.0f, 7e-3f, 1e-40f, 2.0e4f},
                                                {1.0f, 2.0f, 0.0f, 5.0f, 0.25f},
                                                {0.5f, 9.0f, 1.0f, 0.0f, 3.0f}};
    for (const std::vector<float>& a : steps) {
      INFO(fp8_scaling_name(scaling) << " amax " << a[0]);
      bool known = true;  // delayed scaling with a history: no amax read, nothing recorded
      for (const Fp8TensorScale& d : dev) known = known && !d.uses_amax();
      const std::vector<Tensor> got = Fp8TensorScale::scales_on_device(
          ptrs, known ? Tensor() : Tensor::from_vector<float>(a, {5}).to(gpu, s), !known, s);
      REQUIRE(got.size() == 5);
      if (known) {  // made once a step: a second call returns the same tensors
        const std::vector<Tensor> again =
            Fp8TensorScale::scales_on_device(ptrs, Tensor(), false, s);
        for (std::size_t i = 0; i < 5; ++i) CHECK(again[i].data_ptr() == got[i].data_ptr());
      }
      for (std::size_t i = 0; i < 5; ++i) {
        INFO("scale " << i);
        const float want = host[i].scale(a[i]);
        CHECK(floats(got[i], s) == std::vector<float>{1.0f / want, want});
        CHECK(reinterpret_cast<std::uintptr_t>(got[i].data_ptr()) % 16 == 0);  // cuBLASLt's
        // What the casts record under delayed scaling with a history.
        if (known) dev[i].step_amax_slot().fill_(a[i], s);
        dev[i].end_device_step(floats(dev[i].device_state(), s)[1], s);
        host[i].end_step();
        CHECK(dev[i].history() == host[i].history());
        CHECK(dev[i].delayed_scale() == host[i].delayed_scale());
      }
    }
  }
}

TEST_CASE("FP8 dequantisation on the GPU equals the CPU's for every pattern") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  std::vector<std::uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<std::uint8_t>(i);
  const Tensor q_cpu = Tensor::from_vector<std::uint8_t>(all, {16, 16});
  for (const Fp8Format f : kFormats) {
    for (const DType t : {DType::f32, DType::bf16}) {
      for (const float scale : {1.0f, 3.7f, 1e-3f}) {
        INFO(fp8_format_name(f) << " " << dtype_name(t) << " scale " << scale);
        const Tensor got = fp8_dequantize(q_cpu.to(gpu, s), scale, f, t, s);
        const std::vector<float> g = floats(got, s);
        const std::vector<float> w =
            fp8_dequantize(q_cpu, scale, f, t, cpu).to(DType::f32).to_vector<float>();
        for (int i = 0; i < 256; ++i) {
          INFO("pattern " << i);
          if (std::isnan(w[i])) {
            CHECK(std::isnan(g[i]));
          } else {
            CHECK(g[i] == w[i]);
            CHECK(std::signbit(g[i]) == std::signbit(w[i]));
          }
        }
      }
    }
  }
}

TEST_CASE("FP8 scale on the GPU equals the host's, and a NaN amax reaches the step's end as inf") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  for (const Fp8Scaling scaling : {Fp8Scaling::current, Fp8Scaling::delayed}) {
    Fp8TensorScale host(Fp8Format::e5m2, {Fp8Mode::hybrid, scaling, 3, 2}, "dy");
    Fp8TensorScale dev(Fp8Format::e5m2, {Fp8Mode::hybrid, scaling, 3, 2}, "dy");
    for (const float a : {3.0f, 0.0f, 7e-3f, 1e-40f, 2.0e4f, 0.0f}) {
      INFO(fp8_scaling_name(scaling) << " amax " << a);
      const float want = host.scale(a);
      const Tensor amax = Tensor::from_vector<float>({a}, {1}).to(gpu, s);
      const std::vector<float> got = floats(dev.scale_on_device(amax, true, s), s);
      CHECK(got == std::vector<float>{1.0f / want, want});
      const float step = floats(dev.device_state(), s)[1];
      dev.end_device_step(step, s);
      host.end_step();
      CHECK(dev.history() == host.history());
      CHECK(dev.delayed_scale() == host.delayed_scale());
    }
  }
  Fp8TensorScale x(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::delayed, 2, 0}, "block1 x");
  x.scale_on_device(Tensor::from_vector<float>({kNan}, {1}).to(gpu, s), true, s);
  x.scale_on_device(Tensor::from_vector<float>({5.0f}, {1}).to(gpu, s), true, s);
  const float step = floats(x.device_state(), s)[1];
  CHECK(step == kInf);
  REQUIRE_THROWS_QUINTET(x.end_device_step(step, s), InvalidArgument, "FP8 scaling of block1 x");
}

TEST_CASE("FP8 GEMM on the GPU equals the CPU emulation within one ULP of the output") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  struct Case {
    std::int64_t n, m, k;
  };
  // Multiples of 16 (cuBLASLt's FP8 kernels) and not (the f32 fallback).
  const Case cases[] = {{64, 48, 128}, {256, 128, 512}, {16, 16, 16}, {33, 20, 40}, {5, 7, 3}};
  std::uint64_t seed = 900;
  for (const Case& c : cases) {
    // forward (E4M3 x E4M3, bf16 out + bias, fast accumulation), dgrad (E5M2 x E4M3, bf16 out),
    // wgrad (E5M2 x E4M3, f32 accumulated), and f32 out with a bias.
    struct Form {
      Fp8Format fa, fb;
      DType out;
      bool bias, accumulate, fast;
    };
    const Form forms[] = {{Fp8Format::e4m3, Fp8Format::e4m3, DType::bf16, true, false, true},
                          {Fp8Format::e5m2, Fp8Format::e4m3, DType::bf16, false, false, false},
                          {Fp8Format::e5m2, Fp8Format::e4m3, DType::f32, false, true, false},
                          {Fp8Format::e4m3, Fp8Format::e5m2, DType::f32, true, false, false}};
    for (const Form& fm : forms) {
      INFO("n " << c.n << " m " << c.m << " k " << c.k << " a " << fp8_format_name(fm.fa) << " b "
                << fp8_format_name(fm.fb) << " out " << dtype_name(fm.out)
                << (fm.accumulate ? " accumulate" : "") << (fm.fast ? " fast" : ""));
      const Tensor a_cpu = Tensor::randn({c.n, c.k}, ++seed);
      const Tensor b_cpu = Tensor::randn({c.m, c.k}, ++seed);
      const float sa = fp8_scale_from_amax(fp8_amax(a_cpu, cpu), fm.fa, 0, 1.0f, "a");
      const float sb = fp8_scale_from_amax(fp8_amax(b_cpu, cpu), fm.fb, 0, 1.0f, "b");
      const Fp8Tensor qa =
          fp8_cast(a_cpu, fp8_scale_tensor(sa, Device::cpu(), cpu), fm.fa, false, Tensor(), cpu);
      const Fp8Tensor qb =
          fp8_cast(b_cpu, fp8_scale_tensor(sb, Device::cpu(), cpu), fm.fb, false, Tensor(), cpu);
      // The bias in the output dtype; the CPU sees the same (rounded) values.
      const Tensor bias_cpu =
          fm.bias ? Tensor::randn({c.m}, ++seed).to(fm.out).to(DType::f32) : Tensor();
      const Tensor y0 = Tensor::randn({c.n, c.m}, ++seed);  // what accumulate adds to
      Tensor want = fm.accumulate ? y0.clone() : Tensor::empty({c.n, c.m});
      fp8_gemm(qa, qb, bias_cpu, want, fm.accumulate, false, cpu);

      const Fp8Tensor ga{qa.data.to(gpu, s), Tensor(), qa.scale.to(gpu, s), fm.fa};
      const Fp8Tensor gb{qb.data.to(gpu, s), Tensor(), qb.scale.to(gpu, s), fm.fb};
      Tensor y = fm.accumulate ? y0.to(gpu, s) : Tensor::empty({c.n, c.m}, fm.out, gpu, s);
      fp8_gemm(ga, gb, fm.bias ? bias_cpu.to(gpu, s).to(fm.out, s) : Tensor(), y, fm.accumulate,
               fm.fast, s);
      const std::vector<double> got = values(y, s);
      const std::vector<double> w = want.to_vector<double>();
      // The bound per element: one ULP of the output at the result, plus the summation's error
      // (k terms, `order` of their absolute sum each way): 2^-24 for the f32 fallback's
      // reordering, 2^-13 where cuBLASLt runs the product on Hopper's FP8 tensor cores (every
      // dimension a multiple of 16, no f32 output with a bias), whose accumulator keeps about 14
      // bits of the running sum with or without fast accumulation (cuBLASLt promotes partial sums
      // to f32 only every few MMAs without it; on an H100 the E5M2 x E4M3 products were off by up
      // to 2^-13 of the absolute sum).
      const std::vector<float> ad = fp8_dequantize(qa, DType::f32, cpu).to_vector<float>();
      const std::vector<float> bd = fp8_dequantize(qb, DType::f32, cpu).to_vector<float>();
      const int bits = fm.out == DType::bf16 ? 8 : 24;
      const bool tensor_cores =
          c.n % 16 == 0 && c.m % 16 == 0 && c.k % 16 == 0 && !(fm.out == DType::f32 && fm.bias);
      const double order = tensor_cores ? 0x1p-13 : 0x1p-24;
      std::int64_t bad = 0;
      double worst = 0.0;
      for (std::int64_t i = 0; i < c.n; ++i) {
        for (std::int64_t j = 0; j < c.m; ++j) {
          double abs_sum = 0.0;
          for (std::int64_t l = 0; l < c.k; ++l) {
            abs_sum += std::abs(static_cast<double>(ad[i * c.k + l]) * bd[j * c.k + l]);
          }
          const double want_ij = w[i * c.m + j];
          const double bound =
              ulp(want_ij, bits) + 2.0 * static_cast<double>(c.k) * order * abs_sum + 1e-30;
          const double err = std::abs(got[i * c.m + j] - want_ij);
          worst = std::max(worst, err / bound);
          bad += !(err <= bound);
        }
      }
      INFO("worst error " << worst << " of its bound");
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("FP8 bias gradient and bad input on the GPU") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const Tensor dy = Tensor::randn({300, 24}, 77);
  const Fp8Tensor q = fp8_cast(dy, fp8_scale_tensor(900.0f, Device::cpu(), cpu), Fp8Format::e5m2,
                               false, Tensor(), cpu);
  Tensor want = Tensor::zeros({24});
  fp8_column_sum(q, want, cpu);
  Tensor db = Tensor::zeros({24}, DType::f32, gpu);
  fp8_column_sum(Fp8Tensor{q.data.to(gpu, s), Tensor(), q.scale.to(gpu, s), q.format}, db, s);
  const std::vector<double> got = values(db, s), w = want.to_vector<double>();
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(std::abs(got[i] - w[i]) <= 1e-4);

  const Fp8Tensor gq{q.data.to(gpu, s), Tensor(), q.scale, q.format};  // the scale on the CPU
  REQUIRE_THROWS_QUINTET(
      fp8_gemm(gq, gq, Tensor(), Tensor::empty({300, 300}, DType::bf16, gpu), false, false, s),
      InvalidArgument, "is on cpu");
  const Fp8Tensor g4{q.data.to(gpu, s), Tensor(), q.scale.to(gpu, s), Fp8Format::e4m3};
  REQUIRE_THROWS_QUINTET(
      fp8_gemm(g4, g4, Tensor(), Tensor::empty({300, 300}, DType::bf16, gpu), true, false, s),
      InvalidArgument, "accumulation is into f32");
}
