#include "collectives/mpi/progress_thread.hpp"

#include <chrono>
#include <thread>

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

// How long a waiting caller that cannot take the next task (another thread is running one) polls
// for that task's end before sleeping: the end of a short operation is then seen at once instead
// of after a wake-up (tens of µs on a loaded machine), as the raw MPI call's own polling would.
constexpr std::chrono::microseconds kSpinBeforeSleep{2000};

// Polls done() until it is true or `budget` has passed; returns its last value. Yielding keeps an
// oversubscribed core usable by the ranks.
template <class Done>
bool spin_for(std::chrono::microseconds budget, Done done) {
  const auto until = std::chrono::steady_clock::now() + budget;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

void OpState::finish(std::exception_ptr e) {
  {
    std::lock_guard lock(mutex);
    error = std::move(e);
    done.store(true, std::memory_order_release);
  }
  done_cv.notify_all();
}

void OpQueue::run(Task& task) {
  std::string failure;
  {
    std::lock_guard lock(mutex);
    failure = first_failure;
  }
  std::exception_ptr error;
  if (!failure.empty()) {
    try {
      QUINTET_THROW(Aborted,
                    "{} was not run: an earlier operation on this communicator failed ({}); "
                    "create a new communicator after handling that error",
                    task.state->description, failure);
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    const bool traced = task.state->trace.has_value() && trace::enabled();
    const auto t0 = traced ? trace::Clock::now() : trace::Clock::time_point{};
    try {
      task.fn();
      if (traced) {  // the operation, timed on the thread that ran it
        trace::TraceEvent e = *task.state->trace;
        e.start_us = trace::to_us(t0);
        e.end_us = trace::to_us(trace::Clock::now());
        trace::record_host(std::move(e));
      }
    } catch (const std::exception& e) {
      error = std::current_exception();
      std::lock_guard lock(mutex);
      first_failure = task.state->description + ": " + e.what();
    } catch (...) {
      error = std::current_exception();
      std::lock_guard lock(mutex);
      first_failure = task.state->description + ": unknown exception";
    }
  }
  task.fn = nullptr;  // release the tensors before signalling completion
  task.state->finish(error);
}

void OpQueue::end_task() {
  running.store(false, std::memory_order_release);
  if (sleepers > 0) turn_cv.notify_all();
}

void OpQueue::help_until(const OpState& until) {
  auto is_done = [&] { return until.done.load(std::memory_order_acquire); };
  if (is_done()) return;
  std::unique_lock lock(mutex);
  ++waiters;  // from here on the thread starts no task: this caller runs them
  while (!is_done()) {
    if (!running.load(std::memory_order_relaxed) && !tasks.empty()) {
      Task task = std::move(tasks.front());
      tasks.pop_front();
      running.store(true, std::memory_order_relaxed);
      lock.unlock();
      run(task);
      lock.lock();
      end_task();
      continue;
    }
    // Someone else runs a task, ours or one before it: the thread (it had started before this
    // caller came) or another waiting caller. Poll for its end, then sleep until a task ends.
    lock.unlock();
    const bool ended = spin_for(
        kSpinBeforeSleep, [&] { return is_done() || !running.load(std::memory_order_acquire); });
    lock.lock();
    if (!ended) {
      ++sleepers;
      turn_cv.wait(lock, [&] {
        return is_done() || (!running.load(std::memory_order_relaxed) && !tasks.empty());
      });
      --sleepers;
    }
  }
  --waiters;
  // Hand what is left (operations queued after ours, or a pending stop) back to the thread, which
  // waits while there are waiters. Another waiter still here takes over instead.
  const bool hand_back = waiters == 0 && (stop || !tasks.empty());
  lock.unlock();
  if (hand_back) work_cv.notify_all();
}

void CpuWork::wait(const Stream&) { synchronize_for(std::chrono::nanoseconds::max()); }

bool CpuWork::synchronize_for(std::chrono::nanoseconds timeout) {
  // A wait on a traced operation is recorded as the caller's wait (its exposure), including the
  // time it spent running queued operations itself.
  struct WaitRecord {
    const OpState& state;
    bool on;
    trace::Clock::time_point t0;
    ~WaitRecord() {
      if (!on || !trace::enabled()) return;
      trace::TraceEvent e = *state.trace;
      e.wait = true;
      e.name = "wait " + e.name;
      e.step = -1;  // the step it happens in, not the one that issued it
      e.lane = 0;
      e.start_us = trace::to_us(t0);
      e.end_us = trace::to_us(trace::Clock::now());
      trace::record_host(std::move(e));
    }
  };
  const bool on = state_->trace.has_value() && trace::waits_traced() &&
                  !state_->done.load(std::memory_order_acquire);
  const WaitRecord record{*state_, on, on ? trace::Clock::now() : trace::Clock::time_point{}};
  if (timeout == std::chrono::nanoseconds::max()) {
    queue_->help_until(*state_);
  } else {
    // A bounded wait must not enter a blocking MPI call that could outlast its timeout: it only
    // sleeps, and the thread (or an unbounded waiter) runs the operation.
    std::unique_lock lock(state_->mutex);
    if (!state_->done_cv.wait_for(lock, timeout,
                                  [&] { return state_->done.load(std::memory_order_acquire); })) {
      return false;
    }
  }
  std::lock_guard lock(state_->mutex);
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

bool CpuWork::is_completed() { return state_->done.load(std::memory_order_acquire); }

ProgressThread::ProgressThread(std::string name, std::chrono::microseconds idle_start_delay)
    : name_(std::move(name)), queue_(std::make_shared<OpQueue>()) {
  queue_->idle_start_delay = idle_start_delay;
  thread_ = std::thread(&ProgressThread::loop, queue_);
}

ProgressThread::~ProgressThread() {
  if (thread_.joinable()) stop_and_join(-1.0);
}

Work ProgressThread::submit(std::string description, std::function<void()> fn,
                            std::optional<trace::TraceEvent> trace) {
  auto state = std::make_shared<OpState>(std::move(description));
  state->trace = std::move(trace);
  bool wake = false;
  {
    std::lock_guard lock(queue_->mutex);
    QUINTET_CHECK(!queue_->stop, "{} submitted to communicator '{}' after it was shut down",
                  state->description, name_);
    queue_->tasks.push_back(OpQueue::Task{std::move(fn), state});
    // Only the first task of an idle queue needs a wake-up: a busy runner takes the next itself,
    // and while a caller waits the thread would not take it.
    wake = !queue_->running.load(std::memory_order_relaxed) && queue_->waiters == 0 &&
           queue_->tasks.size() == 1;
  }
  if (wake) queue_->work_cv.notify_all();
  return Work(std::make_shared<CpuWork>(std::move(state), queue_));
}

void ProgressThread::run_sync(std::string description, std::function<void()> fn) {
  submit(std::move(description), std::move(fn)).synchronize();
}

void ProgressThread::loop(std::shared_ptr<OpQueue> q) {
  std::unique_lock lock(q->mutex);
  // While a caller waits in help_until, it runs the tasks: starting one here would only make it
  // wait for this thread, and run the operation on a core whose cache does not hold its buffers.
  auto may_start = [&] {
    return !q->running.load(std::memory_order_relaxed) &&
           ((q->stop && q->tasks.empty()) || (q->waiters == 0 && !q->tasks.empty()));
  };
  bool busy = false;  // what this thread did last was run a task or pause: a burst goes on
  for (;;) {
    if (!may_start()) {
      q->work_cv.wait(lock, may_start);
      busy = false;
    }
    // Come from idle (or just started) to a new operation: give its caller a moment to wait for
    // it (then the caller runs it on its own core, as a raw MPI call would) before starting it
    // here, for a caller that went on computing. Once per idle spell; a burst goes on at once.
    if (!busy && !q->stop && q->idle_start_delay.count() > 0) {
      busy = true;
      q->work_cv.wait_for(lock, q->idle_start_delay, [&] { return q->stop; });
      continue;
    }
    if (q->tasks.empty()) break;  // stopping, and everything queued has run
    OpQueue::Task task = std::move(q->tasks.front());
    q->tasks.pop_front();
    q->running.store(true, std::memory_order_relaxed);
    lock.unlock();
    q->run(task);
    lock.lock();
    q->end_task();
  }
  q->exited = true;
  lock.unlock();
  q->work_cv.notify_all();
}

bool ProgressThread::stop_and_join(double timeout_s) noexcept {
  if (!thread_.joinable()) return true;
  try {
    std::unique_lock lock(queue_->mutex);
    queue_->stop = true;
    queue_->work_cv.notify_all();
    auto exited = [&] { return queue_->exited; };
    if (timeout_s < 0) {
      queue_->work_cv.wait(lock, exited);
    } else if (!queue_->work_cv.wait_for(lock, std::chrono::duration<double>(timeout_s), exited)) {
      lock.unlock();
      log::error(
          "communicator '{}': its progress thread is still busy {} s after shutdown began "
          "(an operation whose peers never arrived); leaving it behind",
          name_, timeout_s);
      thread_.detach();
      return false;
    }
    lock.unlock();
    thread_.join();
    return true;
  } catch (...) {
    // Locking or joining failed (a system error): leaving the thread is the only safe option.
    if (thread_.joinable()) thread_.detach();
    return false;
  }
}

}  // namespace quintet::detail
