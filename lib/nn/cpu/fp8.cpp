// CPU FP8 casts (quintet/nn/fp8.hpp): the scalar encode/decode and the element-wise tensor loops.
#include <cmath>
#include <cstring>

#include "nn/cpu/cpu_ops.hpp"
#include "quintet/core/dtype.hpp"
#include "quintet/nn/fp8.hpp"

namespace quintet::nn {

namespace {
struct Fp8Layout {
  int exponent_bias;
  int mantissa_bits;
  std::uint8_t max_bits;  // the largest finite value, positive
};
constexpr Fp8Layout layout(Fp8Format format) {
  return format == Fp8Format::e4m3 ? Fp8Layout{7, 3, 0x7e} : Fp8Layout{15, 2, 0x7b};
}
constexpr std::uint8_t kCanonicalNan = 0x7f;
}  // namespace

float fp8_max(Fp8Format format) { return format == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

std::uint8_t fp8_encode(float f, Fp8Format format) {
  const Fp8Layout l = layout(format);
  if (std::isnan(f)) return kCanonicalNan;
  const std::uint32_t bits = float_bits(f);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const float a = std::fabs(f);
  if (a >= fp8_max(format)) return static_cast<std::uint8_t>(sign | l.max_bits);  // saturate
  const float min_normal = std::ldexp(1.0f, 1 - l.exponent_bias);
  if (a < min_normal) {
    // Subnormal: a count of 2^(1 - bias - mantissa_bits) units, rounded to nearest even; a count
    // of 2^mantissa_bits is the smallest normal's pattern, so the carry needs no special case.
    const float units = std::ldexp(a, l.exponent_bias - 1 + l.mantissa_bits);  // exact
    float whole = std::floor(units);
    const float rest = units - whole;  // exact
    if (rest > 0.5f || (rest == 0.5f && std::fmod(whole, 2.0f) != 0.0f)) whole += 1.0f;
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(whole));
  }
  // Normal: rebias the exponent within the f32 pattern, then round off the low mantissa bits to
  // nearest even (a carry moves into the exponent; a < max never rounds past max).
  const int shift = 23 - l.mantissa_bits;
  const std::uint32_t rebiased =
      float_bits(a) - (static_cast<std::uint32_t>(127 - l.exponent_bias) << 23);
  const std::uint32_t rounded =
      (rebiased + (1u << (shift - 1)) - 1u + ((rebiased >> shift) & 1u)) >> shift;
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(rounded));
}

float fp8_decode(std::uint8_t bits, Fp8Format format) {
  const Fp8Layout l = layout(format);
  const bool negative = (bits & 0x80u) != 0;
  const int exponent_field = (bits & 0x7f) >> l.mantissa_bits;
  const int mantissa = bits & ((1 << l.mantissa_bits) - 1);
  const int exponent_all_ones = (1 << (7 - l.mantissa_bits)) - 1;
  float value;
  if (format == Fp8Format::e4m3 && exponent_field == exponent_all_ones && mantissa == 7) {
    value = std::nanf("");
  } else if (format == Fp8Format::e5m2 && exponent_field == exponent_all_ones) {
    value = mantissa == 0 ? INFINITY : std::nanf("");
  } else if (exponent_field == 0) {
    value = std::ldexp(static_cast<float>(mantissa), 1 - l.exponent_bias - l.mantissa_bits);
  } else {
    value = std::ldexp(static_cast<float>(mantissa + (1 << l.mantissa_bits)),
                       exponent_field - l.exponent_bias - l.mantissa_bits);
  }
  return negative ? -value : value;
}

namespace cpu_ops {

namespace {
template <class F>
void for_each_value(const Tensor& x, F&& f) {
  const std::int64_t n = x.numel();
  if (x.dtype() == DType::bf16) {
    const BFloat16* p = x.data<BFloat16>();
    for (std::int64_t i = 0; i < n; ++i) f(i, from_bf16(p[i]));
  } else {
    const float* p = x.data<float>();
    for (std::int64_t i = 0; i < n; ++i) f(i, p[i]);
  }
}
}  // namespace

float fp8_amax(const Tensor& x) {
  float amax = 0.0f;
  bool nan = false;
  for_each_value(x, [&](std::int64_t, float v) {
    if (std::isnan(v)) nan = true;
    amax = std::fmax(amax, std::fabs(v));
  });
  return nan ? std::nanf("") : amax;
}

void fp8_quantize(const Tensor& x, float scale, Fp8Format format, const Tensor& q) {
  std::uint8_t* out = q.data<std::uint8_t>();
  for_each_value(x, [&](std::int64_t i, float v) { out[i] = fp8_encode(v * scale, format); });
}

void fp8_dequantize(const Tensor& q, float scale, Fp8Format format, const Tensor& x) {
  const float scale_inv = 1.0f / scale;
  const std::uint8_t* in = q.data<std::uint8_t>();
  const std::int64_t n = q.numel();
  if (x.dtype() == DType::bf16) {
    BFloat16* out = x.data<BFloat16>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(fp8_decode(in[i], format) * scale_inv);
  } else {
    float* out = x.data<float>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = fp8_decode(in[i], format) * scale_inv;
  }
}

}  // namespace cpu_ops
}  // namespace quintet::nn
