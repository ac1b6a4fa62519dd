// Philox4x32-10, the counter-based random number generator of Salmon et al. (SC'11), and the
// float draws built on it. Everything here is inline and usable in CUDA kernels, and computes the
// same bits on the CPU and the GPU: only integer arithmetic and IEEE-rounded float + - * / and
// sqrt are used (the CUDA sources that include this are compiled without FMA contraction).
//
// Keying: a draw is a pure function of (seed, stream_id, index). Element i of a tensor filled
// from (seed, stream_id, offset) uses index = offset + i, so a shard of a weight is the same
// slice of the unsharded draw whatever the layout.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QUINTET_HOST_DEVICE __host__ __device__
#else
#define QUINTET_HOST_DEVICE
#endif

namespace quintet::philox {

struct Out4 {
  std::uint32_t v[4];
};

QUINTET_HOST_DEVICE inline void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                        std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

// Ten rounds of Philox4x32 on counter c with key k.
QUINTET_HOST_DEVICE inline Out4 philox4x32(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                           std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c0, hi0, lo0);
    mulhilo(kM1, c2, hi1, lo1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return Out4{{c0, c1, c2, c3}};
}

// The four 32-bit words of draw `index` in stream (seed, stream_id).
QUINTET_HOST_DEVICE inline Out4 draw(std::uint64_t seed, std::uint64_t stream_id,
                                     std::uint64_t index) {
  return philox4x32(static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                    static_cast<std::uint32_t>(stream_id),
                    static_cast<std::uint32_t>(stream_id >> 32), static_cast<std::uint32_t>(seed),
                    static_cast<std::uint32_t>(seed >> 32));
}

// Uniform in [0, 1) with 24 random bits (exact in float).
QUINTET_HOST_DEVICE inline float uniform01(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Natural log of x in (0, 1], from integer exponent extraction and an odd series in
// s = (m - 1) / (m + 1); accurate to a few ulp, identical on host and device.
QUINTET_HOST_DEVICE inline float det_log(float x) {
  std::uint32_t u;
  static_assert(sizeof(float) == sizeof(std::uint32_t));
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  __builtin_memcpy(&u, &x, sizeof u);
#endif
  int e = static_cast<int>((u >> 23) & 0xffu) - 127;
  std::uint32_t mu = (u & 0x7fffffu) | 0x3f800000u;  // mantissa in [1, 2)
  float m;
#if defined(__CUDA_ARCH__)
  m = __uint_as_float(mu);
#else
  __builtin_memcpy(&m, &mu, sizeof m);
#endif
  if (m > 1.41421356f) {  // keep m in [sqrt(2)/2, sqrt(2)) so |s| <= 0.172
    m = m * 0.5f;
    e += 1;
  }
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float poly =
      2.0f + s2 * (0.6666666666f + s2 * (0.4f + s2 * (0.2857142857f + s2 * 0.2222222222f)));
  return static_cast<float>(e) * 0.693147180559945f + s * poly;
}

// sin and cos of 2*pi*t for t in [0, 1): quadrant reduction, then Taylor polynomials on
// [-pi/4, pi/4].
QUINTET_HOST_DEVICE inline void det_sincos_2pi(float t, float& s, float& c) {
  const float q = t * 4.0f;
  int quadrant = static_cast<int>(q + 0.5f);  // nearest quarter turn, 0..4
  const float r = (q - static_cast<float>(quadrant)) * 1.5707963267948966f;  // in [-pi/4, pi/4]
  const float r2 = r * r;
  const float sr =
      r * (1.0f + r2 * (-0.16666666666f +
                        r2 * (0.00833333333f + r2 * (-0.000198412698f + r2 * 2.7557319e-6f))));
  const float cr =
      1.0f +
      r2 * (-0.5f + r2 * (0.0416666666f +
                          r2 * (-0.00138888889f + r2 * (2.48015873e-5f - r2 * 2.755731922e-7f))));
  switch (quadrant & 3) {
    case 0:
      s = sr;
      c = cr;
      break;
    case 1:
      s = cr;
      c = -sr;
      break;
    case 2:
      s = -sr;
      c = -cr;
      break;
    default:
      s = -cr;
      c = sr;
      break;
  }
}

// A standard normal value from two 32-bit words (Box-Muller, cosine branch).
QUINTET_HOST_DEVICE inline float normal(std::uint32_t a, std::uint32_t b) {
  const float u1 = (static_cast<float>(a >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = uniform01(b);
  float s, c;
  det_sincos_2pi(u2, s, c);
  const float radius2 = -2.0f * det_log(u1);
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(radius2) * c;
#else
  return __builtin_sqrtf(radius2) * c;
#endif
}

}  // namespace quintet::philox
