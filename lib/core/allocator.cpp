#include "quintet/core/allocator.hpp"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/internal/cuda_stream.hpp"
#include "core/internal/host_sync.hpp"
#include "quintet/core/config.hpp"
#include "quintet/core/device_guard.hpp"
#include "quintet/core/error.hpp"
#if QUINTET_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace quintet {

namespace {
constexpr std::size_t kSmallQuantum = 512;
constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
constexpr std::size_t kLargeQuantum = std::size_t{2} << 20;

std::size_t round_up(std::size_t n, std::size_t q) { return (n + q - 1) / q * q; }

// cpu_allocate's counters: bytes live now, the most since the last reset, calls.
std::atomic<std::size_t> cpu_current{0}, cpu_peak{0}, cpu_allocs{0};

void cpu_count(std::size_t bytes) {
  const std::size_t now = cpu_current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  cpu_allocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

std::size_t allocation_size_class(std::size_t bytes) {
  if (bytes == 0) return 0;
  return bytes <= kSmallLimit ? round_up(bytes, kSmallQuantum) : round_up(bytes, kLargeQuantum);
}

namespace {

// Free CPU blocks of 1 MiB and more, by size class, for reuse: a fresh large block comes from mmap
// and costs a page fault per 4 KiB page on first touch (for a 32 MiB exchange buffer, more than the
// exchange itself), so blocks that training allocates every step are kept instead of returned.
// Bounded by kCpuCacheLimit; never destroyed (blocks may be freed during static destruction).
constexpr std::size_t kCpuCacheLimit = std::size_t{1} << 30;

struct CpuCache {
  std::mutex mutex;
  std::multimap<std::size_t, void*> free;  // size class -> block
  std::size_t cached = 0, hits = 0;
};
CpuCache& cpu_cache() {
  static CpuCache* cache = new CpuCache();
  return *cache;
}

}  // namespace

std::shared_ptr<void> cpu_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_up(bytes, 64);
  const bool large = size >= kSmallLimit;
  const std::size_t block = large ? round_up(size, kLargeQuantum) : size;
  void* p = nullptr;
  std::size_t held = block;  // a reused block keeps its own (possibly larger) class
  if (large) {
    CpuCache& c = cpu_cache();
    std::lock_guard lock(c.mutex);
    auto it = c.free.lower_bound(block);
    if (it != c.free.end() && it->first <= 2 * block) {
      p = it->second;
      held = it->first;
      c.cached -= it->first;
      ++c.hits;
      c.free.erase(it);
    }
  }
  if (p == nullptr) {
    p = std::aligned_alloc(64, block);
    if (p == nullptr) QUINTET_THROW(System, "out of host memory allocating {} bytes", bytes);
  }
  cpu_count(size);
  return std::shared_ptr<void>(p, [size, held, large](void* q) {
    cpu_current.fetch_sub(size, std::memory_order_relaxed);
    if (large) {
      CpuCache& c = cpu_cache();
      std::lock_guard lock(c.mutex);
      if (c.cached + held <= kCpuCacheLimit) {
        c.free.emplace(held, q);
        c.cached += held;
        return;
      }
    }
    std::free(q);
  });
}

AllocatorStats cpu_allocator_stats() {
  AllocatorStats s;
  s.current_bytes = cpu_current.load(std::memory_order_relaxed);
  s.peak_bytes = cpu_peak.load(std::memory_order_relaxed);
  s.num_allocs = cpu_allocs.load(std::memory_order_relaxed);
  CpuCache& c = cpu_cache();
  std::lock_guard lock(c.mutex);
  s.cached_bytes = c.cached;
  s.num_cache_hits = c.hits;
  s.reserved_bytes = s.current_bytes + s.cached_bytes;
  return s;
}

void cpu_reset_peak() { cpu_peak.store(cpu_current.load(std::memory_order_relaxed)); }

#if QUINTET_HAS_CUDA
namespace {

// Pools of free blocks per stream, keyed by size class; one instance per device. A block goes
// back to the pool of the stream it was allocated on, so reuse is ordered by that stream.
class DevicePool {
 public:
  explicit DevicePool(int device) : device_(device) {}

  void* allocate(std::size_t bytes, cudaStream_t stream, std::size_t* size_class) {
    const std::size_t size = allocation_size_class(bytes);
    *size_class = size;
    std::lock_guard lock(mutex_);
    ++stats_.num_allocs;
    auto& pool = pools_[stream];
    // Best fit, but never hand a small request a block more than twice its size class.
    auto it = pool.lower_bound(size);
    if (it != pool.end() && it->first <= 2 * size) {
      void* p = it->second;
      *size_class = it->first;
      stats_.cached_bytes -= it->first;
      pool.erase(it);
      ++stats_.num_cache_hits;
      note_alloc(*size_class);
      return p;
    }
    DeviceGuard guard(Device::cuda(device_));
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, size);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached_locked();
      status = cudaMalloc(&p, size);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      QUINTET_THROW(Cuda,
                    "cuda:{} out of memory allocating {} bytes ({} in use, {} reserved, peak {}): "
                    "{}; reduce the batch or model size",
                    device_, size, stats_.current_bytes, stats_.reserved_bytes, stats_.peak_bytes,
                    cudaGetErrorString(status));
    }
    ++stats_.num_driver_allocs;
    stats_.reserved_bytes += size;
    note_alloc(size);
    return p;
  }

  void release(void* p, std::size_t size, cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    stats_.current_bytes -= size;
    stats_.cached_bytes += size;
    pools_[stream].emplace(size, p);
  }

  AllocatorStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    stats_.peak_bytes = stats_.current_bytes;
  }
  void empty_cache() {
    std::lock_guard lock(mutex_);
    release_cached_locked();
  }

 private:
  void note_alloc(std::size_t size) {
    stats_.current_bytes += size;
    if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  }
  void release_cached_locked() {
    DeviceGuard guard(Device::cuda(device_));
    // Blocks may still be used by queued kernels of their stream: wait for the device first.
    detail::note_host_sync();
    (void)cudaDeviceSynchronize();
    for (auto& [stream, pool] : pools_) {
      for (auto& [size, p] : pool) {
        (void)cudaFree(p);
        stats_.reserved_bytes -= size;
        stats_.cached_bytes -= size;
      }
      pool.clear();
    }
  }

  int device_;
  std::mutex mutex_;
  std::unordered_map<cudaStream_t, std::multimap<std::size_t, void*>> pools_;
  AllocatorStats stats_;
};

// Process-wide by nature: device memory is a per-process resource, like the CUDA context.
// Leaked on purpose so that tensors freed during static destruction never touch a dead pool.
std::vector<DevicePool*>& device_pools() {
  static auto* pools = [] {
    auto* v = new std::vector<DevicePool*>();
    for (int d = 0; d < cuda_device_count(); ++d) v->push_back(new DevicePool(d));
    return v;
  }();
  return *pools;
}

DevicePool& pool_for(const Device& device) {
  check_device(device);
  return *device_pools().at(static_cast<std::size_t>(device.index()));
}

class PinnedPool {
 public:
  void* allocate(std::size_t bytes, std::size_t* size_class) {
    const std::size_t size = allocation_size_class(bytes);
    *size_class = size;
    std::lock_guard lock(mutex_);
    auto it = free_.find(size);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return p;
    }
    void* p = nullptr;
    QUINTET_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocPortable));
    return p;
  }
  void release(void* p, std::size_t size) {
    std::lock_guard lock(mutex_);
    free_.emplace(size, p);
  }

 private:
  std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
};

PinnedPool& pinned_pool() {
  static auto* pool = new PinnedPool();  // leaked on purpose, see device_pools()
  return *pool;
}

}  // namespace

std::shared_ptr<void> cuda_allocate(std::size_t bytes, const Device& device, const Stream& stream) {
  QUINTET_CHECK(device.is_cuda(), "cuda_allocate on {}", device.str());
  if (bytes == 0) return nullptr;
  DevicePool& pool = pool_for(device);
  cudaStream_t s = detail::cuda_stream_of(stream);
  std::size_t size = 0;
  void* p = pool.allocate(bytes, s, &size);
  return std::shared_ptr<void>(p, [&pool, size, s](void* q) { pool.release(q, size, s); });
}

AllocatorStats cuda_allocator_stats(const Device& device) { return pool_for(device).stats(); }
void cuda_reset_peak(const Device& device) { pool_for(device).reset_peak(); }
void cuda_empty_cache() {
  for (DevicePool* pool : device_pools()) pool->empty_cache();
}

std::shared_ptr<void> pinned_allocate(std::size_t bytes) {
  if (!cuda_available()) return cpu_allocate(bytes);
  if (bytes == 0) return nullptr;
  std::size_t size = 0;
  void* p = pinned_pool().allocate(bytes, &size);
  return std::shared_ptr<void>(p, [size](void* q) { pinned_pool().release(q, size); });
}

#else  // no CUDA in this build

std::shared_ptr<void> cuda_allocate(std::size_t, const Device& device, const Stream&) {
  check_device(device.is_cuda() ? device : Device::cuda(0));
  QUINTET_THROW(InvalidArgument, "cuda_allocate: Quintet was built without CUDA");
}
AllocatorStats cuda_allocator_stats(const Device& device) {
  check_device(device);
  return {};
}
void cuda_reset_peak(const Device& device) { check_device(device); }
void cuda_empty_cache() {}
std::shared_ptr<void> pinned_allocate(std::size_t bytes) { return cpu_allocate(bytes); }

#endif

std::shared_ptr<void> allocate(std::size_t bytes, const Device& device, const Stream& stream) {
  return device.is_cpu() ? cpu_allocate(bytes) : cuda_allocate(bytes, device, stream);
}

}  // namespace quintet
