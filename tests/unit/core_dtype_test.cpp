// DType sizes, names and the bf16/f16 conversions (round to nearest even).
#include <cmath>
#include <limits>

#include "support/catch.hpp"

#include "quintet/core/dtype.hpp"

using namespace quintet;

TEST_CASE("dtype sizes and names round-trip") {
  for (DType d : kAllDTypes) {
    CHECK(parse_dtype(dtype_name(d)) == d);
  }
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::f64) == 8);
  CHECK(dtype_size(DType::u8) == 1);
  CHECK(parse_dtype("bfloat16") == DType::bf16);
  REQUIRE_THROWS_QUINTET(parse_dtype("f8"), InvalidArgument, "expected one of");
}

// Reference: exact rounding of a double to bf16 by searching the two neighbours.
static double round_to_bf16_reference(float f) {
  const std::uint32_t u = float_bits(f);
  const float lo = bits_float(u & 0xffff0000u);
  const float hi = bits_float((u & 0xffff0000u) + 0x10000u);
  const double dl = std::abs(static_cast<double>(f) - lo);
  const double dh = std::abs(static_cast<double>(hi) - f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return ((u >> 16) & 1u) ? hi : lo;  // tie: even mantissa
}

TEST_CASE("bf16 rounds to nearest even") {
  CHECK(to_bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(to_bf16(1.0f + 1.0f / 256).bits == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  CHECK(to_bf16(1.0f + 3.0f / 256).bits == 0x3f82);
  CHECK(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  std::uint32_t state = 12345;
  for (int i = 0; i < 100000; ++i) {
    state = state * 1664525u + 1013904223u;
    const float f = bits_float((state & 0x7fffffffu) % 0x7f000000u) * ((state >> 31) ? -1 : 1);
    REQUIRE(from_bf16(to_bf16(f)) == round_to_bf16_reference(f));
  }
}

TEST_CASE("half conversion: exact values, rounding, overflow and subnormals") {
  CHECK(to_half(1.0f).bits == 0x3c00);
  CHECK(to_half(-2.0f).bits == 0xc000);
  CHECK(to_half(65504.0f).bits == 0x7bff);
  CHECK(to_half(65520.0f).bits == 0x7c00);       // rounds to infinity
  CHECK(to_half(5.9604645e-8f).bits == 0x0001);  // smallest subnormal
  CHECK(to_half(2.98e-8f).bits == 0x0000);       // below half of it
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even.
  CHECK(to_half(1.0f + 1.0f / 2048).bits == 0x3c00);
  CHECK(to_half(1.0f + 3.0f / 2048).bits == 0x3c02);
  // Every half value converts to float and back unchanged.
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const Half x{static_cast<std::uint16_t>(h)};
    const float f = from_half(x);
    if (std::isnan(f)) continue;
    REQUIRE(to_half(f).bits == x.bits);
  }
}

TEST_CASE("convert_scalar goes through float for 16-bit formats and truncates integers") {
  CHECK(convert_scalar<float>(to_bf16(3.5f)) == 3.5f);
  CHECK(convert_scalar<std::int32_t>(-2.7) == -2);
  CHECK(convert_scalar<BFloat16>(1.0).bits == 0x3f80);
  CHECK(convert_scalar<double>(to_half(0.5f)) == 0.5);
}
