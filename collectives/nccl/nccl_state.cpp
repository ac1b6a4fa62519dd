#include "collectives/nccl/nccl_state.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "quintet/core/device_guard.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

using Clock = std::chrono::steady_clock;

// Spin briefly (operations usually finish within microseconds), then sleep to free the core.
void backoff(int& polls) {
  if (++polls < 200) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 2000 ? 20 : 200));
  }
}

// Misuse leaves the communicator usable; anything else means it can no longer be trusted.
bool is_usage_error(ncclResult_t r) { return r == ncclInvalidArgument || r == ncclInvalidUsage; }

}  // namespace

ncclResult_t nccl_wait_not_in_progress(ncclComm_t comm, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  int polls = 0;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    backoff(polls);
  }
}

bool stream_idle_within(cudaStream_t stream, double timeout_s) noexcept {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  cudaError_t status = cudaStreamQuery(stream);
  for (int polls = 0; status == cudaErrorNotReady && Clock::now() < deadline;) {
    backoff(polls);
    status = cudaStreamQuery(stream);
  }
  (void)cudaGetLastError();
  return status == cudaSuccess;
}

bool nccl_destroy(ncclComm_t comm, double timeout_s) noexcept {
  ncclResult_t r = ncclCommFinalize(comm);
  if (r == ncclSuccess || r == ncclInProgress) r = nccl_wait_not_in_progress(comm, timeout_s);
  if (r == ncclSuccess) {
    r = ncclCommDestroy(comm);
    if (r == ncclInProgress) r = ncclSuccess;  // finalized: the rest is freed locally
  }
  if (r != ncclSuccess) (void)ncclCommAbort(comm);
  return r == ncclSuccess;
}

// ---- NcclState ----

NcclState::NcclState(ncclComm_t comm, ncclComm_t control, Device device, int rank, int size,
                     std::string name, NcclOptions options)
    : comm_(comm),
      control_(control),
      device_(device),
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      options_(std::move(options)),
      stream_(Stream::create(device, StreamPriority::high)) {
  if (options_.flight && !options_.world_ranks.empty()) {
    // Named apart from an MPI communicator of the same name and ranks (a World has two 'world's).
    recorder_ = std::make_shared<FlightRecorder>(name_ + " (nccl)", rank_, options_.world_ranks,
                                                 options_.flight->capacity());
    options_.flight->add(recorder_);
  }
}

NcclOptions NcclState::split_options(const std::vector<int>& members) const {
  NcclOptions o = options_;
  o.world_ranks = split_world_ranks(options_.world_ranks, members);
  o.split_exchange.reset();
  return o;
}

QuietDeviceGuard::QuietDeviceGuard(const Device& device) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != device.index() &&
      cudaSetDevice(device.index()) == cudaSuccess) {
    previous_ = current;
  }
  (void)cudaGetLastError();
}

QuietDeviceGuard::~QuietDeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
  (void)cudaGetLastError();
}

NcclState::~NcclState() {
  // Never shut down: a failed construction.
  if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  if (control_ != nullptr) (void)ncclCommAbort(control_);
  QuietDeviceGuard guard(device_);
  // Bounded: a comm stream held back forever (by a caller's stream it waits on) must not hang the
  // destructor. Destroying events and the stream while work is queued is safe: CUDA releases them
  // once that work completes.
  (void)stream_idle_within(stream_.handle(), timeout_s());
  if (recorder_) recorder_->retire();  // already, unless the communicator was never made
  for (cudaEvent_t e : all_events_) (void)cudaEventDestroy(e);
  (void)cudaGetLastError();
}

std::string NcclState::describe() const {
  return fmt::format("communicator '{}' (nccl, rank {} of {}, {})", name_, rank_, size_,
                     device_.str());
}

cudaEvent_t NcclState::acquire_event() {
  {
    std::lock_guard lock(mutex_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::lock_guard lock(mutex_);
  all_events_.push_back(e);
  return e;
}

void NcclState::release_event(cudaEvent_t event) noexcept {
  std::lock_guard lock(mutex_);
  free_events_.push_back(event);
}

ncclResult_t NcclState::async_error() noexcept {
  std::lock_guard lock(mutex_);
  if (comm_ == nullptr) return ncclSuccess;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  return r != ncclSuccess ? r : state;
}

void NcclState::wait_launched(std::string_view what) {
  ncclComm_t comm = comm_;
  const ncclResult_t r = nccl_wait_not_in_progress(comm, timeout_s());
  if (r == ncclSuccess) return;
  if (r == ncclInProgress) {
    const std::string message = fmt::format(
        "{} on {} was still being launched after {} s; a rank of the group may be missing or "
        "stuck; the communicator is aborted",
        what, describe(), timeout_s());
    abort(message);
    QUINTET_THROW(Timeout, "{}", message);
  }
  throw_failure(r, what);
}

void NcclState::check_usable(std::string_view what) const {
  if (!aborted()) return;
  QUINTET_THROW(Aborted, "{} on {}: the communicator was aborted earlier ({}); create a new one",
                what, describe(), abort_reason());
}

void NcclState::abort(const std::string& reason) noexcept {
  std::lock_guard lock(mutex_);
  if (aborted_.load(std::memory_order_relaxed)) return;
  reason_ = reason;
  if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  if (control_ != nullptr) (void)ncclCommAbort(control_);
  comm_ = nullptr;
  control_ = nullptr;
  aborted_.store(true, std::memory_order_release);
}

std::string NcclState::abort_reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

void NcclState::throw_failure(ncclResult_t r, std::string_view what) {
  const char* last = ncclGetLastError(nullptr);
  const std::string message =
      fmt::format("{} on {} failed: {} (NCCL code {}){}{}", what, describe(), ncclGetErrorString(r),
                  static_cast<int>(r), last && *last ? ": " : "", last ? last : "");
  if (is_usage_error(r)) QUINTET_THROW(Nccl, "{}", message);
  abort(message);
  if (r == ncclRemoteError) {
    QUINTET_THROW(Remote, "{}; another rank failed, the communicator is aborted", message);
  }
  QUINTET_THROW(Nccl, "{}; the communicator is aborted", message);
}

void NcclState::shutdown() noexcept {
  std::lock_guard lock(mutex_);
  if (comm_ == nullptr) return;
  // The operations comm is blocking, so its ncclCommFinalize would wait for unfinished operations
  // without bound: wait for them here, bounded, and abort if a peer never shows up.
  bool clean = stream_idle_within(stream_.handle(), timeout_s());
  if (clean) {
    clean = nccl_destroy(comm_, timeout_s());
  } else {
    (void)ncclCommAbort(comm_);
  }
  if (control_ != nullptr && !nccl_destroy(control_, timeout_s())) clean = false;
  if (!clean) {
    reason_ = "destroyed while operations were unfinished or had failed";
    aborted_.store(true, std::memory_order_release);
  }
  comm_ = nullptr;
  control_ = nullptr;
}

std::string NcclState::dump_on_failure(std::string_view reason) noexcept {
  return options_.flight ? options_.flight->dump_on_failure(reason) : std::string();
}

std::string NcclState::name_laggards(std::string_view op, std::int64_t seq, int peer,
                                     double waited_s) noexcept {
  if (!recorder_) return {};
  return detail::name_laggards(*recorder_, op, seq, peer, options_.progress, waited_s);
}

bool NcclState::expired(const NcclWork& work, double pending_s) noexcept {
  if (aborted()) return true;  // a wait timed out first and aborted: its caller has the error
  if (waiters_.load() > 0) return false;  // a waiting thread's own deadline reports it
  try {
    // Asked first (bounded): the other ranks' counters say who never issued the operation.
    const std::string laggards = work.name_laggards(timeout_s());
    std::string message = expiry_message(work.describe(), timeout_s(), pending_s, laggards);
    const std::string dump = dump_on_failure(message);
    if (!dump.empty()) message += fmt::format(" (flight recorder: {})", dump);
    const std::string error = "error [Timeout]: " + message;
    log::error("{}", error);  // first: an abort that hangs must not hide it
    // ncclCommAbort may wait for work queued on streams the held-back operation depends on: it
    // runs on a thread of its own, and the process ends after kAbortWait whether it returned or
    // not (a hang is what is being ended).
    struct Done {
      std::mutex mutex;
      std::condition_variable cv;
      bool done = false;
    };
    auto done = std::make_shared<Done>();
    std::thread([this, done, message] {
      {
        QuietDeviceGuard guard(device_);
        abort(message);
      }
      std::lock_guard lock(done->mutex);
      done->done = true;
      done->cv.notify_all();
    }).detach();
    std::unique_lock lock(done->mutex);
    if (!done->cv.wait_for(lock, kAbortWait, [&] { return done->done; })) {
      log::error("{}: ncclCommAbort did not return within {} s; the process ends without it",
                 describe(), std::chrono::duration<double>(kAbortWait).count());
    }
    lock.unlock();
    if (options_.end_process) options_.end_process(error);
  } catch (...) {
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

// ---- NcclWork ----

NcclWork::~NcclWork() { state_->release_event(done_); }

void NcclWork::keep(std::shared_ptr<void> storage) {
  if (!storage) return;
  for (auto& slot : keep_) {
    if (!slot) {
      slot = std::move(storage);
      return;
    }
  }
  keep_more_.push_back(std::move(storage));
}

cudaError_t NcclWork::query() noexcept {
  if (completed_.load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t status = cudaEventQuery(done_);
  if (status == cudaSuccess) {
    completed_.store(true, std::memory_order_release);
  } else if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not a failure; keep it out of later error checks
  }
  return status;
}

bool NcclWork::poll() noexcept { return query() == cudaSuccess; }

void NcclWork::retired() noexcept {
  if (state_->recorder()) state_->recorder()->completed(static_cast<std::int64_t>(seq_), true);
}

void NcclWork::throw_if_failed() {
  if (state_->aborted() && !completed_.load(std::memory_order_acquire)) {
    QUINTET_THROW(Aborted, "{} did not complete: the communicator was aborted ({})", describe(),
                  state_->abort_reason());
  }
  const ncclResult_t r = state_->async_error();
  if (r != ncclSuccess && r != ncclInProgress) state_->throw_failure(r, describe());
}

void NcclWork::wait(const Stream& stream) {
  if (!completed_.load(std::memory_order_acquire)) {
    throw_if_failed();
    const bool cuda_stream = stream.device().is_cuda();
    DeviceGuard guard(cuda_stream ? stream.device() : state_->device());
    // Traced: the waiting stream's stall, between an event before the wait and one after it.
    int slot = -1;
    if (trace_ && cuda_stream && trace::waits_traced()) {
      trace::TraceEvent e = *trace_;
      e.wait = true;
      e.name = "wait " + e.name;
      e.step = -1;  // the step it happens in, not the one that issued it
      e.lane = 0;
      slot = trace::begin_gpu(std::move(e), stream);
    }
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(cuda_stream ? stream.handle() : nullptr, done_, 0));
    trace::end_gpu(slot, stream);
  }
}

bool NcclWork::synchronize_for(std::chrono::nanoseconds timeout) {
  // Work::synchronize passes nanoseconds::max(): the communicator's own deadline (timeout_s),
  // past which it is a Timeout error rather than false.
  const NcclState::Waiter waiter(*state_);  // the watchdog leaves this operation to this wait
  const bool unbounded = timeout == std::chrono::nanoseconds::max();
  if (unbounded) {
    timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(state_->timeout_s()));
  }
  const bool bounded = timeout < std::chrono::hours(24 * 365);
  const auto deadline = bounded ? Clock::now() + timeout : Clock::time_point::max();
  int polls = 0;
  // Traced: the host's wait, on the host clock.
  struct WaitRecord {
    const std::optional<trace::TraceEvent>& trace;
    bool on;
    trace::Clock::time_point t0 = trace::Clock::now();
    ~WaitRecord() {
      if (!on || !trace::enabled()) return;
      trace::TraceEvent e = *trace;
      e.wait = true;
      e.name = "wait " + e.name;
      e.step = -1;  // the step it happens in, not the one that issued it
      e.start_us = trace::to_us(t0);
      e.end_us = trace::to_us(trace::Clock::now());
      trace::record_host(std::move(e));
    }
  };
  const WaitRecord record{trace_, trace_.has_value() && trace::waits_traced() &&
                                      !completed_.load(std::memory_order_acquire)};
  for (;;) {
    const cudaError_t status = query();
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) QUINTET_CUDA_CHECK(status);
    throw_if_failed();
    if (bounded && Clock::now() >= deadline) {
      const std::string what =
          fmt::format("{} timed out after {} ms", describe(),
                      std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
      // Before the abort, which marks nothing in the recorders: who is behind (bounded).
      const std::string laggards =
          unbounded ? name_laggards(std::chrono::duration<double>(timeout).count()) : std::string();
      state_->abort(what);
      if (unbounded) {
        const std::string dump = state_->dump_on_failure(what);
        QUINTET_THROW(Timeout,
                      "{} (the communicator's timeout, --timeout-s): {}; the communicator was "
                      "aborted{}",
                      what,
                      laggards.empty() ? "a rank of the group may not have issued the matching "
                                         "operation, or may have failed"
                                       : laggards,
                      dump.empty() ? "" : fmt::format(" (flight recorder: {})", dump));
      }
      return false;
    }
    backoff(polls);
  }
}

bool NcclWork::is_completed() { return poll() || state_->aborted(); }

std::string NcclWork::describe() const {
  return fmt::format("{} #{} on {}", op_, seq_, state_->describe());
}

}  // namespace quintet::detail

namespace quintet {

ncclDataType_t nccl_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    case DType::u16:
      return ncclUint8;  // moved as two bytes per element; never reduced
  }
  return ncclUint8;
}

}  // namespace quintet
