// The grouped linear ops on the GPU (quintet/nn/grouped_linear.hpp): the grouped kernel (offsets
// read on the device) and the per-group cuBLASLt loop against per-group products computed in f64
// on the host from the same rounded inputs, bf16 (tensor-core kernel, and the SIMT kernel for
// widths not multiples of 8) and f32 (SIMT), every shape class: empty groups, one row, rows not a
// multiple of the tile, K and N not multiples of 64, every row in one group, padding rows past the
// last group; forward, dgrad and wgrad; and the choice between the paths. Every case also runs
// with QUINTET_GROUPED_GEMM=wgmma (the Hopper kernel, lib/nn/cuda/grouped_gemm_sm90a.cu) on an
// sm_90 GPU; on any other, that choice must throw.
#include <cstdint>
#include <iterator>
#include <span>
#include <vector>

#include "gpu/hopper.hpp"
#include "gpu/nn_gpu_compare.hpp"
#include "quintet/nn/grouped_linear.hpp"
#include "support/scoped_env.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {

struct Case {
  const char* name;
  std::int64_t in, out, rows;
  std::vector<std::int64_t> offsets;  // G + 1
};

// The products in f64 from the CPU copies of the inputs (values as the GPU saw them).
struct Reference {
  std::vector<double> y, dx, dw;
};
Reference reference(const Case& k, const Tensor& x, const Tensor& w, const Tensor& dy,
                    const Tensor& dw0) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(),
                            dyv = dy.to_vector<double>();
  const std::int64_t in = k.in, out = k.out, groups = std::ssize(k.offsets) - 1;
  Reference r{std::vector<double>(k.rows * out, 0.0), std::vector<double>(k.rows * in, 0.0),
              dw0.to_vector<double>()};
  for (std::int64_t g = 0; g < groups; ++g) {
    const double* wg = wv.data() + g * out * in;
    for (std::int64_t row = k.offsets[g]; row < k.offsets[g + 1]; ++row) {
      for (std::int64_t j = 0; j < out; ++j) {
        double s = 0.0;
        for (std::int64_t i = 0; i < in; ++i) s += xv[row * in + i] * wg[j * in + i];
        r.y[row * out + j] = s;
      }
      for (std::int64_t i = 0; i < in; ++i) {
        double s = 0.0;
        for (std::int64_t j = 0; j < out; ++j) s += dyv[row * out + j] * wg[j * in + i];
        r.dx[row * in + i] = s;
      }
      for (std::int64_t j = 0; j < out; ++j) {
        for (std::int64_t i = 0; i < in; ++i) {
          r.dw[(g * out + j) * in + i] += dyv[row * out + j] * xv[row * in + i];
        }
      }
    }
  }
  return r;
}

// QUINTET_GROUPED_GEMM set (or unset, for nullptr) for a scope.
class EnvChoice : public test_support::ScopedEnv {
 public:
  explicit EnvChoice(const char* value) : ScopedEnv("QUINTET_GROUPED_GEMM", value) {}
};

// The offsets of "many ragged groups": sizes 0, 1, 7, 63, 64, 65, 127, 128, 129, 200, four times.
std::vector<std::int64_t> many_ragged_offsets() {
  std::vector<std::int64_t> o = {0};
  for (int lap = 0; lap < 4; ++lap) {
    for (const std::int64_t rows : {0, 1, 7, 63, 64, 65, 127, 128, 129, 200}) {
      o.push_back(o.back() + rows);
    }
  }
  return o;  // ends at 3136
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"even groups, whole tiles", 128, 256, 384, {0, 128, 256, 384}},
      {"empty groups, rows not a multiple of the tile", 72, 40, 170, {0, 0, 37, 37, 170, 170}},
      {"one row", 16, 24, 1, {0, 1}},
      {"K and N not multiples of 64", 200, 136, 131, {0, 50, 131}},
      {"every row in one group (skewed)", 96, 264, 300, {0, 0, 300, 300}},
      {"padding rows past the last group", 64, 64, 45, {0, 10, 20}},
      {"widths not multiples of 8 (SIMT in bf16)", 37, 29, 43, {0, 5, 5, 40}},
      {"eight experts, many k-steps", 256, 512, 1000, {0, 90, 300, 310, 310, 620, 700, 999, 1000}},
      // 144 forward tiles of 128 x 128 (the mma.sync kernel's; the bf16 wgmma kernel's 128 x 256:
      // 72, see the next case): more than one CTA a GPU of 132 SMs holds, so some CTAs take a
      // second tile.
      {"more tiles than resident CTAs", 256, 1536, 1200, {0, 300, 600, 900, 1200}},
      // Forty groups of ragged sizes (0, 1, around 64 and 128, 200) and 5 padding rows: with the
      // bf16 wgmma kernel's 128 x 256 tiles 180 forward tiles (776 = 3 * 256 + 8 columns), 252
      // wgrad ones whose k (the group's rows) changes from tile to tile, 13 k-steps in dgrad (776
      // deep), 2 in forward (72): every CTA takes several tiles, its pipeline running on across
      // them.
      {"many ragged groups", 72, 776, 3141, many_ragged_offsets()},
  };
  return all;
}

// A bf16 forward of one group of 4 rows, 8 -> 8, with host offsets (for the checks that throw).
Tensor small_forward(const Stream& s) {
  const Tensor x = Tensor::zeros({4, 8}, DType::bf16, Device::cuda(0));
  const Tensor w = Tensor::zeros({1, 8, 8}, DType::bf16, Device::cuda(0));
  const std::vector<std::int64_t> o = {0, 4};
  return nn::grouped_linear_forward(x, w, Tensor::from_vector(o, {2}).to(Device::cuda(0)), o, s);
}

void run_case(const Case& k, DType t, bool host, const Stream& s, std::uint64_t& seed) {
  const std::int64_t groups = std::ssize(k.offsets) - 1;
  const Input x = random_input({k.rows, k.in}, ++seed, t, s);
  const Input w = random_input({groups, k.out, k.in}, ++seed, t, s);
  const Input dy = random_input({k.rows, k.out}, ++seed, t, s);
  const Tensor dw0 = Tensor::randn({groups, k.out, k.in}, ++seed);
  const Tensor dw = dw0.to(s.device(), s);
  const Tensor offsets = Tensor::from_vector(k.offsets, {groups + 1}).to(s.device(), s);
  const std::span<const std::int64_t> ho =
      host ? std::span<const std::int64_t>(k.offsets) : std::span<const std::int64_t>();
  const Tensor y = nn::grouped_linear_forward(x.gpu, w.gpu, offsets, ho, s);
  const Tensor dx = nn::grouped_linear_backward_input(dy.gpu, w.gpu, offsets, ho, s);
  nn::grouped_linear_backward_weight(dy.gpu, x.gpu, offsets, dw, ho, s);
  REQUIRE(y.shape() == Shape{k.rows, k.out});
  REQUIRE(dx.shape() == Shape{k.rows, k.in});
  const Reference r = reference(k, x.cpu, w.cpu, dy.cpu, dw0);
  const std::vector<double> yv = values(y, s), dxv = values(dx, s), dwv = values(dw, s);
  {
    INFO("forward");
    check_close(yv, r.y, t);
  }
  {
    INFO("dgrad");
    check_close(dxv, r.dx, t);
  }
  {
    INFO("wgrad");
    check_close(dwv, r.dw, t);
  }
  // Exact: the padding rows are zero, an empty group's dw is untouched.
  const std::int64_t end = k.offsets.back();
  for (std::int64_t i = end * k.out; i < k.rows * k.out; ++i) REQUIRE(yv[i] == 0.0);
  for (std::int64_t i = end * k.in; i < k.rows * k.in; ++i) REQUIRE(dxv[i] == 0.0);
  const std::vector<double> dw0v = dw0.to_vector<double>();
  for (std::int64_t g = 0; g < groups; ++g) {
    if (k.offsets[g + 1] != k.offsets[g]) continue;
    for (std::int64_t i = g * k.out * k.in; i < (g + 1) * k.out * k.in; ++i) {
      REQUIRE(dwv[i] == dw0v[i]);
    }
  }
}

}  // namespace

TEST_CASE("the grouped kernel equals per-group f64 products") {
  const Stream s = Stream::create(Device::cuda(0));
  const EnvChoice env(nullptr);
  std::uint64_t seed = 4700;
  for (const DType t : {DType::bf16, DType::f32}) {
    for (const Case& k : cases()) {
      INFO(k.name << ", " << dtype_name(t) << ", no host offsets");
      run_case(k, t, false, s, seed);
    }
  }
}

TEST_CASE("with host offsets both paths equal the per-group products") {
  const Stream s = Stream::create(Device::cuda(0));
  std::uint64_t seed = 4800;
  for (const char* choice : {"loop", "kernel"}) {
    const EnvChoice env(choice);
    for (const DType t : {DType::bf16, DType::f32}) {
      for (const Case& k : cases()) {
        INFO(k.name << ", " << dtype_name(t) << ", QUINTET_GROUPED_GEMM=" << choice);
        run_case(k, t, true, s, seed);
      }
    }
  }
}

TEST_CASE("the wgmma kernel equals per-group f64 products, with and without host offsets") {
  const Stream s = Stream::create(Device::cuda(0));
  const EnvChoice env("wgmma");
  if (!hopper()) {
    // Refused before any work on a GPU that is not sm_90 (bf16 widths the tensor cores take).
    REQUIRE_THROWS_QUINTET(small_forward(s), InvalidArgument, "sm_90");
    return;
  }
  std::uint64_t seed = 4900;
  for (const bool host : {false, true}) {
    // f32 and the bf16 widths not multiples of 8 fall back to the other kernels.
    for (const DType t : {DType::bf16, DType::f32}) {
      for (const Case& k : cases()) {
        INFO(k.name << ", " << dtype_name(t) << ", host offsets " << host);
        run_case(k, t, host, s, seed);
      }
    }
  }
}

TEST_CASE("QUINTET_GROUPED_GEMM picks the path") {
  {
    const EnvChoice env(nullptr);
    CHECK(nn::grouped_gemm_path(true) == nn::GroupedGemmPath::per_group);
    CHECK(nn::grouped_gemm_path(false) == nn::GroupedGemmPath::grouped_kernel);
  }
  {
    const EnvChoice env("loop");
    CHECK(nn::grouped_gemm_path(true) == nn::GroupedGemmPath::per_group);
    CHECK(nn::grouped_gemm_path(false) == nn::GroupedGemmPath::grouped_kernel);
  }
  {
    const EnvChoice env("kernel");
    CHECK(nn::grouped_gemm_path(true) == nn::GroupedGemmPath::grouped_kernel);
  }
  {
    const EnvChoice env("wgmma");
    CHECK(nn::grouped_gemm_path(true) == nn::GroupedGemmPath::grouped_wgmma);
    CHECK(nn::grouped_gemm_path(false) == nn::GroupedGemmPath::grouped_wgmma);
  }
  {
    const EnvChoice env("cublas");
    REQUIRE_THROWS_QUINTET(nn::grouped_gemm_path(true), InvalidArgument, "QUINTET_GROUPED_GEMM");
    // Checked before any work: a call throws too.
    const Stream s = Stream::create(Device::cuda(0));
    REQUIRE_THROWS_QUINTET(small_forward(s), InvalidArgument, "QUINTET_GROUPED_GEMM");
  }
}

TEST_CASE("grouped linear ops on the GPU reject bad arguments") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Tensor x = Tensor::zeros({6, 8}, DType::bf16, gpu);
  const Tensor w = Tensor::zeros({2, 8, 8}, DType::bf16, gpu);
  const std::span<const std::int64_t> none;
  // Offsets on the CPU for GPU rows; the wrong count; host offsets that break the rules.
  REQUIRE_THROWS_QUINTET(
      nn::grouped_linear_forward(x, w, Tensor::from_vector<std::int64_t>({0, 2, 6}, {3}), none, s),
      InvalidArgument, "offsets is on cpu");
  REQUIRE_THROWS_QUINTET(
      nn::grouped_linear_forward(x, w, Tensor::zeros({2}, DType::i64, gpu), none, s),
      InvalidArgument, "expected [3] i64");
  const std::vector<std::int64_t> bad = {0, 7, 6};
  REQUIRE_THROWS_QUINTET(
      nn::grouped_linear_forward(x, w, Tensor::zeros({3}, DType::i64, gpu), bad, s),
      InvalidArgument, "host_offsets decrease");
}
