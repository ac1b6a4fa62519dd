// ProgressThread: one thread that runs a CPU communicator's operations in the order they were
// submitted (the CPU counterpart of a CUDA comm stream), and CpuWork, the Work of one of them.
//
// Once an operation fails, the ones queued after it fail too (Aborted, naming the first failure),
// because the ranks of the group no longer agree on what was sent. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "quintet/collectives/work.hpp"

namespace quintet::detail {

// Completion state of one operation, shared by the thread and every Work copy.
struct OpState {
  explicit OpState(std::string d) : description(std::move(d)) {}
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
  const std::string description;  // "all_reduce #3 (1024 x f32) on communicator 'dp' (...)"

  void finish(std::exception_ptr e);
};

class CpuWork final : public WorkImpl {
 public:
  explicit CpuWork(std::shared_ptr<OpState> state) : state_(std::move(state)) {}
  void wait(const Stream& stream) override;  // blocks the host: CPU work has no device queue
  bool synchronize_for(std::chrono::nanoseconds timeout) override;
  bool is_completed() override;
  std::string describe() const override { return state_->description; }

 private:
  std::shared_ptr<OpState> state_;
};

class ProgressThread {
 public:
  explicit ProgressThread(std::string name);
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;
  // Same as stop_and_join(no timeout) if not called before.
  ~ProgressThread();

  // Queues fn; the returned Work completes when it has run (its exception is the Work's error).
  Work submit(std::string description, std::function<void()> fn);
  // Runs fn on the thread, in order, and blocks until it has run; rethrows its error.
  void run_sync(std::string description, std::function<void()> fn);
  // Lets the queued operations finish, then joins. If the thread is still busy after timeout_s
  // (an operation whose peers never came), detaches it and returns false: the caller must then
  // leak whatever that operation uses (its MPI communicator). Never throws.
  bool stop_and_join(double timeout_s) noexcept;

 private:
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<OpState> state;
  };
  // Everything the thread touches lives here, so a detached thread never outlives its data.
  struct Shared {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Task> queue;
    bool stop = false;
    bool exited = false;
    std::string first_failure;  // empty while every operation has succeeded
  };
  static void loop(std::shared_ptr<Shared> shared);

  std::string name_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace quintet::detail
