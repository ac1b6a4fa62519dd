#include "quintet/core/stream.hpp"

#include <atomic>
#include <chrono>
#include <utility>

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
double host_now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::atomic<std::uint64_t> host_syncs{0};
// This thread's OneHostSync nesting, and whether its outermost one has counted.
thread_local int one_sync_depth = 0;
thread_local bool one_sync_counted = false;
}  // namespace

namespace detail {

void note_host_sync() {
  if (one_sync_depth > 0) {
    if (one_sync_counted) return;
    one_sync_counted = true;
  }
  host_syncs.fetch_add(1, std::memory_order_relaxed);
}

OneHostSync::OneHostSync() {
  if (one_sync_depth++ == 0) one_sync_counted = false;
}

OneHostSync::~OneHostSync() { --one_sync_depth; }

}  // namespace detail

std::uint64_t host_sync_count() { return host_syncs.load(std::memory_order_relaxed); }

Stream Stream::create(const Device& device, StreamPriority priority) {
  if (device.is_cpu()) return Stream();
  DeviceGuard guard(device);
#if QUINTET_HAS_CUDA
  int least = 0, greatest = 0;
  QUINTET_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t handle = nullptr;
  QUINTET_CUDA_CHECK(cudaStreamCreateWithPriority(
      &handle, cudaStreamNonBlocking, priority == StreamPriority::high ? greatest : least));
  return Stream(device, handle, true);
#else
  (void)priority;
  return Stream();
#endif
}

Stream Stream::default_stream(const Device& device) {
  check_device(device);
  return Stream(device, nullptr, false);
}

Stream Stream::borrow(const Device& device, cudaStream_t handle) {
  check_device(device);
  return Stream(device, handle, false);
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)),
      owned_(std::exchange(other.owned_, false)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

Stream::~Stream() {
#if QUINTET_HAS_CUDA
  if (owned_ && handle_ != nullptr) (void)cudaStreamDestroy(handle_);
#endif
}

void Stream::synchronize() const {
  detail::note_host_sync();
#if QUINTET_HAS_CUDA
  if (device_.is_cuda()) {
    DeviceGuard guard(device_);
    QUINTET_CUDA_CHECK(cudaStreamSynchronize(handle_));
  }
#endif
}

Event::Event(const Device& device, bool timing) : device_(device) {
#if QUINTET_HAS_CUDA
  if (device.is_cuda()) {
    DeviceGuard guard(device);
    QUINTET_CUDA_CHECK(
        cudaEventCreateWithFlags(&handle_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
#else
  (void)timing;
  check_device(device);
#endif
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)),
      cpu_time_ms_(other.cpu_time_ms_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
    cpu_time_ms_ = other.cpu_time_ms_;
  }
  return *this;
}

Event::~Event() {
#if QUINTET_HAS_CUDA
  if (handle_ != nullptr) (void)cudaEventDestroy(handle_);
#endif
}

void Event::record(const Stream& stream) {
  cpu_time_ms_ = host_now_ms();
#if QUINTET_HAS_CUDA
  if (handle_ != nullptr) {
    QUINTET_CHECK(!stream.device().is_cuda() || stream.device() == device_,
                  "Event::record: event of {} recorded on a stream of {}", device_.str(),
                  stream.device().str());
    DeviceGuard guard(device_);
    QUINTET_CUDA_CHECK(cudaEventRecord(handle_, detail::cuda_stream_of(stream)));
  }
#else
  (void)stream;
#endif
}

void Event::wait(const Stream& stream) const {
#if QUINTET_HAS_CUDA
  if (handle_ != nullptr && stream.device().is_cuda()) {
    DeviceGuard guard(stream.device());
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(stream.handle(), handle_, 0));
  } else if (handle_ != nullptr) {
    synchronize();  // a CPU "stream" is the host: waiting means blocking
  }
#else
  (void)stream;
#endif
}

void Event::synchronize() const {
  detail::note_host_sync();
#if QUINTET_HAS_CUDA
  if (handle_ != nullptr) QUINTET_CUDA_CHECK(cudaEventSynchronize(handle_));
#endif
}

bool Event::query() const {
#if QUINTET_HAS_CUDA
  if (handle_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(handle_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  QUINTET_CUDA_CHECK(status);
#endif
  return true;
}

float Event::elapsed_ms(const Event& start) const {
#if QUINTET_HAS_CUDA
  if (handle_ != nullptr && start.handle_ != nullptr) {
    float ms = 0.0f;
    QUINTET_CUDA_CHECK(cudaEventElapsedTime(&ms, start.handle_, handle_));
    return ms;
  }
#endif
  return static_cast<float>(cpu_time_ms_ - start.cpu_time_ms_);
}

}  // namespace quintet
