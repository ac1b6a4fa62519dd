// The grouped linear ops on the CPU (quintet/nn/grouped_linear.hpp): bit for bit a loop of the
// linear ops per group (f32 and f64), against direct f64 products, with empty groups, one-row
// groups and padding rows past the last group; bad shapes and offsets rejected.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "quintet/nn/grouped_linear.hpp"
#include "quintet/nn/ops.hpp"
#include "support/catch.hpp"
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
}  // namespace

TEST_CASE("grouped linear ops equal a loop of linear ops per group", "[nn][grouped]") {
  const std::vector<Case> cases = {
      {"even groups", 12, 5, 7, {0, 4, 8, 12}},
      {"empty first, middle and last groups", 9, 6, 3, {0, 0, 4, 4, 9, 9}},
      {"one row in one group", 1, 4, 5, {0, 0, 1, 1}},
      {"every row in one group (skewed)", 10, 3, 4, {0, 10, 10, 10}},
      {"padding rows past the last group", 11, 5, 6, {0, 3, 3, 7}},
      {"no rows", 0, 4, 3, {0, 0, 0}},
  };
  for (const DType dtype : {DType::f64, DType::f32}) {
    for (const Case& k : cases) {
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
