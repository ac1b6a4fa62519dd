#include "quintet/core/dtype.hpp"

#include <cmath>

#include "quintet/core/error.hpp"

namespace quintet {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::u16:
      return 2;
  }
  QUINTET_THROW(InvalidArgument, "unknown dtype code {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::u16:
      return "u16";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},     {"float32", DType::f32},   {"float", DType::f32},
      {"f16", DType::f16},     {"float16", DType::f16},   {"half", DType::f16},
      {"bf16", DType::bf16},   {"bfloat16", DType::bf16}, {"f64", DType::f64},
      {"float64", DType::f64}, {"double", DType::f64},    {"i32", DType::i32},
      {"int32", DType::i32},   {"i64", DType::i64},       {"int64", DType::i64},
      {"u8", DType::u8},       {"uint8", DType::u8},      {"u16", DType::u16},
      {"uint16", DType::u16}};
  for (const auto& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  QUINTET_THROW(InvalidArgument,
                "unknown dtype '{}': expected one of f32, f16, bf16, f64, i32, i64, u8, u16", name);
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::f64;
}

Half to_half(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return Half{static_cast<std::uint16_t>(sign | 0x7c00u)};  // overflow
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): scale into an integer count of 2^-24 and round to nearest even.
    // The multiplication by 2^24 is exact and rint rounds half to even.
    const float scaled = bits_float(abs) * 16777216.0f;
    return Half{
        static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)))};
  }
  // Normal: rebias the exponent, then round the 13 dropped mantissa bits to nearest even.
  std::uint32_t h = ((abs >> 13) - (112u << 10));
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return Half{static_cast<std::uint16_t>(sign | h)};
}

float from_half(Half hv) {
  const std::uint32_t h = hv.bits;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * (1.0f / 16777216.0f);  // exact
    return sign ? -mag : mag;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

double load_as_double(const void* data, DType dtype, std::size_t i) {
  return dispatch_dtype(dtype, [&](auto tag) -> double {
    using T = decltype(tag);
    const T v = static_cast<const T*>(data)[i];
    if constexpr (std::is_same_v<T, BFloat16>) {
      return from_bf16(v);
    } else if constexpr (std::is_same_v<T, Half>) {
      return from_half(v);
    } else {
      return static_cast<double>(v);
    }
  });
}

void store_from_double(void* data, DType dtype, std::size_t i, double value) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(data) + i;
    if constexpr (std::is_same_v<T, BFloat16>) {
      *p = to_bf16(static_cast<float>(value));
    } else if constexpr (std::is_same_v<T, Half>) {
      *p = to_half(static_cast<float>(value));
    } else {
      *p = static_cast<T>(value);
    }
  });
}

}  // namespace quintet
