#include "quintet/core/random.hpp"

#include "core/internal/cuda_stream.hpp"
#include "core/internal/tensor_kernels.hpp"
#include "quintet/core/allocator.hpp"
#include "quintet/core/device_guard.hpp"
#include "quintet/core/philox.hpp"
#if QUINTET_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace quintet {

void fill_random(Tensor& out, const RandomKey& key, Distribution dist, float lo, float hi,
                 const RandomRegion& region, const Stream& stream) {
  QUINTET_CHECK(out.defined(), "fill_random on an undefined tensor");
  const RandomRegion r = detail::resolve_region(out, region);
  if (out.numel() == 0) return;
  if (out.device().is_cpu()) {
    detail::cpu_fill_random(out, key, dist, lo, hi, r);
    return;
  }
#if QUINTET_HAS_CUDA
  DeviceGuard guard(out.device());
  detail::cuda_fill_random(out, key, dist, lo, hi, r, detail::cuda_stream_of(stream));
#else
  (void)stream;
#endif
}

namespace {
void fill_sync(Tensor& out, const RandomKey& key, Distribution dist, float a, float b,
               const RandomRegion& region) {
  if (out.device().is_cpu()) return fill_random(out, key, dist, a, b, region, Stream());
  Stream stream = Stream::default_stream(out.device());
  fill_random(out, key, dist, a, b, region, stream);
  stream.synchronize();
}
}  // namespace

void fill_uniform(Tensor& out, const RandomKey& key, float lo, float hi,
                  const RandomRegion& region) {
  fill_sync(out, key, Distribution::uniform, lo, hi, region);
}

void fill_normal(Tensor& out, const RandomKey& key, float mean, float stddev,
                 const RandomRegion& region) {
  fill_sync(out, key, Distribution::normal, mean, stddev, region);
}

std::vector<std::uint32_t> philox_words(const RandomKey& key, std::uint64_t count,
                                        const Device& device) {
  std::vector<std::uint32_t> out(4 * count);
  if (device.is_cpu()) {
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto w = philox::draw(key.seed, key.stream_id, key.offset + i);
      for (int k = 0; k < 4; ++k) out[4 * i + k] = w.v[k];
    }
    return out;
  }
  check_device(device);
#if QUINTET_HAS_CUDA
  DeviceGuard guard(device);
  Stream stream = Stream::default_stream(device);
  auto buf = cuda_allocate(out.size() * sizeof(std::uint32_t), device, stream);
  detail::cuda_philox_words(static_cast<std::uint32_t*>(buf.get()), key, count, nullptr);
  QUINTET_CUDA_CHECK(cudaMemcpy(out.data(), buf.get(), out.size() * sizeof(std::uint32_t),
                                cudaMemcpyDeviceToHost));
#endif
  return out;
}

}  // namespace quintet
