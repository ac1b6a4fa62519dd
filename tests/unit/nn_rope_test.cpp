// CPU RoPE: forward against the textbook rotate-half formula evaluated here in double, backward
// against central finite differences (f64) and as the inverse rotation; positions from an offset,
// from [S] and [B, S] tensors (i32 and i64, out of order as zigzag context-parallel chunks are),
// odd sequence lengths, in place on the strided heads of a fused qkv projection; Llama 3's
// frequency scaling against its three bands computed by hand; bad input.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "quintet/nn/ops.hpp"
#include "support/catch.hpp"
#include "unit/nn_gradcheck.hpp"

using namespace quintet;
using namespace quintet::nn;
using nn_test::dot;
using nn_test::numeric_grad;
using nn_test::randn64;
using nn_test::require_close;

namespace {
const Stream kCpu;

// y[b, s, h, :] of x [B, S, H, D] rotated by pos(b, s) * theta^(-2i/D), pairs (i, i + D/2), in
// double straight from the definition.
Tensor reference(const Tensor& x, double theta, const std::vector<std::vector<double>>& pos,
                 const std::vector<double>& inv_freq = {}) {
  const std::int64_t B = x.size(0), S = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  Tensor y = Tensor::zeros(x.shape(), DType::f64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < half; ++i) {
          const double angle =
              inv_freq.empty() ? pos[b][s] / std::pow(theta, 2.0 * i / D) : pos[b][s] * inv_freq[i];
          const double lo = x.at<double>({b, s, h, i}), hi = x.at<double>({b, s, h, i + half});
          y.at<double>({b, s, h, i}) = lo * std::cos(angle) - hi * std::sin(angle);
          y.at<double>({b, s, h, i + half}) = hi * std::cos(angle) + lo * std::sin(angle);
        }
  return y;
}

std::vector<std::vector<double>> offset_positions(std::int64_t B, std::int64_t S, double offset) {
  std::vector<std::vector<double>> p(B, std::vector<double>(S));
  for (auto& row : p)
    for (std::int64_t s = 0; s < S; ++s) row[s] = offset + s;
  return p;
}
}  // namespace

TEST_CASE("rope forward equals the rotate-half formula, with offsets", "[nn][rope]") {
  const std::int64_t B = 2, S = 7, H = 3, D = 8;
  for (const double theta : {10000.0, 500000.0}) {
    for (const std::int64_t offset : {0, 13}) {
      INFO("theta " << theta << " offset " << offset);
      const Tensor x = randn64({B, S, H, D}, 1 + offset);
      RopeOptions o;
      o.theta = theta;
      o.position_offset = offset;
      const Tensor want = reference(x, theta, offset_positions(B, S, double(offset)));
      require_close(rope_forward(x, Tensor(), o, kCpu), want, 1e-13, "f64");
      // f32: angles in f32 as Hugging Face computes them; positions here are small.
      const Tensor y32 = rope_forward(x.to(DType::f32), Tensor(), o, kCpu);
      REQUIRE(y32.dtype() == DType::f32);
      require_close(y32, want, 2e-5, "f32");
    }
  }
  // One pair by hand: D = 2, pos 1, theta irrelevant (inv_freq_0 = 1): (1, 0) -> (cos 1, sin 1).
  const Tensor one = Tensor::from_vector<double>({1.0, 0.0, 1.0, 0.0}, {1, 2, 1, 2});  // pos 0, 1
  const Tensor y = rope_forward(one, Tensor(), {}, kCpu);
  REQUIRE(y.at<double>({0, 1, 0, 0}) == Approx(std::cos(1.0)).epsilon(1e-15));
  REQUIRE(y.at<double>({0, 1, 0, 1}) == Approx(std::sin(1.0)).epsilon(1e-15));
  REQUIRE(y.at<double>({0, 0, 0, 0}) == 1.0);  // position 0: unrotated
}

TEST_CASE("rope with Llama 3's frequency scaling", "[nn][rope]") {
  // D = 12, theta 500000: wavelengths 2 pi / f_i of 6.3, 56, 499, 4443, 39582 and 352632. With
  // an original length of 1024 and frequency factors 1 and 4, the first two (< 256) are kept,
  // the third (between 256 and 1024) interpolated, the last three (> 1024) divided by 8.
  const std::int64_t B = 1, S = 40, H = 2, D = 12;
  RopeOptions o;
  o.theta = 500000.0;
  o.scaling = {.factor = 8.0,
               .low_freq_factor = 1.0,
               .high_freq_factor = 4.0,
               .original_max_position_embeddings = 1024};
  std::vector<double> f(D / 2);
  for (std::int64_t i = 0; i < D / 2; ++i) f[i] = std::pow(o.theta, -2.0 * i / D);
  const double s = (1024.0 * f[2] / (2.0 * std::numbers::pi) - 1.0) / 3.0;
  REQUIRE((s > 0.0 && s < 1.0));
  const std::vector<double> want_freq = {f[0],       f[1],       (1.0 - s) * f[2] / 8.0 + s * f[2],
                                         f[3] / 8.0, f[4] / 8.0, f[5] / 8.0};
  const Tensor x = randn64({B, S, H, D}, 7);
  const Tensor want = reference(x, o.theta, offset_positions(B, S, 0.0), want_freq);
  require_close(rope_forward(x, Tensor(), o, kCpu), want, 1e-13, "f64");
  // Unscaled differs (the test can tell).
  const auto plain =
                 rope_forward(x, Tensor(), RopeOptions{.theta = o.theta}, kCpu).to_vector<double>(),
             scaled = want.to_vector<double>();
  double most = 0.0;
  for (std::size_t i = 0; i < plain.size(); ++i)
    most = std::max(most, std::abs(plain[i] - scaled[i]));
  REQUIRE(most > 0.1);
  RopeOptions bad = o;
  bad.scaling.high_freq_factor = 0.5;
  REQUIRE_THROWS_QUINTET(rope_forward(x, Tensor(), bad, kCpu), InvalidArgument,
                         "low_freq_factor < high_freq_factor");
}

TEST_CASE("rope takes each token's position from a tensor", "[nn][rope]") {
  const std::int64_t B = 2, S = 5, H = 2, D = 6;
  const Tensor x = randn64({B, S, H, D}, 7);
  RopeOptions o;
  o.position_offset = 3;
  // Zigzag chunks of a sequence of 20 as one context-parallel rank holds them, row 1 reversed.
  const std::vector<std::int64_t> p64 = {2, 3, 16, 17, 18, 18, 17, 16, 3, 2};
  const Tensor pos_bs = Tensor::from_vector<std::int64_t>(p64, {B, S});
  std::vector<std::vector<double>> want_pos(B, std::vector<double>(S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) want_pos[b][s] = 3.0 + double(p64[b * S + s]);
  require_close(rope_forward(x, pos_bs, o, kCpu), reference(x, o.theta, want_pos), 1e-13,
                "[B, S] i64");
  // [S] i32, shared by every row.
  const std::vector<std::int32_t> p32 = {9, 0, 4, 100, 1};
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) want_pos[b][s] = 3.0 + p32[s];
  const Tensor pos_s = Tensor::from_vector<std::int32_t>(p32, {S});
  require_close(rope_forward(x, pos_s, o, kCpu), reference(x, o.theta, want_pos), 1e-13, "[S] i32");
  // Positions 0..S-1 given explicitly equal the implicit ones bit for bit.
  const Tensor ar = Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 4}, {S});
  require_close(rope_forward(x.to(DType::f32), ar, o, kCpu),
                rope_forward(x.to(DType::f32), Tensor(), o, kCpu), 0.0, "explicit arange");
}

TEST_CASE("rope backward against finite differences; it is the inverse rotation", "[nn][rope]") {
  const std::int64_t B = 1, S = 3, H = 2, D = 4;
  Tensor x = randn64({B, S, H, D}, 21);
  const Tensor r = randn64({B, S, H, D}, 22);
  const Tensor pos = Tensor::from_vector<std::int64_t>({5, 1, 12}, {S});
  RopeOptions o;
  o.theta = 100.0;
  o.position_offset = 2;
  const Tensor dx = rope_backward(r, pos, o, kCpu);
  auto loss = [&] { return dot(rope_forward(x, pos, o, kCpu), r); };
  require_close(dx, numeric_grad(loss, x), 1e-7, "dx");
  require_close(rope_backward(rope_forward(x, pos, o, kCpu), pos, o, kCpu), x, 1e-14,
                "backward undoes forward");
  // In place: the same values.
  Tensor y = x.clone();
  rope_forward_(y, pos, o, kCpu);
  require_close(y, rope_forward(x, pos, o, kCpu), 0.0, "in place forward");
  rope_backward_(y, pos, o, kCpu);
  require_close(y, x, 1e-14, "in place backward");
}

TEST_CASE("rope rotates the heads of a fused qkv in place through their strides", "[nn][rope]") {
  const std::int64_t B = 2, S = 9, H = 3, D = 8;
  const Tensor qkv = randn64({B, S, 3, H, D}, 31);
  const Tensor before = qkv.clone();
  RopeOptions o;
  o.position_offset = 4;
  for (int g = 0; g < 2; ++g) {  // q and k: [B, H, S, D] views -> [B, S, H, D]
    const Tensor heads = fused_qkv_heads(qkv, g).transpose(1, 2);
    REQUIRE_FALSE(heads.is_contiguous());
    rope_forward_(heads, Tensor(), o, kCpu);
  }
  for (int g = 0; g < 3; ++g) {
    const Tensor orig = fused_qkv_heads(before, g).transpose(1, 2).contiguous();
    const Tensor now = fused_qkv_heads(qkv, g).transpose(1, 2).contiguous();
    if (g < 2) {
      require_close(now, rope_forward(orig, Tensor(), o, kCpu), 0.0, "rotated in place");
    } else {
      require_close(now, orig, 0.0, "v untouched");
    }
  }
  // Out of place from a strided view gives a contiguous result.
  const Tensor k = fused_qkv_heads(before, 1).transpose(1, 2);
  const Tensor y = rope_forward(k, Tensor(), o, kCpu);
  REQUIRE(y.is_contiguous());
  require_close(y, rope_forward(k.contiguous(), Tensor(), o, kCpu), 0.0, "strided input");
}

TEST_CASE("rope rejects bad input with a quintet::Error", "[nn][rope]") {
  const Tensor x = Tensor::randn({2, 5, 3, 8}, 1);
  REQUIRE_THROWS_QUINTET(rope_forward(Tensor::randn({2, 5, 3, 7}, 2), Tensor(), {}, kCpu),
                         InvalidArgument, "must be even");
  REQUIRE_THROWS_QUINTET(rope_forward(Tensor::randn({5, 3, 8}, 3), Tensor(), {}, kCpu),
                         InvalidArgument, "expected [batch, seq, heads, head_dim]");
  REQUIRE_THROWS_QUINTET(
      rope_forward(x, Tensor::from_vector<std::int64_t>({0, 1, 2, 3}, {4}), {}, kCpu),
      InvalidArgument, "expected [5] or [2, 5]");
  REQUIRE_THROWS_QUINTET(rope_backward(x, Tensor::zeros({3, 5}, DType::i64), {}, kCpu),
                         InvalidArgument, "positions have shape [3, 5]");
  REQUIRE_THROWS_QUINTET(rope_forward(x, Tensor::zeros({5}), {}, kCpu), InvalidArgument,
                         "expected i32 or i64");
  RopeOptions bad;
  bad.theta = 0.0;
  REQUIRE_THROWS_QUINTET(rope_forward_(x, Tensor(), bad, kCpu), InvalidArgument, "theta");
  REQUIRE_THROWS_QUINTET(rope_forward(x.to(DType::bf16), Tensor(), {}, kCpu), InvalidArgument,
                         "compute in f32");
}
