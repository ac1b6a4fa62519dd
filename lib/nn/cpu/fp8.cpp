// CPU FP8 casts (quintet/nn/fp8.hpp): the scalar encode/decode and the element-wise tensor loops.
#include <cfloat>
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

void fp8_cast(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& q,
              const Tensor& qt, const Tensor& amax) {
  if (amax.defined()) {
    float& a = *amax.data<float>();
    const float here = fp8_amax(x);
    a = std::isnan(a) || std::isnan(here) ? a + here : std::fmax(a, here);
  }
  if (!q.defined()) return;
  const float s = scale.data<float>()[1];
  std::uint8_t* out = q.data<std::uint8_t>();
  for_each_value(x, [&](std::int64_t i, float v) { out[i] = fp8_encode(v * s, format); });
  if (!qt.defined()) return;
  const std::int64_t cols = x.size(x.dim() - 1), rows = cols == 0 ? 0 : x.numel() / cols;
  std::uint8_t* t = qt.data<std::uint8_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) t[c * rows + r] = out[r * cols + c];
  }
}

void fp8_column_sum(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& db) {
  const float inv = scale.data<float>()[0];
  const std::int64_t cols = q.size(q.dim() - 1), rows = cols == 0 ? 0 : q.numel() / cols;
  const std::uint8_t* in = q.data<std::uint8_t>();
  float* out = db.data<float>();
  for (std::int64_t c = 0; c < cols; ++c) {
    float sum = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) sum += fp8_decode(in[r * cols + c], format) * inv;
    out[c] += sum;
  }
}

void fp8_scale(const Tensor& amax, const Tensor& state, const Tensor& out, Fp8Format format,
               int margin, bool use_amax, bool record) {
  const float a = amax.data<float>()[0];
  float* st = state.data<float>();
  float now = 1.0f;
  if (std::isfinite(a) && a > 0.0f) {
    const float s = std::ldexp(fp8_max(format) / a, -margin);
    now = std::isfinite(s) ? s : FLT_MAX;
  }
  if (record) st[1] = std::isfinite(a) ? std::fmax(st[1], a) : INFINITY;
  const float s = use_amax ? now : st[0];
  float* o = out.data<float>();
  o[0] = 1.0f / s;
  o[1] = s;
}

void fp8_gemm(const Tensor& a, const Tensor& a_scale, Fp8Format a_format, const Tensor& b,
              const Tensor& b_scale, Fp8Format b_format, const Tensor& bias, const Tensor& y,
              bool accumulate, bool /*fast_accum*/) {
  const Tensor ad = Tensor::empty(a.shape(), DType::f32);
  const Tensor bd = Tensor::empty(b.shape(), DType::f32);
  fp8_dequantize(a, a_scale.data<float>()[0], a_format, ad);
  fp8_dequantize(b, b_scale.data<float>()[0], b_format, bd);
  if (!accumulate) {
    linear_forward(ad, bd, bias, y);
    return;
  }
  const Tensor tmp = Tensor::empty(y.shape(), DType::f32);
  linear_forward(ad, bd, bias, tmp);
  add_(y, tmp, 1.0f);
}

void fp8_dequantize(const Tensor& q, float scale_inv, Fp8Format format, const Tensor& x) {
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
