// Seeded random tensors drawn from Philox (see philox.hpp): CPU and GPU give the same bits, and a
// slice of a larger tensor can be drawn on its own, equal to that slice of the whole draw.
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/core/tensor.hpp"

namespace quintet {

// Where draws come from: element with flat index g (row-major in the full shape) uses Philox
// draw index offset + g of stream (seed, stream_id).
struct RandomKey {
  std::uint64_t seed = 0;
  std::uint64_t stream_id = 0;
  std::uint64_t offset = 0;
};

enum class Distribution { uniform, normal };

// A rectangular region of a larger (virtual) tensor: out's element at coordinate c is the
// element at coordinate start + c of a tensor of shape full_shape. Empty means out is the whole.
struct RandomRegion {
  Shape full_shape;
  Shape start;
};

// Fills out (any device, dtype f32/f64/bf16/f16) on stream with draws: uniform in [lo, hi), or
// normal with mean lo and standard deviation hi. Values are computed in f32, then converted.
void fill_random(Tensor& out, const RandomKey& key, Distribution dist, float lo, float hi,
                 const RandomRegion& region, const Stream& stream);
void fill_uniform(Tensor& out, const RandomKey& key, float lo = 0.0f, float hi = 1.0f,
                  const RandomRegion& region = {});
void fill_normal(Tensor& out, const RandomKey& key, float mean = 0.0f, float stddev = 1.0f,
                 const RandomRegion& region = {});
// The four 32-bit words of each of draws key.offset .. key.offset + count - 1, computed on device
// and returned to the host (4 * count words); for checking CPU/GPU identity.
std::vector<std::uint32_t> philox_words(const RandomKey& key, std::uint64_t count,
                                        const Device& device);

}  // namespace quintet
