// The grouped linear ops on the CPU (quintet/nn/grouped_linear.hpp): bit for bit a loop of the
// linear ops per group (f32 and f64), against direct f64 products, with empty groups, one-row
// groups and padding rows past the last group; bad shapes and offsets rejected. The grouped FP8
// ops: bit for bit a loop of fp8_gemm over per-group casts, against f64 sums of the dequantised
// operands, the same shape classes; bad operands rejected.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "quintet/nn/grouped_linear.hpp"
#include "quintet/nn/ops.hpp"
#include "support/catch.hpp"
#include "support/scoped_env.hpp"
#include "unit/nn_gradcheck.hpp"

using namespace quintet;
using namespace quintet::nn;
using nn_test::randn64;

namespace {
const Stream kCpu;

Tensor offsets_tensor(const std::vector<std::int64_t>& o) {
  return Tensor::from_vector(o, {static_cast<std::int64_t>(o.size())});
}

// Every element equal, bit for bit.
void require_equal(const Tensor& a, const Tensor& b, const char* what) {
  INFO(what);
  REQUIRE(a.shape() == b.shape());
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  for (std::size_t i = 0; i < av.size(); ++i) {
    INFO("element " << i);
    REQUIRE(av[i] == bv[i]);
  }
}

struct Case {
  const char* name;
  std::int64_t rows, in, out;
  std::vector<std::int64_t> offsets;  // G + 1
};

// The shape classes: empty groups, one row, skew, padding past the last group, no rows.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"even groups", 12, 5, 7, {0, 4, 8, 12}},
      {"empty first, middle and last groups", 9, 6, 3, {0, 0, 4, 4, 9, 9}},
      {"one row in one group", 1, 4, 5, {0, 0, 1, 1}},
      {"every row in one group (skewed)", 10, 3, 4, {0, 10, 10, 10}},
      {"padding rows past the last group", 11, 5, 6, {0, 3, 3, 7}},
      {"no rows", 0, 4, 3, {0, 0, 0}},
  };
  return all;
}
}  // namespace

TEST_CASE("grouped linear ops equal a loop of linear ops per group", "[nn][grouped]") {
  for (const DType dtype : {DType::f64, DType::f32}) {
    for (const Case& k : cases()) {
      DYNAMIC_SECTION(k.name << " " << dtype_name(dtype)) {
        const auto groups = static_cast<std::int64_t>(k.offsets.size()) - 1;
        const std::int64_t end = k.offsets.back();
        const Tensor x = randn64({k.rows, k.in}, 1).to(dtype);
        const Tensor w = randn64({groups, k.out, k.in}, 2).to(dtype);
        const Tensor dy = randn64({k.rows, k.out}, 3).to(dtype);
        const Tensor dw0 = randn64({groups, k.out, k.in}, 4).to(dtype);  // accumulated onto
        const Tensor o = offsets_tensor(k.offsets);
        // Without and with the host copy of the offsets: the same results.
        for (const bool host : {false, true}) {
          const std::span<const std::int64_t> ho =
              host ? std::span<const std::int64_t>(k.offsets) : std::span<const std::int64_t>();
          const Tensor y = grouped_linear_forward(x, w, o, ho, kCpu);
          const Tensor dx = grouped_linear_backward_input(dy, w, o, ho, kCpu);
          const Tensor dw = dw0.clone();
          grouped_linear_backward_weight(dy, x, o, dw, ho, kCpu);
          REQUIRE(y.shape() == Shape{k.rows, k.out});
          REQUIRE(dx.shape() == Shape{k.rows, k.in});
          // The loop the grouped ops replace (an empty group is skipped: its dw unchanged).
          const Tensor y_ref = Tensor::zeros({k.rows, k.out}, dtype);
          const Tensor dx_ref = Tensor::zeros({k.rows, k.in}, dtype);
          const Tensor dw_ref = dw0.clone();
          for (std::int64_t g = 0; g < groups; ++g) {
            const std::int64_t r = k.offsets[g], m = k.offsets[g + 1] - r;
            if (m == 0) continue;
            y_ref.narrow(0, r, m).copy_(
                linear_forward(x.narrow(0, r, m), w.select(g), Tensor(), kCpu));
            dx_ref.narrow(0, r, m).copy_(
                linear_backward_input(dy.narrow(0, r, m), w.select(g), kCpu));
            linear_backward_weight(dy.narrow(0, r, m), x.narrow(0, r, m), dw_ref.select(g),
                                   Tensor(), kCpu);
          }
          require_equal(y, y_ref, "y");
          require_equal(dx, dx_ref, "dx");
          require_equal(dw, dw_ref, "dw");
          // And against direct f64 sums; the padding rows are zero.
          const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
          for (std::int64_t g = 0; g < groups; ++g) {
            for (std::int64_t r = k.offsets[g]; r < k.offsets[g + 1]; ++r) {
              for (std::int64_t j = 0; j < k.out; ++j) {
                double s = 0;
                for (std::int64_t i = 0; i < k.in; ++i) s += x.item({r, i}) * w.item({g, j, i});
                REQUIRE(std::abs(y.item({r, j}) - s) <= tol * (1 + std::abs(s)));
              }
              for (std::int64_t i = 0; i < k.in; ++i) {
                double s = 0;
                for (std::int64_t j = 0; j < k.out; ++j) s += dy.item({r, j}) * w.item({g, j, i});
                REQUIRE(std::abs(dx.item({r, i}) - s) <= tol * (1 + std::abs(s)));
              }
            }
            for (std::int64_t j = 0; j < k.out; ++j) {
              for (std::int64_t i = 0; i < k.in; ++i) {
                double s = dw0.item({g, j, i});
                for (std::int64_t r = k.offsets[g]; r < k.offsets[g + 1]; ++r) {
                  s += dy.item({r, j}) * x.item({r, i});
                }
                REQUIRE(std::abs(dw.item({g, j, i}) - s) <= tol * (1 + std::abs(s)));
              }
            }
          }
          for (std::int64_t r = end; r < k.rows; ++r) {
            for (std::int64_t j = 0; j < k.out; ++j) REQUIRE(y.item({r, j}) == 0.0);
            for (std::int64_t i = 0; i < k.in; ++i) REQUIRE(dx.item({r, i}) == 0.0);
          }
        }
      }
    }
  }
}

TEST_CASE("group_offsets are the running sums of the counts", "[nn][grouped]") {
  const std::vector<std::int64_t> counts = {3, 0, 2, 0};
  REQUIRE(group_offsets(counts) == std::vector<std::int64_t>{0, 3, 3, 5, 5});
  REQUIRE(group_offsets(std::vector<std::int64_t>{}) == std::vector<std::int64_t>{0});
  REQUIRE_THROWS_QUINTET(group_offsets(std::vector<std::int64_t>{2, -1}), InvalidArgument,
                         "negative");
}

TEST_CASE("QUINTET_GROUPED_GEMM picks the GPU path; the loop is the default, FP8 too",
          "[nn][grouped]") {
  using test_support::ScopedEnv;
  {
    const ScopedEnv unset("QUINTET_GROUPED_GEMM", nullptr);
    REQUIRE(grouped_gemm_path(true) == GroupedGemmPath::per_group);
    REQUIRE(grouped_gemm_path(false) == GroupedGemmPath::grouped_kernel);
    REQUIRE(grouped_gemm_wants_host_offsets());
  }
  {
    const ScopedEnv loop("QUINTET_GROUPED_GEMM", "loop");
    REQUIRE(grouped_gemm_path(true) == GroupedGemmPath::per_group);
    REQUIRE(grouped_gemm_wants_host_offsets());
  }
  {
    const ScopedEnv kernel("QUINTET_GROUPED_GEMM", "kernel");
    REQUIRE(grouped_gemm_path(true) == GroupedGemmPath::grouped_kernel);
    REQUIRE_FALSE(grouped_gemm_wants_host_offsets());
  }
  {
    const ScopedEnv wgmma("QUINTET_GROUPED_GEMM", "wgmma");
    REQUIRE(grouped_gemm_path(true) == GroupedGemmPath::grouped_wgmma);
    REQUIRE_FALSE(grouped_gemm_wants_host_offsets());
  }
  const ScopedEnv bad("QUINTET_GROUPED_GEMM", "fast");
  REQUIRE_THROWS_QUINTET(grouped_gemm_path(true), InvalidArgument, "QUINTET_GROUPED_GEMM=fast");
  REQUIRE_THROWS_QUINTET(grouped_gemm_wants_host_offsets(), InvalidArgument,
                         "QUINTET_GROUPED_GEMM=fast");
}

TEST_CASE("grouped linear ops reject bad shapes and offsets", "[nn][grouped]") {
  const Tensor x = randn64({6, 4}, 1), w = randn64({2, 3, 4}, 2), dy = randn64({6, 3}, 3);
  const Tensor dw = Tensor::zeros({2, 3, 4}, DType::f64);
  const Tensor good = offsets_tensor({0, 2, 6});
  const std::span<const std::int64_t> none;
  // Shapes and dtypes.
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(x, randn64({3, 4}, 4), good, none, kCpu),
                         InvalidArgument, "[groups, out, in]");
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(randn64({6, 5}, 5), w, good, none, kCpu),
                         InvalidArgument, "expected [rows, 4]");
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(x.to(DType::f32), w, good, none, kCpu),
                         InvalidArgument, "cast it");
  REQUIRE_THROWS_QUINTET(grouped_linear_backward_input(randn64({6, 4}, 6), w, good, none, kCpu),
                         InvalidArgument, "expected [rows, 3]");
  REQUIRE_THROWS_QUINTET(
      grouped_linear_backward_weight(dy, x, good, Tensor::zeros({2, 3, 4}, DType::f32), none, kCpu),
      InvalidArgument, "expected f64");
  REQUIRE_THROWS_QUINTET(
      grouped_linear_backward_weight(dy, randn64({5, 4}, 7), good, dw, none, kCpu), InvalidArgument,
      "same rows");
  // The offsets' shape and dtype, then their values.
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(x, w, offsets_tensor({0, 6}), none, kCpu),
                         InvalidArgument, "expected [3] i64");
  REQUIRE_THROWS_QUINTET(
      grouped_linear_forward(x, w, Tensor::from_vector<std::int32_t>({0, 2, 6}, {3}), none, kCpu),
      InvalidArgument, "expected [3] i64");
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(x, w, offsets_tensor({1, 2, 6}), none, kCpu),
                         InvalidArgument, "offsets[0] = 1");
  REQUIRE_THROWS_QUINTET(
      grouped_linear_backward_input(dy, w, offsets_tensor({0, 4, 2}), none, kCpu), InvalidArgument,
      "decrease at group 1");
  REQUIRE_THROWS_QUINTET(
      grouped_linear_backward_weight(dy, x, offsets_tensor({0, 2, 7}), dw, none, kCpu),
      InvalidArgument, "only 6 rows");
  // Host offsets: G + 1 of them, valid, equal to the tensor's.
  const std::vector<std::int64_t> short_host = {0, 6}, other = {0, 3, 6}, bad = {0, 7, 6};
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(x, w, good, short_host, kCpu), InvalidArgument,
                         "2 host_offsets for 2 groups");
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(x, w, good, bad, kCpu), InvalidArgument,
                         "host_offsets decrease");
  REQUIRE_THROWS_QUINTET(grouped_linear_forward(x, w, good, other, kCpu), InvalidArgument,
                         "differ from offsets");
  // Nothing was accumulated by the rejected calls.
  for (const double v : dw.to_vector<double>()) REQUIRE(v == 0.0);
}

// ---- FP8 ---------------------------------------------------------------------------------------

namespace {
// A whole-tensor cast of x (f32) at the scale of its amax, with its transpose.
Fp8Tensor cast_whole(const Tensor& x, Fp8Format format) {
  const float amax = fp8_amax(x, kCpu);
  const float scale = fp8_scale_from_amax(amax, format, 0, 1.0f, "x");
  return fp8_cast(x, fp8_scale_tensor(scale, Device::cpu(), kCpu), format, true, Tensor(), kCpu);
}
// The operand form fp8_gemm takes of q's transpose.
Fp8Tensor transpose_of(const Fp8Tensor& q) { return {q.transposed, Tensor(), q.scale, q.format}; }
// x's block, cast on its own at q's scale (what a per-group loop casts), with its transpose.
Fp8Tensor cast_part(const Tensor& x, const Fp8Tensor& q) {
  return fp8_cast(x.contiguous(), q.scale, q.format, true, Tensor(), kCpu);
}
}  // namespace

TEST_CASE("grouped FP8 ops equal a loop of fp8_gemm over per-group casts", "[nn][grouped][fp8]") {
  for (const Case& k : cases()) {
    DYNAMIC_SECTION(k.name) {
      const auto groups = static_cast<std::int64_t>(k.offsets.size()) - 1;
      const std::int64_t end = k.offsets.back();
      Tensor x = randn64({k.rows, k.in}, 1).to(DType::f32);
      Tensor dy = randn64({k.rows, k.out}, 3).to(DType::f32);
      if (end < k.rows) {  // padding rows are zero, as the token permutation's
        x.narrow(0, end, k.rows - end).zero_();
        dy.narrow(0, end, k.rows - end).zero_();
      }
      const Tensor w = randn64({groups, k.out, k.in}, 2).to(DType::f32);
      const Tensor dw0 = randn64({groups, k.out, k.in}, 4).to(DType::f32);
      const Tensor o = offsets_tensor(k.offsets);
      const Fp8Tensor qx = cast_whole(x, Fp8Format::e4m3), qw = cast_whole(w, Fp8Format::e4m3);
      const Fp8Tensor qdy = cast_whole(dy, Fp8Format::e5m2);
      for (const bool host : {false, true}) {
        const std::span<const std::int64_t> ho =
            host ? std::span<const std::int64_t>(k.offsets) : std::span<const std::int64_t>();
        const Tensor y = grouped_fp8_linear_forward(qx, qw, o, ho, DType::f32, false, kCpu);
        const Tensor dx = grouped_fp8_linear_backward_input(
            qdy, {Tensor(), qw.transposed, qw.scale, qw.format}, o, ho, DType::f32, kCpu);
        const Tensor dw = dw0.clone();
        grouped_fp8_linear_backward_weight({Tensor(), qdy.transposed, qdy.scale, qdy.format},
                                           {Tensor(), qx.transposed, qx.scale, qx.format}, o, dw,
                                           ho, kCpu);
        REQUIRE(y.shape() == Shape{k.rows, k.out});
        REQUIRE(dx.shape() == Shape{k.rows, k.in});
        // The per-group loop the FP8 experts ran: each group's rows and weights cast on their
        // own (at the whole tensor's scale), one fp8_gemm chain per group.
        const Tensor y_ref = Tensor::zeros({k.rows, k.out}, DType::f32);
        const Tensor dx_ref = Tensor::zeros({k.rows, k.in}, DType::f32);
        const Tensor dw_ref = dw0.clone();
        for (std::int64_t g = 0; g < groups; ++g) {
          const std::int64_t r = k.offsets[g], m = k.offsets[g + 1] - r;
          if (m == 0) continue;
          const Fp8Tensor xg = cast_part(x.narrow(0, r, m), qx);
          const Fp8Tensor wg = cast_part(w.select(g), qw);
          const Fp8Tensor dyg = cast_part(dy.narrow(0, r, m), qdy);
          fp8_gemm(xg, wg, Tensor(), y_ref.narrow(0, r, m), false, false, kCpu);
          fp8_gemm(dyg, transpose_of(wg), Tensor(), dx_ref.narrow(0, r, m), false, false, kCpu);
          fp8_gemm(transpose_of(dyg), transpose_of(xg), Tensor(), dw_ref.select(g), true, false,
                   kCpu);
        }
        require_equal(y, y_ref, "y");
        require_equal(dx, dx_ref, "dx");
        require_equal(dw, dw_ref, "dw");
        // And against f64 sums of the dequantised operands.
        const Tensor xd = fp8_dequantize(qx, DType::f32, kCpu);
        const Tensor wd = fp8_dequantize(qw, DType::f32, kCpu);
        const Tensor dyd = fp8_dequantize(qdy, DType::f32, kCpu);
        for (std::int64_t g = 0; g < groups; ++g) {
          for (std::int64_t r = k.offsets[g]; r < k.offsets[g + 1]; ++r) {
            for (std::int64_t j = 0; j < k.out; ++j) {
              double s = 0;
              for (std::int64_t i = 0; i < k.in; ++i) s += xd.item({r, i}) * wd.item({g, j, i});
              REQUIRE(std::abs(y.item({r, j}) - s) <= 1e-5 * (1 + std::abs(s)));
            }
            for (std::int64_t i = 0; i < k.in; ++i) {
              double s = 0;
              for (std::int64_t j = 0; j < k.out; ++j) s += dyd.item({r, j}) * wd.item({g, j, i});
              REQUIRE(std::abs(dx.item({r, i}) - s) <= 1e-5 * (1 + std::abs(s)));
            }
          }
          for (std::int64_t j = 0; j < k.out; ++j) {
            for (std::int64_t i = 0; i < k.in; ++i) {
              double s = dw0.item({g, j, i});
              for (std::int64_t r = k.offsets[g]; r < k.offsets[g + 1]; ++r) {
                s += dyd.item({r, j}) * xd.item({r, i});
              }
              REQUIRE(std::abs(dw.item({g, j, i}) - s) <= 1e-5 * (1 + std::abs(s)));
            }
          }
        }
        for (std::int64_t r = end; r < k.rows; ++r) {
          for (std::int64_t j = 0; j < k.out; ++j) REQUIRE(y.item({r, j}) == 0.0);
          for (std::int64_t i = 0; i < k.in; ++i) REQUIRE(dx.item({r, i}) == 0.0);
        }
      }
    }
  }
}

TEST_CASE("grouped FP8 ops reject bad operands", "[nn][grouped][fp8]") {
  const Fp8Tensor qx = cast_whole(randn64({6, 4}, 1).to(DType::f32), Fp8Format::e4m3);
  const Fp8Tensor qw = cast_whole(randn64({2, 3, 4}, 2).to(DType::f32), Fp8Format::e4m3);
  const Fp8Tensor qdy = cast_whole(randn64({6, 3}, 3).to(DType::f32), Fp8Format::e5m2);
  const Tensor good = offsets_tensor({0, 2, 6});
  const Tensor dw = Tensor::zeros({2, 3, 4}, DType::f32);
  const std::span<const std::int64_t> none;
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_forward(qx, qw, good, none, DType::bf16, false, kCpu),
                         InvalidArgument, "expected f32 on the CPU");
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_forward(qx, {qx.data, Tensor(), qw.scale, qw.format},
                                                    good, none, DType::f32, false, kCpu),
                         InvalidArgument, "of 3 dimensions");
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_forward(qdy, qw, good, none, DType::f32, false, kCpu),
                         InvalidArgument, "expected [n, in] and [G, out, in]");
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_forward({qx.data, Tensor(), qx.scale, Fp8Format::e5m2},
                                                    {qw.data, Tensor(), qw.scale, Fp8Format::e5m2},
                                                    good, none, DType::f32, false, kCpu),
                         InvalidArgument, "both operands are E5M2");
  REQUIRE_THROWS_QUINTET(
      grouped_fp8_linear_forward({qx.data, Tensor(), Tensor::zeros({3}), qx.format}, qw, good, none,
                                 DType::f32, false, kCpu),
      InvalidArgument, "scale tensor");
  // dgrad reads w's transpose, wgrad both transposes: undefined ones are refused.
  REQUIRE_THROWS_QUINTET(
      grouped_fp8_linear_backward_input(qdy, {qw.data, Tensor(), qw.scale, qw.format}, good, none,
                                        DType::f32, kCpu),
      InvalidArgument, "w.transposed is undefined");
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_backward_input(qx, qw, good, none, DType::f32, kCpu),
                         InvalidArgument, "expected [n, out], [in, G out]");
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_backward_weight(
                             {qdy.data, Tensor(), qdy.scale, qdy.format}, qx, good, dw, none, kCpu),
                         InvalidArgument, "dy.transposed is undefined");
  const Fp8Tensor q5 = cast_whole(randn64({5, 4}, 5).to(DType::f32), Fp8Format::e4m3);
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_backward_weight(qdy, q5, good, dw, none, kCpu),
                         InvalidArgument, "of the same rows");
  REQUIRE_THROWS_QUINTET(grouped_fp8_linear_backward_weight(
                             qdy, qx, good, Tensor::zeros({2, 3, 5}, DType::f32), none, kCpu),
                         InvalidArgument, "dw");
  REQUIRE_THROWS_QUINTET(
      grouped_fp8_linear_backward_weight(qdy, qx, offsets_tensor({0, 4, 2}), dw, none, kCpu),
      InvalidArgument, "decrease at group 1");
  for (const double v : dw.to_vector<double>()) REQUIRE(v == 0.0);
}
