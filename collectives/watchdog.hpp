// Watchdog: the operations a communicator has in flight, in issue order, and a thread that notices
// when the oldest has not completed within the deadline although nobody waits for it (the
// counterpart of PyTorch's ProcessGroupNCCL watchdog). The NCCL backend keeps its Works here until
// the host has seen them complete (their tensors must live until then) and, on expiry, dumps the
// flight recorder, aborts the communicator and ends the process (nccl_communicator.cpp).
//
// The issuing thread calls add() (and reap()); the watchdog's thread polls the oldest operation
// every `period`, drops those that completed (calling retired() on each, in issue order), and
// calls `expired` for the oldest one still pending `timeout` after it was added. expired returns
// true when it has dealt with the operation (the watchdog then stays quiet for good), false to be
// asked again one period later (e.g. while a caller waits for it under its own deadline). Between
// the deadline and the call at most one period passes. Thread-safe; its destructor stops and
// joins the thread, never throws.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace quintet::detail {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // One operation in flight.
  class Op {
   public:
    virtual ~Op() = default;
    // True once the operation has completed. Called by any thread (the watchdog's with its lock
    // held); never throws.
    virtual bool poll() noexcept = 0;
    // Called once, in issue order, when the watchdog drops the completed operation.
    virtual void retired() noexcept {}
    // "all_reduce #3 on communicator 'dp' (...)", for messages.
    virtual std::string describe() const = 0;
  };
  // Called on the watchdog's thread, without its lock held; see the header comment.
  using Expired = std::function<bool(Op& op, std::chrono::nanoseconds pending)>;

  // Starts the thread. timeout and period must be positive (InvalidArgument otherwise).
  Watchdog(std::string name, std::chrono::nanoseconds timeout, std::chrono::nanoseconds period,
           Expired expired);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The period a communicator with this timeout polls at: a tenth of it, within [10 ms, 1 s].
  static std::chrono::nanoseconds period_for(std::chrono::nanoseconds timeout);

  // Watches op from now on (after the ones added before), and drops those that completed.
  void add(std::shared_ptr<Op> op);
  // Drops the completed operations at the front. Never throws.
  void reap() noexcept;
  // How many operations are still held.
  std::size_t pending() const;
  // Stops the thread (joined; expired is not called afterwards) and hands back the operations
  // still pending, oldest first. Idempotent; add() is not allowed afterwards.
  std::deque<std::shared_ptr<Op>> stop() noexcept;

  // ---- implementation details ----
 private:
  struct Entry {
    std::shared_ptr<Op> op;
    Clock::time_point added;
  };
  void loop();
  void reap_locked() noexcept;

  const std::string name_;
  const std::chrono::nanoseconds timeout_;
  const std::chrono::nanoseconds period_;
  const Expired expired_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Entry> ops_;
  bool stop_ = false;
  bool quiet_ = false;  // expired dealt with an operation: nothing more to do
  std::thread thread_;
};

// The message of an operation the watchdog found expired, which the NCCL backend prints before it
// aborts the communicator and ends the process: "<what> did not complete within <timeout_s> s of
// being issued (<pending_s> s), and no thread waited for it (...): <laggards>; the watchdog aborts
// the communicator and ends the process". laggards: who is behind (laggard.hpp's name_laggards);
// when "", what may have happened instead.
std::string expiry_message(const std::string& what, double timeout_s, double pending_s,
                           const std::string& laggards);

}  // namespace quintet::detail
