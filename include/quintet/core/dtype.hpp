// DType: the element types a Tensor can hold, their sizes and names, and the scalar conversions
// between float and the 16-bit floating formats.
//
// bf16 and f16 are stored as raw 16-bit patterns (BFloat16, Half). Conversions from float round
// to nearest even, as CUDA's __float2bfloat16_rn / __float2half_rn do, so CPU and GPU agree bit
// for bit. NaN stays NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace quintet {

enum class DType : std::uint8_t { f32, f16, bf16, f64, i32, i64, u8, u16 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64,
                                       DType::i32, DType::i64, DType::u8,   DType::u16};

// Size of one element in bytes.
std::size_t dtype_size(DType dtype);
// "f32", "bf16", ...
std::string_view dtype_name(DType dtype);
// Parses a name as printed by dtype_name (also "float32", "bfloat16", "float16", "int32", ...);
// throws InvalidArgument listing the accepted names otherwise.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);

// A bfloat16 value as its bit pattern.
struct BFloat16 {
  std::uint16_t bits = 0;
};
// An IEEE half value as its bit pattern.
struct Half {
  std::uint16_t bits = 0;
};

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> bf16, round to nearest even; NaN is kept a quiet NaN.
inline BFloat16 to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return BFloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>(u >> 16)};
}
inline float from_bf16(BFloat16 b) { return bits_float(static_cast<std::uint32_t>(b.bits) << 16); }

// float -> IEEE half, round to nearest even, overflow to infinity, subnormals kept.
Half to_half(float f);
float from_half(Half h);

// Maps a C++ type to its DType (float -> f32, BFloat16 -> bf16, ...).
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<std::uint16_t> {
  static constexpr DType value = DType::u16;
};
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// Converts one value between any two element types (through float for the 16-bit formats).
template <class To, class From>
To convert_scalar(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert_scalar<To>(from_bf16(v));
  } else if constexpr (std::is_same_v<From, Half>) {
    return convert_scalar<To>(from_half(v));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return to_bf16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, Half>) {
    return to_half(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// Reads element i of a buffer of dtype as double / writes a double into it (with the rounding of
// the conversions above; integers are truncated toward zero). For tests and slow paths only.
double load_as_double(const void* data, DType dtype, std::size_t i);
void store_from_double(void* data, DType dtype, std::size_t i, double value);

// Calls f(T{}) with T the C++ type of dtype.
template <class F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f16:
      return f(Half{});
    case DType::bf16:
      return f(BFloat16{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(std::int32_t{});
    case DType::i64:
      return f(std::int64_t{});
    case DType::u8:
      return f(std::uint8_t{});
    case DType::u16:
      return f(std::uint16_t{});
  }
  return f(float{});
}

}  // namespace quintet
