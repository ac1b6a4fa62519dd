// FP8 casts and scaling (quintet/nn/fp8.hpp): E4M3 and E5M2 encodings against a table derived by
// hand from the OCP FP8 formats (subnormals, ties to even, the largest value, saturation of
// larger values and infinities, NaN, -0), every pattern decoding and re-encoding to itself, the
// tensor casts with a scale, amax and the scale on edge inputs (zeros, tiny, inf, NaN), delayed
// scaling's history, and bad input.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "quintet/nn/fp8.hpp"
#include "quintet/nn/ops.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::nn;

namespace {
const Stream kCpu;
const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

struct Row {
  float value;
  std::uint8_t bits;
};
}  // namespace

TEST_CASE("E4M3 encoding: rounding to nearest even, subnormals, saturation, NaN", "[fp8]") {
  const Row table[] = {
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {1.0f, 0x38},                     // 0.0111.000
      {-2.5f, 0xc2},                    // 1.1000.010
      {0.1f, 0x1d},                     // 1.6 * 2^-4 -> mantissa 4.8 -> 5
      {1.0625f, 0x38},                  // tie between 1 (m0) and 1.125 (m1): even
      {1.1875f, 0x3a},                  // tie between 1.125 (m1) and 1.25 (m2): even
      {17.0f, 0x58},                    // tie between 16 and 18
      {19.0f, 0x5a},                    // tie between 18 and 20
      {240.0f, 0x77},                   // 1.875 * 2^7
      {416.0f, 0x7d},                   // 1.625 * 2^8
      {432.0f, 0x7e},                   // tie between 416 (m5) and 448 (m6)
      {448.0f, 0x7e},                   // the largest finite
      {-448.0f, 0xfe},                  //
      {449.0f, 0x7e},                   // beyond the largest: saturated
      {464.0f, 0x7e},                   // (the tie with 480, which does not exist)
      {1.0e6f, 0x7e},                   //
      {-1.0e30f, 0xfe},                 //
      {kInf, 0x7e},                     // infinity saturates too
      {-kInf, 0xfe},                    //
      {kNan, 0x7f},                     // canonical NaN S.1111.111
      {-kNan, 0x7f},                    //
      {std::ldexp(1.0f, -6), 0x08},     // smallest normal
      {std::ldexp(1.0f, -9), 0x01},     // smallest subnormal
      {std::ldexp(1.0f, -10), 0x00},    // half of it: tie to even 0
      {std::ldexp(1.001f, -10), 0x01},  // above the tie
      {std::ldexp(3.0f, -10), 0x02},    // 1.5 units: tie to even 2
      {std::ldexp(7.0f, -9), 0x07},     // largest subnormal
      {std::ldexp(7.5f, -9), 0x08},     // tie between 7 and 8 units: the smallest normal
      {-std::ldexp(5.0f, -9), 0x85},    //
      {std::ldexp(1.0f, -30), 0x00},    // underflow to 0
      {-std::ldexp(1.0f, -30), 0x80},   // to -0
      {std::numeric_limits<float>::denorm_min(), 0x00},
  };
  for (const Row& r : table) {
    INFO("value " << r.value);
    CHECK(static_cast<int>(fp8_encode(r.value, Fp8Format::e4m3)) == static_cast<int>(r.bits));
  }
}

TEST_CASE("E5M2 encoding: rounding to nearest even, subnormals, saturation, NaN", "[fp8]") {
  const Row table[] = {
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {1.0f, 0x3c},                    // 0.01111.00
      {0.1f, 0x2e},                    // 1.6 * 2^-4 -> mantissa 2.4 -> 2
      {1.125f, 0x3c},                  // tie between 1 and 1.25: even
      {1.375f, 0x3e},                  // tie between 1.25 and 1.5: even
      {49152.0f, 0x7a},                // 1.5 * 2^15
      {57344.0f, 0x7b},                // the largest finite
      {61440.0f, 0x7b},                // the tie with 65536 (infinity's place): saturated
      {1.0e9f, 0x7b},                  //
      {-1.0e9f, 0xfb},                 //
      {kInf, 0x7b},                    // saturating casts give no infinity
      {-kInf, 0xfb},                   //
      {kNan, 0x7f},                    //
      {std::ldexp(1.0f, -14), 0x04},   // smallest normal
      {std::ldexp(1.0f, -16), 0x01},   // smallest subnormal
      {std::ldexp(1.0f, -17), 0x00},   // tie to even 0
      {std::ldexp(3.0f, -17), 0x02},   // 1.5 units: tie to even 2
      {std::ldexp(3.5f, -16), 0x04},   // tie between 3 and 4 units: the smallest normal
      {-std::ldexp(3.0f, -16), 0x83},  //
  };
  for (const Row& r : table) {
    INFO("value " << r.value);
    CHECK(static_cast<int>(fp8_encode(r.value, Fp8Format::e5m2)) == static_cast<int>(r.bits));
  }
}

TEST_CASE("FP8 decoding: special patterns and every pattern re-encoding to itself", "[fp8]") {
  CHECK(fp8_max(Fp8Format::e4m3) == 448.0f);
  CHECK(fp8_max(Fp8Format::e5m2) == 57344.0f);
  CHECK(fp8_decode(0x7e, Fp8Format::e4m3) == 448.0f);
  CHECK(fp8_decode(0xfe, Fp8Format::e4m3) == -448.0f);
  CHECK(std::isnan(fp8_decode(0x7f, Fp8Format::e4m3)));
  CHECK(std::isnan(fp8_decode(0xff, Fp8Format::e4m3)));
  CHECK(fp8_decode(0x01, Fp8Format::e4m3) == std::ldexp(1.0f, -9));
  CHECK(fp8_decode(0x08, Fp8Format::e4m3) == std::ldexp(1.0f, -6));
  CHECK(fp8_decode(0x77, Fp8Format::e4m3) == 240.0f);  // S.1110.111: a number in E4M3
  CHECK(std::signbit(fp8_decode(0x80, Fp8Format::e4m3)));
  CHECK(fp8_decode(0x7b, Fp8Format::e5m2) == 57344.0f);
  CHECK(fp8_decode(0x7c, Fp8Format::e5m2) == kInf);
  CHECK(fp8_decode(0xfc, Fp8Format::e5m2) == -kInf);
  for (const int b : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff})
    CHECK(std::isnan(fp8_decode(static_cast<std::uint8_t>(b), Fp8Format::e5m2)));
  CHECK(fp8_decode(0x01, Fp8Format::e5m2) == std::ldexp(1.0f, -16));
  CHECK(fp8_decode(0x04, Fp8Format::e5m2) == std::ldexp(1.0f, -14));

  for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    int finite = 0;
    float previous = -1.0f;
    for (int b = 0; b < 0x80; ++b) {
      const float v = fp8_decode(static_cast<std::uint8_t>(b), f);
      if (!std::isfinite(v)) continue;
      ++finite;
      INFO(fp8_format_name(f) << " pattern " << b);
      CHECK(v > previous);  // the positive patterns are ordered
      previous = v;
      CHECK(fp8_encode(v, f) == b);
      CHECK(fp8_encode(-v, f) == (b | 0x80));
    }
    CHECK(finite == (f == Fp8Format::e4m3 ? 127 : 124));
  }
}

TEST_CASE("FP8 tensor casts with a scale, f32 and bf16", "[fp8]") {
  const Tensor x = Tensor::from_vector<float>({1.0f, 2.0f, -0.5f, 0.0f, 3.0f}, {5});
  const Tensor q = fp8_quantize(x, 224.0f, Fp8Format::e4m3, kCpu);
  REQUIRE(q.dtype() == DType::u8);
  REQUIRE(q.shape() == x.shape());
  // 224 = 1.75 * 2^7 (0x76), 448 (0x7e), -112 (1.1101.110), 0, 672 saturated to 448.
  const std::vector<std::uint8_t> want = {0x76, 0x7e, 0xee, 0x00, 0x7e};
  for (std::int64_t i = 0; i < 5; ++i) CHECK(q.data<std::uint8_t>()[i] == want[i]);
  const Tensor back = fp8_dequantize(q, 224.0f, Fp8Format::e4m3, DType::f32, kCpu);
  const float inv = 1.0f / 224.0f;
  CHECK(back.data<float>()[0] == 224.0f * inv);
  CHECK(back.data<float>()[2] == -112.0f * inv);
  CHECK(back.data<float>()[4] == 448.0f * inv);  // 3 saturated to 2

  const Tensor xb = x.to(DType::bf16);
  const Tensor qb = fp8_quantize(xb, 224.0f, Fp8Format::e4m3, kCpu);
  for (std::int64_t i = 0; i < 5; ++i) CHECK(qb.data<std::uint8_t>()[i] == want[i]);
  const Tensor rt = fp8_round_trip(xb, 224.0f, Fp8Format::e4m3, kCpu);
  REQUIRE(rt.dtype() == DType::bf16);
  CHECK(from_bf16(rt.data<BFloat16>()[1]) == 2.0f);

  // The scale is applied before rounding: 0.3 * 10 = 3 is exact in E5M2, 0.3 alone is not.
  const Tensor y = Tensor::from_vector<float>({0.3f}, {1});
  CHECK(fp8_round_trip(y, 10.0f, Fp8Format::e5m2, kCpu).data<float>()[0] == 3.0f * 0.1f);
}

TEST_CASE("FP8 amax and scale on edge inputs", "[fp8]") {
  CHECK(fp8_amax(Tensor::zeros({4, 3}), kCpu) == 0.0f);
  CHECK(fp8_amax(Tensor::empty({0}), kCpu) == 0.0f);
  CHECK(fp8_amax(Tensor::from_vector<float>({1.0f, -3.0f, 2.0f}, {3}), kCpu) == 3.0f);
  CHECK(fp8_amax(Tensor::from_vector<float>({1.0f, -kInf}, {2}), kCpu) == kInf);
  CHECK(std::isnan(fp8_amax(Tensor::from_vector<float>({kNan, kInf, 1.0f}, {3}), kCpu)));
  CHECK(std::isnan(fp8_amax(Tensor::from_vector<float>({kInf, kNan}, {2}), kCpu)));
  CHECK(fp8_amax(Tensor::from_vector<float>({-2.5f}, {1}).to(DType::bf16), kCpu) == 2.5f);

  CHECK(fp8_scale_from_amax(448.0f, Fp8Format::e4m3, 0, 1.0f, "x") == 1.0f);
  CHECK(fp8_scale_from_amax(2.0f, Fp8Format::e4m3, 0, 1.0f, "x") == 224.0f);
  CHECK(fp8_scale_from_amax(2.0f, Fp8Format::e4m3, 2, 1.0f, "x") == 56.0f);
  CHECK(fp8_scale_from_amax(1.0f, Fp8Format::e5m2, 0, 1.0f, "dy") == 57344.0f);
  // All zeros: the previous scale (1 for a fresh tensor); a tiny amax: the largest f32.
  CHECK(fp8_scale_from_amax(0.0f, Fp8Format::e4m3, 0, 1.0f, "x") == 1.0f);
  CHECK(fp8_scale_from_amax(0.0f, Fp8Format::e4m3, 0, 8.0f, "x") == 8.0f);
  CHECK(fp8_scale_from_amax(1e-40f, Fp8Format::e4m3, 0, 1.0f, "x") == FLT_MAX);
  REQUIRE_THROWS_QUINTET(fp8_scale_from_amax(kInf, Fp8Format::e4m3, 0, 1.0f, "layer 3 x"),
                         InvalidArgument, "layer 3 x: its amax is inf");
  REQUIRE_THROWS_QUINTET(fp8_scale_from_amax(kNan, Fp8Format::e5m2, 0, 1.0f, "dy"), InvalidArgument,
                         "non-finite");
}

TEST_CASE("FP8 scaling: current and delayed with an amax history", "[fp8]") {
  Fp8TensorScale current(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::current, 4, 0}, "x");
  CHECK(current.scale(2.0f) == 224.0f);
  CHECK(current.scale(4.0f) == 112.0f);
  CHECK(current.scale(0.0f) == 1.0f);
  CHECK(current.step_amax() == 4.0f);
  current.end_step();
  CHECK(current.step_amax() == 0.0f);
  CHECK(current.history().empty());
  REQUIRE_THROWS_QUINTET(current.scale(kNan), InvalidArgument, "FP8 scaling of x");

  Fp8TensorScale delayed(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::delayed, 3, 0}, "w");
  CHECK(delayed.uses_amax());
  CHECK(delayed.scale(2.0f) == 224.0f);  // no history yet: its own amax's scale
  delayed.end_step();
  CHECK(delayed.history() == std::vector<float>{2.0f, 0.0f, 0.0f});
  CHECK(delayed.delayed_scale() == 224.0f);
  CHECK_FALSE(delayed.uses_amax());
  CHECK(delayed.scale(4.0f) == 224.0f);  // this step's amax counts from the next step on
  CHECK(delayed.scale(1.0f) == 224.0f);
  delayed.end_step();  // the step's max over its tensors (microbatches) enters the history
  CHECK(delayed.history() == std::vector<float>{4.0f, 2.0f, 0.0f});
  CHECK(delayed.delayed_scale() == 112.0f);
  for (int s = 0; s < 2; ++s) {
    CHECK(delayed.scale(1.0f) == 112.0f);
    delayed.end_step();
  }
  CHECK(delayed.history() == std::vector<float>{1.0f, 1.0f, 4.0f});
  delayed.scale(1.0f);
  delayed.end_step();  // 4 leaves the history
  CHECK(delayed.delayed_scale() == 448.0f);
  REQUIRE_THROWS_QUINTET(delayed.scale(kInf), InvalidArgument, "FP8 scaling of w");

  // A history of zeros keeps the scale.
  Fp8TensorScale zeros(Fp8Format::e5m2, {Fp8Mode::hybrid, Fp8Scaling::delayed, 1, 0}, "dy");
  zeros.scale(0.0f);
  zeros.end_step();
  CHECK(zeros.delayed_scale() == 1.0f);
  CHECK(zeros.uses_amax());
  CHECK(zeros.scale(4.0f) == 14336.0f);

  // Saving and restoring the state continues the same way.
  Fp8TensorScale restored(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::delayed, 3, 0}, "w");
  restored.set_state(delayed.history(), delayed.delayed_scale());
  restored.scale(8.0f);
  delayed.scale(8.0f);
  restored.end_step();
  delayed.end_step();
  CHECK(restored.history() == delayed.history());
  CHECK(restored.delayed_scale() == delayed.delayed_scale());
  REQUIRE_THROWS_QUINTET(restored.set_state({1.0f}, 1.0f), InvalidArgument, "--fp8-amax-history");
  REQUIRE_THROWS_QUINTET(restored.set_state({1.0f, kNan, 0.0f}, 1.0f), InvalidArgument,
                         "must be finite");
  REQUIRE_THROWS_QUINTET(restored.set_state({1.0f, 1.0f, 0.0f}, 0.0f), InvalidArgument, "scale 0");
}

TEST_CASE("FP8 bad input", "[fp8]") {
  const Tensor x = Tensor::full({3}, 1.0);
  REQUIRE_THROWS_QUINTET(fp8_quantize(x, 0.0f, Fp8Format::e4m3, kCpu), InvalidArgument,
                         "scale = 0");
  REQUIRE_THROWS_QUINTET(fp8_quantize(x, kInf, Fp8Format::e4m3, kCpu), InvalidArgument,
                         "must be a finite number");
  REQUIRE_THROWS_QUINTET(fp8_quantize(x.to(DType::f64), 1.0f, Fp8Format::e4m3, kCpu),
                         InvalidArgument, "expected f32 or bf16");
  REQUIRE_THROWS_QUINTET(fp8_dequantize(x, 1.0f, Fp8Format::e4m3, DType::f32, kCpu),
                         InvalidArgument, "expected u8");
  REQUIRE_THROWS_QUINTET(
      fp8_dequantize(Tensor::zeros({3}, DType::u8), 1.0f, Fp8Format::e4m3, DType::f64, kCpu),
      InvalidArgument, "expected f32 or bf16");
  REQUIRE_THROWS_QUINTET(
      Fp8TensorScale(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::delayed, 0, 0}, "x"),
      InvalidArgument, "amax_history = 0");
  REQUIRE_THROWS_QUINTET(check_fp8_recipe({Fp8Mode::hybrid, Fp8Scaling::current, 1, -1}),
                         InvalidArgument, "margin = -1");
  CHECK(parse_fp8_mode("hybrid") == Fp8Mode::hybrid);
  REQUIRE_THROWS_QUINTET(parse_fp8_mode("on"), InvalidArgument, "expected off or hybrid");
  CHECK(parse_fp8_scaling("delayed") == Fp8Scaling::delayed);
  REQUIRE_THROWS_QUINTET(parse_fp8_scaling("tensorwise"), InvalidArgument,
                         "expected current or delayed");
}

TEST_CASE("FP8 casts with a scale tensor: the data, transpose and amax of one pass", "[fp8]") {
  // [3, 4] with a NaN-free spread of magnitudes; scale 3.5 (not a power of two).
  const std::vector<float> v = {0.5f, -1.25f,  100.0f, 0.0f,  -0.0f, 1e-4f,
                                7.0f, -300.0f, 2.0f,   -3.0f, 0.03f, 1.0f};
  const Tensor x = Tensor::from_vector<float>(v, {3, 4});
  const Tensor scale = fp8_scale_tensor(3.5f, Device::cpu(), kCpu);
  CHECK(scale.to_vector<float>() == std::vector<float>{1.0f / 3.5f, 3.5f});
  Tensor amax = Tensor::from_vector<float>({2.0f}, {1});
  for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const Fp8Tensor q = fp8_cast(x, scale, f, true, amax, kCpu);
    const Tensor want = fp8_quantize(x, 3.5f, f, kCpu);
    CHECK(q.data.to_vector<std::uint8_t>() == want.to_vector<std::uint8_t>());
    REQUIRE(q.transposed.shape() == Shape{4, 3});
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t c = 0; c < 4; ++c) {
        CHECK(q.transposed.data<std::uint8_t>()[c * 3 + r] == want.data<std::uint8_t>()[r * 4 + c]);
      }
    }
    CHECK(amax.data<float>()[0] == 300.0f);  // max'ed with the 2 it held
    const Tensor back = fp8_dequantize(q, DType::f32, kCpu);
    CHECK(back.to_vector<float>() ==
          fp8_dequantize(want, 3.5f, f, DType::f32, kCpu).to_vector<float>());
  }
  Tensor nan_amax = Tensor::from_vector<float>({0.0f}, {1});
  fp8_amax_into(Tensor::from_vector<float>({1.0f, kNan, kInf}, {3}), nan_amax, kCpu);
  CHECK(std::isnan(nan_amax.data<float>()[0]));
  fp8_amax_into(Tensor::from_vector<float>({1.0f}, {1}), nan_amax, kCpu);
  CHECK(std::isnan(nan_amax.data<float>()[0]));  // a NaN stays
}

TEST_CASE(
    "FP8 scale on the device form equals scale(), and a non-finite amax is refused at the "
    "step's end",
    "[fp8]") {
  for (const Fp8Scaling scaling : {Fp8Scaling::current, Fp8Scaling::delayed}) {
    Fp8TensorScale host(Fp8Format::e4m3, {Fp8Mode::hybrid, scaling, 2, 1}, "x");
    Fp8TensorScale dev(Fp8Format::e4m3, {Fp8Mode::hybrid, scaling, 2, 1}, "x");
    for (const float a : {3.0f, 0.0f, 5.0f, 1e-40f, 2.0f}) {
      const float want = host.scale(a);
      const Tensor s = dev.scale_on_device(Tensor::from_vector<float>({a}, {1}), true, kCpu);
      CHECK(s.to_vector<float>() == std::vector<float>{1.0f / want, want});
      REQUIRE(dev.on_device());
      dev.end_device_step(dev.device_state().data<float>()[1], kCpu);
      host.end_step();
      CHECK(dev.history() == host.history());
      CHECK(dev.delayed_scale() == host.delayed_scale());
    }
  }
  // A cast given the step slot as its amax records the tensor's amax there (delayed scaling).
  Fp8TensorScale w(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::delayed, 2, 0}, "w");
  const Tensor s = w.scale_on_device(Tensor::from_vector<float>({0.0f}, {1}), false, kCpu);
  fp8_cast(Tensor::from_vector<float>({1.0f, -6.0f}, {2}), s, Fp8Format::e4m3, false,
           w.step_amax_slot(), kCpu);
  CHECK(w.device_state().data<float>()[1] == 6.0f);
  w.end_device_step(w.device_state().data<float>()[1], kCpu);
  CHECK(w.history() == std::vector<float>{6.0f, 0.0f});

  Fp8TensorScale dy(Fp8Format::e5m2, {Fp8Mode::hybrid, Fp8Scaling::current, 1, 0}, "block0 dy");
  dy.scale_on_device(Tensor::from_vector<float>({kNan}, {1}), true, kCpu);
  dy.scale_on_device(Tensor::from_vector<float>({1.0f}, {1}), true, kCpu);
  CHECK(dy.device_state().data<float>()[1] == kInf);
  REQUIRE_THROWS_QUINTET(dy.end_device_step(dy.device_state().data<float>()[1], kCpu),
                         InvalidArgument, "FP8 scaling of block0 dy");
}

TEST_CASE("FP8 casts of several tensors in one call equal one at a time", "[fp8]") {
  // f32 and bf16, both formats, with and without the transpose and the amax, a 1-D tensor and an
  // empty one; two casts sharing one amax.
  const Tensor a = Tensor::randn({5, 8}, 31);
  const Tensor b = Tensor::randn({16, 4}, 32).to(DType::bf16);
  const Tensor e = Tensor::empty({0, 3});
  const Tensor v = Tensor::randn({6}, 33);
  const Tensor s1 = fp8_scale_tensor(3.5f, Device::cpu(), kCpu);
  const Tensor s2 = fp8_scale_tensor(0.25f, Device::cpu(), kCpu);
  const std::vector<Fp8CastArgs> casts = {{a, s1, Fp8Format::e4m3, true, Tensor()},
                                          {b, s2, Fp8Format::e5m2, true, Tensor()},
                                          {e, s1, Fp8Format::e4m3, true, Tensor()},
                                          {v, s2, Fp8Format::e4m3, false, Tensor()},
                                          {a, s2, Fp8Format::e5m2, false, Tensor()}};
  std::vector<Fp8CastArgs> with_amax = casts;
  const Tensor amax = Tensor::from_vector<float>({0.0f, 1.0f, 0.0f}, {3});
  for (std::size_t i = 0; i < casts.size(); ++i) {
    with_amax[i].amax = amax.narrow(0, static_cast<std::int64_t>(std::min<std::size_t>(i, 2)), 1);
  }
  const std::vector<Fp8Tensor> got = fp8_casts(with_amax, kCpu);
  REQUIRE(got.size() == casts.size());
  for (std::size_t i = 0; i < casts.size(); ++i) {
    INFO("cast " << i);
    const Fp8CastArgs& c = casts[i];
    const Fp8Tensor want = fp8_cast(c.x, c.scale, c.format, c.transposed, Tensor(), kCpu);
    CHECK(got[i].format == c.format);
    CHECK(got[i].scale.data_ptr() == c.scale.data_ptr());
    CHECK(got[i].data.shape() == c.x.shape());
    CHECK(got[i].data.to_vector<std::uint8_t>() == want.data.to_vector<std::uint8_t>());
    REQUIRE(got[i].transposed.defined() == c.transposed);
    if (c.transposed) {
      CHECK(got[i].transposed.shape() == want.transposed.shape());
      CHECK(got[i].transposed.to_vector<std::uint8_t>() ==
            want.transposed.to_vector<std::uint8_t>());
    }
  }
  const float amax_b = fp8_amax(b, kCpu), amax_va = std::max(fp8_amax(v, kCpu), fp8_amax(a, kCpu));
  CHECK(amax.to_vector<float>() ==
        std::vector<float>{fp8_amax(a, kCpu), std::max(1.0f, amax_b), amax_va});
  REQUIRE_THROWS_QUINTET(fp8_casts({{Tensor::zeros({2}, DType::i32), s1}}, kCpu), InvalidArgument,
                         "fp8_casts: x has dtype i32");
}

TEST_CASE("FP8 amaxes and scales of several tensors in one call equal one at a time", "[fp8]") {
  // Each amax max'ed with what it held; an empty tensor leaves it as it is; bf16 and f32 mixed.
  Tensor amax = Tensor::from_vector<float>({0.0f, 7.0f, 1.0f}, {3});
  fp8_amaxes_into(
      {Tensor::from_vector<float>({1.0f, -9.5f, 2.0f}, {3}),
       Tensor::from_vector<float>({3.0f, -2.0f}, {2}).to(DType::bf16), Tensor::empty({0})},
      amax, kCpu);
  CHECK(amax.to_vector<float>() == std::vector<float>{9.5f, 7.0f, 1.0f});
  REQUIRE_THROWS_QUINTET(fp8_amaxes_into({Tensor::zeros({2})}, Tensor::zeros({2}), kCpu),
                         InvalidArgument, "expected a contiguous f32 [1]");

  for (const Fp8Scaling scaling : {Fp8Scaling::current, Fp8Scaling::delayed}) {
    const Fp8Recipe recipe{Fp8Mode::hybrid, scaling, 2, 1};
    Fp8TensorScale hx(Fp8Format::e4m3, recipe, "x"), hdy(Fp8Format::e5m2, recipe, "dy");
    Fp8TensorScale dx(Fp8Format::e4m3, recipe, "x"), ddy(Fp8Format::e5m2, recipe, "dy");
    const std::vector<std::vector<float>> steps{{3.0f, 0.5f}, {0.0f, 6.0f}, {2.0f, 1.0f}};
    for (const std::vector<float>& a : steps) {
      const std::vector<float> want{hx.scale(a[0]), hdy.scale(a[1])};
      // With a history the scales are known without an amax (nothing recorded then).
      const bool known = !dx.uses_amax() && !ddy.uses_amax();
      const std::vector<Tensor> got = Fp8TensorScale::scales_on_device(
          {&dx, &ddy}, known ? Tensor() : Tensor::from_vector<float>(a, {2}), !known, kCpu);
      REQUIRE(got.size() == 2);
      CHECK(got[0].to_vector<float>() == std::vector<float>{1.0f / want[0], want[0]});
      CHECK(got[1].to_vector<float>() == std::vector<float>{1.0f / want[1], want[1]});
      if (known) {  // made once a step: a second call returns the same tensors
        const std::vector<Tensor> again =
            Fp8TensorScale::scales_on_device({&ddy, &dx}, Tensor(), false, kCpu);
        CHECK(again[0].data_ptr() == got[1].data_ptr());
        CHECK(again[1].data_ptr() == got[0].data_ptr());
        dx.device_state().data<float>()[1] = a[0];  // what the casts would record
        ddy.device_state().data<float>()[1] = a[1];
      }
      for (Fp8TensorScale* d : {&dx, &ddy})
        d->end_device_step(d->device_state().data<float>()[1], kCpu);
      hx.end_step();
      hdy.end_step();
      CHECK(dx.history() == hx.history());
      CHECK(ddy.delayed_scale() == hdy.delayed_scale());
    }
  }
  // set_state drops the tensor made for the step's delayed scale.
  Fp8TensorScale w(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::delayed, 1, 0}, "w");
  w.set_state({2.0f}, 4.0f);
  CHECK(Fp8TensorScale::scales_on_device({&w}, Tensor(), false, kCpu)[0].to_vector<float>() ==
        std::vector<float>{0.25f, 4.0f});
  w.set_state({2.0f}, 8.0f);
  CHECK(Fp8TensorScale::scales_on_device({&w}, Tensor(), false, kCpu)[0].to_vector<float>() ==
        std::vector<float>{0.125f, 8.0f});
  Fp8TensorScale cur(Fp8Format::e4m3, {Fp8Mode::hybrid, Fp8Scaling::current, 1, 0}, "layer 2 x");
  REQUIRE_THROWS_QUINTET(Fp8TensorScale::scales_on_device({&cur}, Tensor(), false, kCpu),
                         InvalidArgument, "no amax for layer 2 x");
  REQUIRE_THROWS_QUINTET(Fp8TensorScale::scales_on_device({&cur}, Tensor(), true, kCpu),
                         InvalidArgument, "record without an amax");
  REQUIRE_THROWS_QUINTET(Fp8TensorScale::scales_on_device({&cur}, Tensor::zeros({2}), true, kCpu),
                         InvalidArgument, "expected f32 [1]");
  REQUIRE_THROWS_QUINTET(
      Fp8TensorScale::scales_on_device({&cur, &cur}, Tensor::zeros({2}), true, kCpu),
      InvalidArgument, "layer 2 x is given twice");
}

TEST_CASE("FP8 GEMM on the CPU: the linear op on the dequantised operands", "[fp8]") {
  const Tensor x = Tensor::randn({5, 8}, 11), w = Tensor::randn({6, 8}, 12);
  const Tensor b = Tensor::randn({6}, 13);
  const Fp8Tensor qx = fp8_cast(x, fp8_scale_tensor(50.0f, Device::cpu(), kCpu), Fp8Format::e4m3,
                                false, Tensor(), kCpu);
  const Fp8Tensor qw = fp8_cast(w, fp8_scale_tensor(0.75f, Device::cpu(), kCpu), Fp8Format::e5m2,
                                false, Tensor(), kCpu);
  Tensor y = Tensor::empty({5, 6});
  fp8_gemm(qx, qw, b, y, false, false, kCpu);
  const Tensor want = linear_forward(fp8_round_trip(x, 50.0f, Fp8Format::e4m3, kCpu),
                                     fp8_round_trip(w, 0.75f, Fp8Format::e5m2, kCpu), b, kCpu);
  CHECK(y.to_vector<float>() == want.to_vector<float>());
  fp8_gemm(qx, qw, Tensor(), y, true, false, kCpu);  // y += the product without bias
  const Tensor again =
      linear_forward(fp8_round_trip(x, 50.0f, Fp8Format::e4m3, kCpu),
                     fp8_round_trip(w, 0.75f, Fp8Format::e5m2, kCpu), Tensor(), kCpu);
  for (std::int64_t i = 0; i < 30; ++i) {
    CHECK(y.data<float>()[i] == want.data<float>()[i] + again.data<float>()[i]);
  }
  Tensor db = Tensor::zeros({8});
  fp8_column_sum(qx, db, kCpu);
  const Tensor xr = fp8_round_trip(x, 50.0f, Fp8Format::e4m3, kCpu);
  for (std::int64_t c = 0; c < 8; ++c) {
    float sum = 0.0f;
    for (std::int64_t r = 0; r < 5; ++r) sum += xr.data<float>()[r * 8 + c];
    CHECK(db.data<float>()[c] == sum);
  }
  REQUIRE_THROWS_QUINTET(fp8_gemm(qw, qw, Tensor(), Tensor::empty({6, 6}), false, false, kCpu),
                         InvalidArgument, "both E5M2");
  REQUIRE_THROWS_QUINTET(fp8_gemm(qx, qw, Tensor(), Tensor::empty({5, 5}), false, false, kCpu),
                         InvalidArgument, "y has shape");
  REQUIRE_THROWS_QUINTET(fp8_gemm(qx, qx, Tensor(), Tensor::empty({5, 6}), false, false, kCpu),
                         InvalidArgument, "y has shape");
  REQUIRE_THROWS_QUINTET(fp8_cast(x, Tensor::zeros({3}), Fp8Format::e4m3, false, Tensor(), kCpu),
                         InvalidArgument, "scale tensor");
}
