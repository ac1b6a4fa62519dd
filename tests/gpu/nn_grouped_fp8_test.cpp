// The grouped FP8 ops on the GPU (quintet/nn/grouped_linear.hpp): the grouped kernels (offsets read
// on the device; FP8 tensor cores where in, out and n are multiples of 16, else SIMT) and the
// per-group cuBLASLt loop, against per-group products computed in f64 on the host from the
// dequantised operands: forward (E4M3 x E4M3) into bf16 and f32, dgrad (E5M2 x E4M3, w's
// transpose) and wgrad (the transposes, accumulated into f32 dw); every shape class: empty
// groups, one row, partial tiles, group starts not multiples of 16 (wgrad's column ranges),
// skew, padding rows past the last group. Every case also runs with QUINTET_GROUPED_GEMM=wgmma
// (the Hopper FP8 kernel, lib/nn/cuda/grouped_gemm_sm90a.cu) on an sm_90 GPU; on any other, that
// choice must throw.
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

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"even groups, whole tiles", 128, 256, 384, {0, 128, 256, 384}},
      {"empty groups, partial tiles, group starts off 16", 64, 48, 176, {0, 0, 37, 37, 170, 170}},
      {"one row (wgrad: SIMT, n = 1)", 16, 32, 1, {0, 1}},
      {"K and N not multiples of 64, padding", 208, 144, 144, {0, 50, 131}},
      {"every row in one group (skewed)", 96, 272, 304, {0, 0, 304, 304}},
      {"widths not multiples of 16 (SIMT)", 40, 24, 43, {0, 5, 5, 40}},
      {"eight experts, many k-steps", 256, 512, 1008, {0, 90, 300, 310, 310, 620, 700, 999, 1000}},
      // 144 forward tiles: more than one CTA a GPU of 132 SMs holds with the wgmma kernel, so some
      // CTAs take a second tile.
      {"more tiles than resident CTAs", 256, 1536, 1200, {0, 300, 600, 900, 1200}},
  };
  return all;
}

// x (f32, on the GPU) cast whole at the scale of its amax, with its transpose.
nn::Fp8Tensor cast(const Tensor& x, nn::Fp8Format format, const Stream& s) {
  const float scale =
      nn::fp8_scale_from_amax(nn::fp8_amax(x, s), format, 0, 1.0f, "grouped FP8 test operand");
  return nn::fp8_cast(x, nn::fp8_scale_tensor(scale, s.device(), s), format, true, Tensor(), s);
}
// The values the GEMMs multiply: q dequantised, in f64 on the host.
std::vector<double> dequantised(const nn::Fp8Tensor& q, const Stream& s) {
  return values(nn::fp8_dequantize(q, DType::f32, s), s);
}
nn::Fp8Tensor transposes(const nn::Fp8Tensor& q) {
  return {Tensor(), q.transposed, q.scale, q.format};
}

// check_close's bars for bf16 outputs; for f32 ones, looser than f32's: Hopper's FP8 tensor cores
// add the products of one MMA with fewer than f32's 24 bits (about 14 kept), and the partial sums
// carry that into the f32 accumulator (one part in ~2^-13 per MMA step, growing like the square
// root of the k32 steps), where the SIMT kernel and the f64 reference agree to ~1e-6.
void check_fp8(const std::vector<double>& got, const std::vector<double>& want, DType out) {
  if (out == DType::bf16) {
    check_close(got, want, out);
    return;
  }
  const double norm = rel_err(got, want), worst = worst_err(got, want);
  INFO("relative error norm " << norm << " (bar 1e-3), worst element " << worst
                              << " of the largest magnitude (bar 4e-3)");
  CHECK(norm < 1e-3);
  CHECK(worst < 4e-3);
}

// QUINTET_GROUPED_GEMM set (or unset, for nullptr) for a scope.
class EnvChoice : public test_support::ScopedEnv {
 public:
  explicit EnvChoice(const char* value) : ScopedEnv("QUINTET_GROUPED_GEMM", value) {}
};

void run_case(const Case& k, DType out, bool host, const Stream& s, std::uint64_t& seed) {
  const std::int64_t groups = std::ssize(k.offsets) - 1, in = k.in, o = k.out;
  const std::int64_t end = k.offsets.back();
  // Padding rows are zero (as the token permutation's): they add nothing to the amaxes.
  Tensor xh = Tensor::randn({k.rows, in}, ++seed), dyh = Tensor::randn({k.rows, o}, ++seed);
  if (end < k.rows) {
    xh.narrow(0, end, k.rows - end).zero_();
    dyh.narrow(0, end, k.rows - end).zero_();
  }
  const nn::Fp8Tensor qx = cast(xh.to(s.device(), s), nn::Fp8Format::e4m3, s);
  const nn::Fp8Tensor qw =
      cast(Tensor::randn({groups, o, in}, ++seed).to(s.device(), s), nn::Fp8Format::e4m3, s);
  const nn::Fp8Tensor qdy = cast(dyh.to(s.device(), s), nn::Fp8Format::e5m2, s);
  const Tensor dw0 = Tensor::randn({groups, o, in}, ++seed);
  const Tensor dw = dw0.to(s.device(), s);
  const Tensor offsets = Tensor::from_vector(k.offsets, {groups + 1}).to(s.device(), s);
  const std::span<const std::int64_t> ho =
      host ? std::span<const std::int64_t>(k.offsets) : std::span<const std::int64_t>();
  const Tensor y = nn::grouped_fp8_linear_forward(qx, qw, offsets, ho, out, false, s);
  const Tensor dx = nn::grouped_fp8_linear_backward_input(qdy, transposes(qw), offsets, ho, out, s);
  nn::grouped_fp8_linear_backward_weight(transposes(qdy), transposes(qx), offsets, dw, ho, s);
  REQUIRE(y.shape() == Shape{k.rows, o});
  REQUIRE(dx.shape() == Shape{k.rows, in});
  REQUIRE(y.dtype() == out);

  const std::vector<double> xv = dequantised(qx, s), wv = dequantised(qw, s),
                            dyv = dequantised(qdy, s);
  std::vector<double> ry(k.rows * o, 0.0), rdx(k.rows * in, 0.0), rdw = dw0.to_vector<double>();
  for (std::int64_t g = 0; g < groups; ++g) {
    const double* wg = wv.data() + g * o * in;
    for (std::int64_t r = k.offsets[g]; r < k.offsets[g + 1]; ++r) {
      for (std::int64_t j = 0; j < o; ++j) {
        double sum = 0.0;
        for (std::int64_t i = 0; i < in; ++i) sum += xv[r * in + i] * wg[j * in + i];
        ry[r * o + j] = sum;
      }
      for (std::int64_t i = 0; i < in; ++i) {
        double sum = 0.0;
        for (std::int64_t j = 0; j < o; ++j) sum += dyv[r * o + j] * wg[j * in + i];
        rdx[r * in + i] = sum;
      }
      for (std::int64_t j = 0; j < o; ++j) {
        for (std::int64_t i = 0; i < in; ++i) {
          rdw[(g * o + j) * in + i] += dyv[r * o + j] * xv[r * in + i];
        }
      }
    }
  }
  const std::vector<double> yv = values(y, s), dxv = values(dx, s), dwv = values(dw, s);
  {
    INFO("forward");
    check_fp8(yv, ry, out);
  }
  {
    INFO("dgrad");
    check_fp8(dxv, rdx, out);
  }
  {
    INFO("wgrad");
    check_fp8(dwv, rdw, DType::f32);
  }
  // Exact: the padding rows are zero, an empty group's dw is untouched.
  for (std::int64_t i = end * o; i < k.rows * o; ++i) REQUIRE(yv[i] == 0.0);
  for (std::int64_t i = end * in; i < k.rows * in; ++i) REQUIRE(dxv[i] == 0.0);
  const std::vector<double> dw0v = dw0.to_vector<double>();
  for (std::int64_t g = 0; g < groups; ++g) {
    if (k.offsets[g + 1] != k.offsets[g]) continue;
    for (std::int64_t i = g * o * in; i < (g + 1) * o * in; ++i) REQUIRE(dwv[i] == dw0v[i]);
  }
}

}  // namespace

TEST_CASE("the grouped FP8 kernels equal per-group f64 products of the dequantised operands") {
  const Stream s = Stream::create(Device::cuda(0));
  const EnvChoice env(nullptr);
  std::uint64_t seed = 5700;
  for (const DType out : {DType::bf16, DType::f32}) {
    for (const Case& k : cases()) {
      INFO(k.name << ", out " << dtype_name(out) << ", no host offsets");
      run_case(k, out, false, s, seed);
    }
  }
}

TEST_CASE("with host offsets both FP8 paths equal the per-group products") {
  const Stream s = Stream::create(Device::cuda(0));
  std::uint64_t seed = 5800;
  for (const char* choice : {"loop", "kernel"}) {
    const EnvChoice env(choice);
    for (const Case& k : cases()) {
      INFO(k.name << ", QUINTET_GROUPED_GEMM=" << choice);
      run_case(k, DType::bf16, true, s, seed);
    }
  }
}

TEST_CASE("the FP8 wgmma kernel equals the per-group products, with and without host offsets") {
  const Stream s = Stream::create(Device::cuda(0));
  const EnvChoice env("wgmma");
  if (!hopper()) {
    // Refused before any work on a GPU that is not sm_90 (widths the tensor cores take).
    const nn::Fp8Tensor q =
        cast(Tensor::randn({16, 16}, 1).to(s.device(), s), nn::Fp8Format::e4m3, s);
    const nn::Fp8Tensor qw =
        cast(Tensor::randn({1, 16, 16}, 2).to(s.device(), s), nn::Fp8Format::e4m3, s);
    const std::vector<std::int64_t> o = {0, 16};
    const Tensor offsets = Tensor::from_vector(o, {2}).to(s.device(), s);
    REQUIRE_THROWS_QUINTET(
        nn::grouped_fp8_linear_forward(q, qw, offsets, {}, DType::bf16, false, s), InvalidArgument,
        "sm_90");
    return;
  }
  std::uint64_t seed = 5900;
  for (const bool host : {false, true}) {
    for (const DType out : {DType::bf16, DType::f32}) {
      for (const Case& k : cases()) {
        INFO(k.name << ", out " << dtype_name(out) << ", host offsets " << host);
        run_case(k, out, host, s, seed);
      }
    }
  }
}
