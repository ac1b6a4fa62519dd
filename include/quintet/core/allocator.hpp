// Memory: a caching CUDA allocator, a pinned host allocator and aligned CPU memory.
//
// All three hand out std::shared_ptr<void> whose deleter gives the block back, so a Tensor's
// storage owns its memory. The CUDA allocator keeps freed blocks in per-(device, stream) pools
// and reuses them for later requests of a similar size on the same stream, which avoids
// cudaMalloc/cudaFree (both synchronise the device) in a training step. A block freed while a
// kernel on its stream still uses it is safe to reuse on that same stream; using a block on
// another stream is the caller's to order (record an event, or allocate on the consuming stream).
// All functions are thread-safe.
#pragma once

#include <cstddef>
#include <memory>

#include "quintet/core/device.hpp"
#include "quintet/core/stream.hpp"

namespace quintet {

struct AllocatorStats {
  std::size_t current_bytes = 0;      // bytes handed out and not yet freed
  std::size_t peak_bytes = 0;         // the most current_bytes has been since the last reset
  std::size_t cached_bytes = 0;       // bytes held in the pools, free for reuse
  std::size_t reserved_bytes = 0;     // bytes obtained from the driver (in use + cached)
  std::size_t num_allocs = 0;         // allocate() calls
  std::size_t num_cache_hits = 0;     // allocate() calls served from a pool
  std::size_t num_driver_allocs = 0;  // cudaMalloc calls
};

// The size a request of bytes is rounded up to: a multiple of 512 bytes up to 1 MiB, of 2 MiB
// above. Blocks are pooled by this size class.
std::size_t allocation_size_class(std::size_t bytes);

// Device memory on device, for use on stream (its pool). bytes == 0 gives a null pointer.
// Throws Cuda (with the sizes and statistics in the message) when the device is out of memory
// even after the cache is emptied.
std::shared_ptr<void> cuda_allocate(std::size_t bytes, const Device& device, const Stream& stream);
AllocatorStats cuda_allocator_stats(const Device& device);
void cuda_reset_peak(const Device& device);
// Returns every cached (free) block of every device to the driver.
void cuda_empty_cache();

// Page-locked host memory (cudaHostAlloc), cached by size class; plain aligned memory when CUDA
// is not available, so callers need no special case.
std::shared_ptr<void> pinned_allocate(std::size_t bytes);
// 64-byte aligned CPU memory. Freed blocks of 1 MiB and more are kept (by 2 MiB size class, up to
// 1 GiB in all) and reused, so large buffers allocated every step do not page-fault every step.
std::shared_ptr<void> cpu_allocate(std::size_t bytes);
// cpu_allocate's bytes: current_bytes (live, rounded up to 64), peak_bytes (since the last reset),
// num_allocs, cached_bytes and num_cache_hits (the large-block cache), reserved_bytes (live +
// cached). Pinned host memory in a CUDA build is not counted here.
AllocatorStats cpu_allocator_stats();
void cpu_reset_peak();  // peak_bytes = current_bytes

// Memory on device: cpu_allocate for the CPU, cuda_allocate on stream for a GPU.
std::shared_ptr<void> allocate(std::size_t bytes, const Device& device, const Stream& stream);

}  // namespace quintet
