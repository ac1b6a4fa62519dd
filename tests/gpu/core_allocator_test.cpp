// The caching CUDA allocator: reuse per stream, statistics, empty_cache; pinned memory.
#include "support/catch.hpp"

#include "quintet/core/allocator.hpp"
#include "quintet/core/config.hpp"
#include "quintet/core/tensor.hpp"
#if QUINTET_HAS_CUDA
#include <cuda_runtime.h>
#endif

using namespace quintet;

TEST_CASE("freed blocks are reused on the same stream and counted") {
  const Device gpu = Device::cuda(0);
  cuda_empty_cache();
  Stream s = Stream::create(gpu);
  const AllocatorStats before = cuda_allocator_stats(gpu);
  void* first = nullptr;
  {
    auto a = cuda_allocate(3000, gpu, s);
    first = a.get();
    const AllocatorStats mid = cuda_allocator_stats(gpu);
    CHECK(mid.current_bytes == before.current_bytes + allocation_size_class(3000));
    CHECK(mid.num_driver_allocs == before.num_driver_allocs + 1);
  }
  const AllocatorStats freed = cuda_allocator_stats(gpu);
  CHECK(freed.current_bytes == before.current_bytes);
  CHECK(freed.cached_bytes >= allocation_size_class(3000));
  {
    auto b = cuda_allocate(2900, gpu, s);  // same size class: served from the pool
    CHECK(b.get() == first);
    const AllocatorStats again = cuda_allocator_stats(gpu);
    CHECK(again.num_cache_hits == freed.num_cache_hits + 1);
    CHECK(again.num_driver_allocs == freed.num_driver_allocs);
    CHECK(again.peak_bytes >= again.current_bytes);
  }
  {
    // Another stream does not see this stream's pool.
    Stream other = Stream::create(gpu);
    auto c = cuda_allocate(3000, gpu, other);
    CHECK(c.get() != first);
  }
  cuda_empty_cache();
  CHECK(cuda_allocator_stats(gpu).cached_bytes == 0);
}

TEST_CASE("size classes and peak statistics") {
  CHECK(allocation_size_class(1) == 512);
  CHECK(allocation_size_class(513) == 1024);
  CHECK(allocation_size_class((1 << 20) + 1) == (2u << 20));
  const Device gpu = Device::cuda(0);
  cuda_reset_peak(gpu);
  const std::size_t base = cuda_allocator_stats(gpu).current_bytes;
  {
    Tensor big = Tensor::empty({64 << 20}, DType::u8, gpu);
    CHECK(cuda_allocator_stats(gpu).peak_bytes >= base + (64u << 20));
  }
  CHECK(cuda_allocator_stats(gpu).current_bytes == base);
  CHECK(cuda_allocator_stats(gpu).peak_bytes >= base + (64u << 20));
}

TEST_CASE("pinned host tensors are page-locked, usable host memory") {
  Tensor p = Tensor::empty_pinned({1000}, DType::f32);
  CHECK(p.device().is_cpu());
  p.fill_(3.0);
  CHECK(p.to_vector<float>()[999] == 3.0f);
#if QUINTET_HAS_CUDA
  // CUDA knows the memory as page-locked host memory; a plain host tensor's is unregistered.
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, p.data_ptr()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeHost);
  CHECK(attributes.hostPointer == p.data_ptr());
  const Tensor pageable = Tensor::empty({1000}, DType::f32);
  REQUIRE(cudaPointerGetAttributes(&attributes, pageable.data_ptr()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeUnregistered);
#endif
}
