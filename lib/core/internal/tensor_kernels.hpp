// Private: the element-wise kernels behind Tensor (copy with conversion, fill, random fill), one
// CPU implementation and one CUDA implementation each. Shapes are already checked by the caller.
#pragma once

#include "quintet/core/config.hpp"
#include "quintet/core/random.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::detail {

// dst[c] = convert(src[c]) for every coordinate c; same shape, same device, any strides/dtypes.
void cpu_copy_convert(const Tensor& dst, const Tensor& src);
void cpu_fill(const Tensor& dst, double value);
void cpu_fill_random(const Tensor& dst, const RandomKey& key, Distribution dist, float lo, float hi,
                     const RandomRegion& region);

#if QUINTET_HAS_CUDA
void cuda_copy_convert(const Tensor& dst, const Tensor& src, cudaStream_t stream);
void cuda_fill(const Tensor& dst, double value, cudaStream_t stream);
void cuda_fill_random(const Tensor& dst, const RandomKey& key, Distribution dist, float lo,
                      float hi, const RandomRegion& region, cudaStream_t stream);
void cuda_philox_words(std::uint32_t* out, const RandomKey& key, std::uint64_t count,
                       cudaStream_t stream);
#endif

// The full shape and start of a region, defaulted to the tensor itself; checked.
RandomRegion resolve_region(const Tensor& out, const RandomRegion& region);

}  // namespace quintet::detail
