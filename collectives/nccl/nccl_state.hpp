// Private to the NCCL backend: the state an NcclCommunicator shares with the Works it hands out,
// and the Work of one NCCL operation.
//
// Lifetimes: the communicator and each of its Works hold a shared_ptr<NcclState>, so a Work kept
// after its communicator is gone still has its event and the comm stream. The communicator's
// destructor finalizes (or aborts) the NCCL comm and waits for the comm stream; afterwards every
// operation has finished, and such a Work only reports completion.
//
// Memory safety with the caching allocator: tensors are allocated on the caller's stream (their
// pool), but an operation reads and writes them on the comm stream. If the caller dropped a
// tensor while the operation still ran, the allocator could hand its block to the next kernel on
// the caller's stream while NCCL still uses it. So every NcclWork holds the storages of its
// tensors, and the communicator keeps every Work in its watchdog (collectives/watchdog.hpp) until
// the host has seen its completion event fire; only then can the blocks go back to their pool.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/flight_recorder.hpp"
#include "collectives/nccl/nccl_backend.hpp"
#include "collectives/watchdog.hpp"
#include "quintet/collectives/nccl.hpp"
#include "quintet/collectives/work.hpp"
#include "quintet/core/device.hpp"
#include "quintet/core/dtype.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/trace.hpp"

namespace quintet::detail {

class NcclWork;

// Polls ncclCommGetAsyncError(comm) until it is no longer ncclInProgress or timeout_s passes
// (then returns ncclInProgress). Sleeps between polls; never throws.
ncclResult_t nccl_wait_not_in_progress(ncclComm_t comm, double timeout_s);

// Polls cudaStreamQuery(stream) until the stream is idle (true) or timeout_s passes (false); the
// caller has made the stream's device current. Never throws, never blocks beyond timeout_s.
bool stream_idle_within(cudaStream_t stream, double timeout_s) noexcept;

// ncclCommFinalize, waited for up to timeout_s, then ncclCommDestroy; ncclCommAbort when that
// fails or times out. Returns false when it had to abort. Never throws.
bool nccl_destroy(ncclComm_t comm, double timeout_s) noexcept;

// Makes device current for the scope, ignoring every CUDA error: for destructors, which may run
// while the CUDA runtime is shutting down and must not throw.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(const Device& device) noexcept;
  ~QuietDeviceGuard();
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class NcclState {
 public:
  // Takes ownership of both comms; creates the high-priority comm stream on device.
  //   comm: blocking NCCL comm that runs the operations. Blocking on purpose: NCCL runs every
  //     operation of a non-blocking comm through a freshly created thread (ncclGroupEnd returns
  //     ncclInProgress), which costs tens of microseconds per operation.
  //   control: non-blocking comm of the same ranks, used only to split, so that a rank that never
  //     calls split is a timeout, not a hang (it never moves data, so NCCL never connects it).
  //   options: the timeout, the flight recorder's registry (and world ranks: then this state
  //     records the operations, recorder()), and what ends the process after a watchdog expiry.
  NcclState(ncclComm_t comm, ncclComm_t control, Device device, int rank, int size,
            std::string name, NcclOptions options);
  // Waits up to timeout_s for the comm stream (never longer) and frees events; the comm was shut
  // down (or aborted) before.
  ~NcclState();
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  ncclComm_t comm() const { return comm_; }
  ncclComm_t control() const { return control_; }
  const Stream& stream() const { return stream_; }
  const Device& device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  double timeout_s() const { return options_.timeout_s; }
  // The options of a split whose members (ranks of this communicator, in the split's rank order)
  // are given: these, with the members' world ranks when this communicator knows its own
  // (split_world_ranks); without world ranks (recording nothing) otherwise.
  NcclOptions split_options(const std::vector<int>& members) const;
  // Where a split without members finds them (NcclOptions::split_exchange); null when nowhere.
  const std::shared_ptr<SplitExchange>& split_exchange() const { return options_.split_exchange; }
  // This communicator's flight recorder; null when it records nothing.
  const std::shared_ptr<FlightRecorder>& recorder() const { return recorder_; }
  // "communicator 'dp' (nccl, rank 1 of 4)"
  std::string describe() const;

  // A completion event (disable-timing) from the pool; give it back with release_event.
  cudaEvent_t acquire_event();
  void release_event(cudaEvent_t event) noexcept;

  // ncclCommGetAsyncError of the comm (ncclSuccess once shut down). Thread-safe, never throws.
  ncclResult_t async_error() noexcept;
  // After a non-blocking call returned ncclInProgress: waits until the operation is launched,
  // bounded by timeout_s(). Throws (and aborts) on error or timeout.
  void wait_launched(std::string_view what);
  // Throws if the communicator was aborted; `what` names the operation being issued.
  void check_usable(std::string_view what) const;

  // A host thread blocked in a wait of this communicator's Works, for its scope: the watchdog
  // leaves an expired operation to it (its own deadline makes it a Timeout the program can catch).
  class Waiter {
   public:
    explicit Waiter(NcclState& state) noexcept : state_(state) { ++state_.waiters_; }
    ~Waiter() { --state_.waiters_; }
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;

   private:
    NcclState& state_;
  };
  // Writes this process's flight recorder dump for a failure (FlightRegistry::dump_on_failure):
  // its path, or "" when there is no registry or a failure was dumped already. Never throws.
  std::string dump_on_failure(std::string_view reason) noexcept;
  // Who is behind on this communicator's first operation not completed (op, seq, peer: the one
  // waited for), asked over the options' progress channel (laggard.hpp's name_laggards, at most
  // kLaggardAnswerWait); "" without a recorder or a channel, or when nobody is known to be behind.
  // waited_s: how long this rank waited, for the message. Never throws.
  std::string name_laggards(std::string_view op, std::int64_t seq, int peer,
                            double waited_s) noexcept;
  // The watchdog's expiry (Watchdog::Expired) for `work`, pending for `pending_s`. Returns true
  // when the communicator was aborted already (the wait that aborted it reports the error), false
  // while a thread waits for one of its Works (ask again). Otherwise prints "error [Timeout]:
  // <what> did not complete ..." naming the operation, the communicator and the rank that is behind
  // when the other ranks' answers tell (name_laggards; watchdog.hpp's expiry_message), dumps the
  // flight recorder (its path ends the message), aborts the communicator (waiting at most
  // kAbortWait for ncclCommAbort) and ends the process: the options' end_process, then
  // std::_Exit(1) should that return. Never throws.
  bool expired(const NcclWork& work, double pending_s) noexcept;
  // How long expired() lets ncclCommAbort run before it ends the process anyway.
  static constexpr std::chrono::seconds kAbortWait{5};

  // Aborts the NCCL comm (ncclCommAbort) once; later operations and waits throw Aborted with
  // reason. Thread-safe, never throws.
  void abort(const std::string& reason) noexcept;
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;
  // Throws the error of NCCL result r for `what`, with NCCL's last error text; aborts the comm
  // first unless r says the call was misused (a communication failure leaves it unusable).
  [[noreturn]] void throw_failure(ncclResult_t r, std::string_view what);
  // Waits up to timeout_s() for the comm stream to drain, then finalizes and destroys both comms
  // (nccl_destroy); aborts them instead when operations are still running or fail. Idempotent,
  // never throws.
  void shutdown() noexcept;

 private:
  mutable std::mutex mutex_;  // guards the comms against abort/shutdown, events_, reason_
  ncclComm_t comm_;
  ncclComm_t control_;
  Device device_;
  int rank_;
  int size_;
  std::string name_;
  NcclOptions options_;
  std::shared_ptr<FlightRecorder> recorder_;
  std::atomic<int> waiters_{0};
  Stream stream_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<cudaEvent_t> all_events_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
};

// The Work of one NCCL operation: an event recorded on the comm stream after it, and the
// storages of its tensors, kept alive until it completes.
class NcclWork final : public WorkImpl, public Watchdog::Op {
 public:
  // op: a static name; peer: the peer or root (a rank of the communicator), -1: none.
  NcclWork(std::shared_ptr<NcclState> state, const char* op, std::uint64_t seq, int peer,
           cudaEvent_t done)
      : state_(std::move(state)), op_(op), seq_(seq), peer_(peer), done_(done) {}
  ~NcclWork() override;

  // Keeps storage alive until this Work is destroyed (the communicator holds it until done).
  void keep(std::shared_ptr<void> storage);
  // What the waits on this operation are recorded as when tracing (trace.hpp).
  void set_trace(trace::TraceEvent e) { trace_ = std::move(e); }

  // cudaStreamWaitEvent: the host does not block. A CPU stream means the GPU's default stream,
  // as for the operations. Throws if the communicator failed.
  void wait(const Stream& stream) override;
  // Polls the event and ncclCommGetAsyncError; on an NCCL error or on timeout the communicator
  // is aborted (a timed-out collective would otherwise hang the next one).
  bool synchronize_for(std::chrono::nanoseconds timeout) override;
  bool is_completed() override;
  std::string describe() const override;
  // Who is behind on this operation's communicator (NcclState::name_laggards). Never throws.
  std::string name_laggards(double waited_s) const noexcept {
    return state_->name_laggards(op_, static_cast<std::int64_t>(seq_), peer_, waited_s);
  }

  // True once the completion event has fired; never throws (for the watchdog).
  bool poll() noexcept override;
  // Dropped by the watchdog, in issue order: records the completion in the flight recorder.
  void retired() noexcept override;

 private:
  // cudaEventQuery of the completion event, remembering success.
  cudaError_t query() noexcept;
  void throw_if_failed();

  std::shared_ptr<NcclState> state_;
  const char* op_;
  std::uint64_t seq_;
  int peer_;
  cudaEvent_t done_;
  std::optional<trace::TraceEvent> trace_;
  std::atomic<bool> completed_{false};
  std::shared_ptr<void> keep_[2];
  std::vector<std::shared_ptr<void>> keep_more_;
};

}  // namespace quintet::detail
