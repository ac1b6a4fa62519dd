// Stream and Event: RAII owners of CUDA streams and events, and their no-op CPU counterparts.
//
// Every compute op and copy takes the Stream it runs on explicitly. On the CPU a stream is the
// calling thread: work runs synchronously, record/wait/synchronize do nothing. Both types are
// move-only; a Stream from Stream::default_stream() borrows the CUDA legacy default stream and
// destroys nothing. Not thread-safe to destroy while another thread uses them.
//
// host_sync_count() counts the host's waits for a device, for tests and telemetry that a code
// path makes none (or exactly the ones it documents). Counted once per call, on every thread:
//   - on every device, the CPU included (where the call marks the place a GPU run would wait):
//     Stream::synchronize, Event::synchronize (and Event::wait onto a CPU stream, which is one),
//     and the reads of a tensor on the host: Tensor::to(Device::cpu()) without a stream,
//     to_vector(), item() — from any source device, a CPU tensor's too;
//   - on a CUDA device only (where they wait; on the CPU they are plain host work): the other
//     stream-less tensor calls that touch a CUDA tensor (copy_, fill_, to(dtype), clone(),
//     contiguous(), from_vector), a copy between a device and pageable host memory on a stream,
//     and the caching allocator's release of its blocks (empty_cache, or a retry after an
//     allocation failed).
// A copy to pinned host memory on a stream (Tensor::to(Device::cpu(), stream)) does not wait and
// is not counted; the synchronize that makes its values readable is.
#pragma once

#include <cstdint>

#include "quintet/core/device.hpp"

// The CUDA handle types, declared without pulling cuda_runtime.h into user code.
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace quintet {

enum class StreamPriority { normal, high };

class Stream {
 public:
  // A CPU stream (the calling thread).
  Stream() = default;
  // Creates a new non-blocking CUDA stream on device (or a CPU stream for the CPU).
  static Stream create(const Device& device, StreamPriority priority = StreamPriority::normal);
  // The device's default stream (CUDA's legacy default stream); owns nothing.
  static Stream default_stream(const Device& device);
  // Wraps an existing CUDA stream without owning it (e.g. one made by another library).
  static Stream borrow(const Device& device, cudaStream_t handle);

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  const Device& device() const { return device_; }
  cudaStream_t handle() const { return handle_; }  // nullptr on the CPU and for the default stream
  // Blocks the host until all work queued on the stream has finished.
  void synchronize() const;

 private:
  Stream(Device device, cudaStream_t handle, bool owned)
      : device_(device), handle_(handle), owned_(owned) {}
  Device device_;
  cudaStream_t handle_ = nullptr;
  bool owned_ = false;
};

class Event {
 public:
  // An event usable on device; timing=true allows elapsed_ms (costs a little on record).
  explicit Event(const Device& device = Device::cpu(), bool timing = false);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  // Captures the work queued on stream so far.
  void record(const Stream& stream);
  // Makes stream wait (on the GPU, not the host) until the recorded work has finished.
  void wait(const Stream& stream) const;
  // Blocks the host until the recorded work has finished.
  void synchronize() const;
  // True when the recorded work has finished (always true on the CPU).
  bool query() const;
  // Milliseconds between start's record and this one's (both timing events). On the CPU the
  // host clock is used, read at record time.
  float elapsed_ms(const Event& start) const;
  const Device& device() const { return device_; }
  cudaEvent_t handle() const { return handle_; }

 private:
  Device device_;
  cudaEvent_t handle_ = nullptr;
  double cpu_time_ms_ = 0.0;
};

// The host synchronisations of this process so far (above). Never decreases; compare two reads.
std::uint64_t host_sync_count();

}  // namespace quintet
