// ProgressThread: runs a CPU communicator's operations one at a time, in the order they were
// submitted (the CPU counterpart of a CUDA comm stream), and CpuWork, the Work of one of them.
//
// Operations normally run on the communicator's own thread, so they progress while the caller
// computes. A caller that blocks in Work::wait/synchronize takes the queue over: while it waits,
// the thread starts no new operation, and the caller runs the queued ones itself, in order, up to
// its own; if an operation is already running it polls for its end (up to 2 ms, then sleeps until
// it ends) and runs the next one itself. The caller would only wait otherwise, and this saves the
// thread wake-ups of a hand-off (tens of µs each) and runs the operations on the caller's core,
// where its buffers are in cache, as a raw MPI call would. When it leaves, the thread resumes what
// is left. Woken from idle by a new operation, the thread first leaves it a moment (50 µs by
// default) for its caller to wait for (and so run) it: an operation issued and then waited for at
// once runs on the caller's thread; one nobody waits for starts up to that much later. A bounded
// wait (Work::wait_for) runs nothing: it only sleeps, so that no blocking MPI call outlasts its
// timeout. Either way at most one operation of a communicator runs at a time, in submission order.
//
// Once an operation fails, the ones queued after it fail too (Aborted, naming the first failure),
// because the ranks of the group no longer agree on what was sent.
//
// Deadlines: Work::wait/synchronize are bounded by the communicator's timeout (RuntimeConfig::
// timeout_s; 1 s inside a destructor run by a propagating exception), Work::wait_for by its own.
// An unbounded wait that expires is a Timeout error naming the operation, and it poisons the
// queue like a failure (the operation is still in flight). A wait that sleeps checks its deadline
// and the job's failures (JobMonitor: another rank failed, ErrorCode::Remote) every 50 ms; a
// caller running an MPI call itself cannot be interrupted, so the thread watches it, and past the
// deadline (+ 1 s) ends the job through the monitor with the same Timeout message. With the job
// failed, no new operation starts. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "collectives/flight_recorder.hpp"
#include "quintet/collectives/work.hpp"
#include "quintet/core/trace.hpp"

namespace quintet::detail {

class JobMonitor;

// What the flight recorder notes of an operation (flight_recorder.hpp); seq < 0: not recorded.
struct OpInfo {
  const char* op = "operation";  // static storage
  std::int64_t seq = -1;
  DType dtype = DType::f32;
  std::int64_t count = 0;
  int peer = -1;  // peer or root in the communicator; -1: none
};

// Completion state of one operation, shared by the queue and every Work copy.
struct OpState {
  explicit OpState(std::string d, OpInfo i = {}) : description(std::move(d)), info(i) {}
  std::mutex mutex;
  std::condition_variable done_cv;
  std::atomic<bool> done{false};
  std::exception_ptr error;       // written before done is set
  const std::string description;  // "all_reduce #3 (1024 x f32) on communicator 'dp' (...)"
  const OpInfo info;
  // Set when tracing was on at submit: what the operation and its waits are recorded as.
  std::optional<trace::TraceEvent> trace;

  void finish(std::exception_ptr e);
};

// The operations of one communicator, and who may run the next one. Shared by the thread, the
// ProgressThread and every CpuWork, so that a detached thread never outlives it.
struct OpQueue {
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<OpState> state;
  };
  std::mutex mutex;
  std::condition_variable work_cv;  // the thread waits here for a task it may run, or stop
  std::condition_variable turn_cv;  // waiting callers sleep here for their op or their turn
  std::deque<Task> tasks;
  // A task is being run (by the thread or by a waiting caller). Written under the mutex; atomic so
  // that a waiting caller can poll it without taking the mutex.
  std::atomic<bool> running{false};
  int waiters = 0;   // callers inside help_until; while there is one the thread starts no task
  int sleepers = 0;  // those of them asleep on turn_cv
  std::chrono::microseconds idle_start_delay{};  // set by ProgressThread's constructor
  bool stop = false;
  bool exited = false;
  std::string first_failure;  // empty while every operation has succeeded
  // Operations the thread has begun running itself (not a waiting caller); read by tests, to
  // know that an operation is in the thread's hands (its waits then only sleep).
  std::atomic<std::uint64_t> started_by_thread{0};
  // The deadline of an unbounded wait, and the job's failure channel (null: none). Set by
  // ProgressThread's constructor.
  std::chrono::nanoseconds wait_timeout{std::chrono::seconds(300)};
  std::shared_ptr<JobMonitor> monitor;
  // The communicator's flight recorder (null: none). Set by ProgressThread's constructor.
  std::shared_ptr<FlightRecorder> flight;
  // While a waiting caller runs a task itself: its wait's deadline and what it waits for, which
  // the thread watches (max while none).
  std::chrono::steady_clock::time_point inline_deadline =
      std::chrono::steady_clock::time_point::max();
  std::string inline_what;
  std::string inline_running;  // the task it runs: `inline_what` or one queued before it
  OpInfo inline_info;          // and that task's

  enum class WaitEnd { done, timed_out, remote };

  // Runs task (on the calling thread) and finishes its state; records a failure. Call with
  // running set by this thread and the mutex not held.
  void run(Task& task);
  // After run, with the mutex held: clears running and wakes the callers asleep on turn_cv.
  void end_task();
  // Blocks until `until` is done, running the queued tasks on the calling thread, in order, while
  // no one else runs one (see the top of this file), or until deadline passes while it sleeps, or
  // the job fails. Call only from an unbounded wait: a task may be a blocking MPI call.
  WaitEnd help_until(const OpState& until, std::chrono::steady_clock::time_point deadline);
  // True when another rank of the job has failed. Cheap.
  bool job_failed() const;
  // Records a failure that was not an operation's own (a wait's timeout): the queued tasks, and
  // those submitted from now on, fail at once with Aborted.
  void poison(const std::string& why);
  // Finishes a task's state with error (null: success), telling the flight recorder.
  void finish(const Task& task, std::exception_ptr error);
  // A wait for `waited` (what it waited for) that ran past its deadline of `waited_s`: the
  // description of the operation that did not finish, who is behind (laggard.hpp) and what to do.
  // Dumps the flight recorder. May take a couple of seconds (it asks the other ranks).
  std::string timeout_message(const std::string& description, const OpInfo& waited, double waited_s,
                              const std::string& note);
  // With the mutex held: the error of a task that must not run (an earlier one failed: Aborted;
  // another rank failed: Remote), or null.
  std::exception_ptr refusal_locked(const std::string& description) const;
};

class CpuWork final : public WorkImpl {
 public:
  CpuWork(std::shared_ptr<OpState> state, std::shared_ptr<OpQueue> queue)
      : state_(std::move(state)), queue_(std::move(queue)) {}
  void wait(const Stream& stream) override;  // blocks the host: CPU work has no device queue
  bool synchronize_for(std::chrono::nanoseconds timeout) override;
  bool is_completed() override;
  std::string describe() const override { return state_->description; }

 private:
  std::shared_ptr<OpState> state_;
  std::shared_ptr<OpQueue> queue_;
};

class ProgressThread {
 public:
  // idle_start_delay: how long the thread, woken from idle by a new operation, leaves it for its
  // caller to take over before starting it (see the header comment).
  // wait_timeout: the deadline of Work::wait/synchronize; monitor: the job's failure channel
  // (may be null); flight: the communicator's flight recorder (may be null).
  explicit ProgressThread(
      std::string name, std::chrono::microseconds idle_start_delay = std::chrono::microseconds{50},
      std::chrono::nanoseconds wait_timeout = std::chrono::seconds(300),
      std::shared_ptr<JobMonitor> monitor = nullptr,
      std::shared_ptr<FlightRecorder> flight = nullptr);
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;
  // Same as stop_and_join(no timeout) if not called before.
  ~ProgressThread();

  // Queues fn; the returned Work completes when it has run (its exception is the Work's error).
  // With a trace template, the run and every wait on it are recorded (trace.hpp); with info.seq
  // >= 0, the flight recorder notes it.
  Work submit(std::string description, std::function<void()> fn,
              std::optional<trace::TraceEvent> trace = std::nullopt, OpInfo info = {});
  // Lets the queued operations finish, then joins. If the thread is still busy after timeout_s
  // (an operation whose peers never came), detaches it and returns false: the caller must then
  // leak whatever that operation uses (its MPI communicator). Never throws.
  bool stop_and_join(double timeout_s) noexcept;
  // True when a wait timed out or an operation failed (the queue is poisoned), or the job fails.
  bool broken() const;
  // How many operations the thread has begun running itself (OpQueue::started_by_thread).
  std::uint64_t started_by_thread() const {
    return queue_->started_by_thread.load(std::memory_order_acquire);
  }

 private:
  static void loop(std::shared_ptr<OpQueue> queue);

  std::string name_;
  std::shared_ptr<OpQueue> queue_;
  std::thread thread_;
};

}  // namespace quintet::detail
