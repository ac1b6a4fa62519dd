#include "collectives/mpi/progress_thread.hpp"

#include <chrono>
#include <exception>
#include <thread>

#include "collectives/laggard.hpp"
#include "collectives/mpi/job_monitor.hpp"

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

// How long a waiting caller that cannot take the next task (another thread is running one) polls
// for that task's end before sleeping: the end of a short operation is then seen at once instead
// of after a wake-up (tens of µs on a loaded machine), as the raw MPI call's own polling would.
constexpr std::chrono::microseconds kSpinBeforeSleep{2000};
// How often a sleeping wait looks at its deadline and at the job's failures.
constexpr std::chrono::milliseconds kWaitSlice{50};
// The deadline of an unbounded wait made by a destructor while an exception propagates: this rank
// is failing already, and its shutdown must not wait for peers that may never come.
constexpr std::chrono::seconds kUnwindingWait{1};
// How long after a caller's deadline the thread, watching it run an MPI call itself, ends the job.
constexpr std::chrono::seconds kWatchdogGrace{1};

using Clock = std::chrono::steady_clock;

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

bool OpQueue::job_failed() const { return monitor != nullptr && monitor->failed(); }

std::exception_ptr OpQueue::refusal_locked(const std::string& description) const {
  try {
    if (job_failed()) {  // its peers may never come: do not start it
      QUINTET_THROW(Remote, "{}; {} was not run", monitor->remote_error(), description);
    }
    if (!first_failure.empty()) {
      QUINTET_THROW(Aborted,
                    "{} was not run: an earlier operation on this communicator failed ({}); "
                    "create a new communicator after handling that error",
                    description, first_failure);
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void OpQueue::poison(const std::string& why) {
  std::deque<Task> refused;
  {
    std::lock_guard lock(mutex);
    if (first_failure.empty()) first_failure = why;
    refused.swap(tasks);  // would wait behind the operation that did not finish
  }
  for (Task& t : refused) {
    std::exception_ptr error;
    {
      std::lock_guard lock(mutex);
      error = refusal_locked(t.state->description);
    }
    t.fn = nullptr;
    finish(t, error);
  }
  turn_cv.notify_all();
}

void OpQueue::finish(const Task& task, std::exception_ptr error) {
  if (flight != nullptr && task.state->info.seq >= 0) {
    flight->completed(task.state->info.seq, error == nullptr);
  }
  task.state->finish(std::move(error));
}

std::string OpQueue::timeout_message(const std::string& description, const OpInfo& waited,
                                     double waited_s, const std::string& note) {
  const std::string laggards = flight != nullptr && monitor != nullptr
                                   ? name_laggards(*flight, waited.op, waited.seq, waited.peer,
                                                   progress_channel(monitor), waited_s)
                                   : std::string();
  const std::string what = fmt::format(
      "{} did not finish within {} s{}: {}", description, waited_s, note,
      laggards.empty() ? "a rank of the group may not have issued the matching operation, or may "
                         "be stopped, or may have failed"
                       : laggards);
  if (monitor != nullptr) monitor->dump_flight("timed out: " + what);
  return what;
}

void OpQueue::run(Task& task) {
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex);
    error = refusal_locked(task.state->description);
  }
  if (!error) {
    if (flight != nullptr && task.state->info.seq >= 0) flight->started(task.state->info.seq);
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
  finish(task, error);
}

void OpQueue::end_task() {
  running.store(false, std::memory_order_release);
  if (sleepers > 0) turn_cv.notify_all();
}

OpQueue::WaitEnd OpQueue::help_until(const OpState& until, Clock::time_point deadline) {
  auto is_done = [&] { return until.done.load(std::memory_order_acquire); };
  if (is_done()) return WaitEnd::done;
  std::unique_lock lock(mutex);
  ++waiters;  // from here on the thread starts no task: this caller runs them
  WaitEnd end = WaitEnd::done;
  bool spin = true;  // not again after a sleep that only ended to look at the deadline
  while (!is_done()) {
    if (job_failed()) {
      end = WaitEnd::remote;
      break;
    }
    if (!running.load(std::memory_order_relaxed) && !tasks.empty()) {
      Task task = std::move(tasks.front());
      tasks.pop_front();
      running.store(true, std::memory_order_relaxed);
      // An MPI call cannot be interrupted: the thread watches this caller's deadline.
      inline_deadline = deadline;
      inline_what = until.description;
      inline_running = task.state->description;
      inline_info = task.state->info;
      const bool watched = deadline != Clock::time_point::max();
      lock.unlock();
      if (watched) work_cv.notify_all();
      run(task);
      lock.lock();
      inline_deadline = Clock::time_point::max();
      end_task();
      spin = true;
      continue;
    }
    if (Clock::now() >= deadline) {
      end = WaitEnd::timed_out;
      break;
    }
    // Someone else runs a task, ours or one before it: the thread (it had started before this
    // caller came) or another waiting caller. Poll for its end, then sleep until a task ends.
    bool ended = false;
    if (spin) {
      lock.unlock();
      ended = spin_for(kSpinBeforeSleep,
                       [&] { return is_done() || !running.load(std::memory_order_acquire); });
      lock.lock();
    }
    if (!ended) {
      ++sleepers;
      spin = turn_cv.wait_until(lock, std::min(deadline, Clock::now() + kWaitSlice), [&] {
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
  return end;
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
  const bool unbounded = timeout == std::chrono::nanoseconds::max();
  std::chrono::nanoseconds budget = unbounded ? queue_->wait_timeout : timeout;
  if (unbounded && std::uncaught_exceptions() > 0)
    budget = std::min<std::chrono::nanoseconds>(budget, kUnwindingWait);
  const auto now = Clock::now();
  const Clock::time_point deadline =
      budget >= Clock::time_point::max() - now ? Clock::time_point::max() : now + budget;
  OpQueue::WaitEnd end = OpQueue::WaitEnd::done;
  if (unbounded) {
    end = queue_->help_until(*state_, deadline);
  } else {
    // A bounded wait must not enter a blocking MPI call that could outlast its timeout: it only
    // sleeps, and the thread (or an unbounded waiter) runs the operation.
    std::unique_lock lock(state_->mutex);
    auto is_done = [&] { return state_->done.load(std::memory_order_acquire); };
    while (!is_done()) {
      if (queue_->job_failed()) {
        end = OpQueue::WaitEnd::remote;
        break;
      }
      if (Clock::now() >= deadline) return false;
      state_->done_cv.wait_until(lock, std::min(deadline, Clock::now() + kWaitSlice), is_done);
    }
  }
  if (end == OpQueue::WaitEnd::remote) {
    QUINTET_THROW(Remote, "{} (while waiting for {})", queue_->monitor->remote_error(),
                  state_->description);
  }
  if (end == OpQueue::WaitEnd::timed_out) {
    const std::string what =
        queue_->timeout_message(
            state_->description, state_->info, std::chrono::duration<double>(budget).count(),
            budget < queue_->wait_timeout ? " (waited for by a destructor during an exception)"
                                          : "") +
        "; check that every rank calls the same collectives in the same order, or raise "
        "--timeout-s (QUINTET_TIMEOUT_S)";
    queue_->poison("timed out: " + what);
    QUINTET_THROW(Timeout, "{}", what);
  }
  std::lock_guard lock(state_->mutex);
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

bool CpuWork::is_completed() { return state_->done.load(std::memory_order_acquire); }

ProgressThread::ProgressThread(std::string name, std::chrono::microseconds idle_start_delay,
                               std::chrono::nanoseconds wait_timeout,
                               std::shared_ptr<JobMonitor> monitor,
                               std::shared_ptr<FlightRecorder> flight)
    : name_(std::move(name)), queue_(std::make_shared<OpQueue>()) {
  queue_->idle_start_delay = idle_start_delay;
  queue_->wait_timeout = wait_timeout;
  queue_->monitor = std::move(monitor);
  queue_->flight = std::move(flight);
  thread_ = std::thread(&ProgressThread::loop, queue_);
}

ProgressThread::~ProgressThread() {
  if (thread_.joinable()) stop_and_join(-1.0);
}

Work ProgressThread::submit(std::string description, std::function<void()> fn,
                            std::optional<trace::TraceEvent> trace, OpInfo info) {
  auto state = std::make_shared<OpState>(std::move(description), info);
  state->trace = std::move(trace);
  bool wake = false;
  std::exception_ptr refused;  // the communicator is broken, or the job failed: it fails at once
  {
    std::lock_guard lock(queue_->mutex);
    QUINTET_CHECK(!queue_->stop, "{} submitted to communicator '{}' after it was shut down",
                  state->description, name_);
    refused = queue_->refusal_locked(state->description);
    if (queue_->flight != nullptr && info.seq >= 0) {
      queue_->flight->enqueued(info.seq, info.op, info.dtype, info.count, info.peer);
    }
    if (!refused) queue_->tasks.push_back(OpQueue::Task{std::move(fn), state});
    // Only the first task of an idle queue needs a wake-up: a busy runner takes the next itself,
    // and while a caller waits the thread would not take it.
    wake = !queue_->running.load(std::memory_order_relaxed) && queue_->waiters == 0 &&
           queue_->tasks.size() == 1;
  }
  if (refused) queue_->finish(OpQueue::Task{nullptr, state}, refused);
  if (wake) queue_->work_cv.notify_all();
  return Work(std::make_shared<CpuWork>(std::move(state), queue_));
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
      while (!may_start()) {
        // A caller running an MPI call itself cannot be interrupted: past its deadline, the job
        // ends with its Timeout (a hang is a bug; the stopped or lost peer never answers).
        const auto watch = q->inline_deadline;
        if (watch >= Clock::time_point::max() - kWatchdogGrace) {
          q->work_cv.wait(lock);
        } else if (q->work_cv.wait_until(lock, watch + kWatchdogGrace) == std::cv_status::timeout &&
                   q->inline_deadline == watch && Clock::now() >= watch + kWatchdogGrace) {
          const std::string inline_what = q->inline_what;
          const std::string note =
              fmt::format(" (this rank is blocked inside the MPI call of {})", q->inline_running);
          const OpInfo info = q->inline_info;
          lock.unlock();  // naming the laggard asks the other ranks
          const std::string what =
              "error [Timeout]: " +
              q->timeout_message(inline_what, info,
                                 std::chrono::duration<double>(q->wait_timeout).count(), note) +
              (q->monitor != nullptr ? "; the job ends" : "");
          lock.lock();
          if (q->inline_deadline != watch) continue;  // that call has ended meanwhile
          if (q->monitor != nullptr) {
            lock.unlock();
            q->monitor->fatal(what);
          }
          log::error("{}", what);
          q->inline_deadline = Clock::time_point::max();  // said once; nothing else can be done
        }
      }
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
    q->started_by_thread.fetch_add(1, std::memory_order_release);
    lock.unlock();
    q->run(task);
    lock.lock();
    q->end_task();
  }
  q->exited = true;
  lock.unlock();
  q->work_cv.notify_all();
}

bool ProgressThread::broken() const {
  if (queue_->job_failed() || (queue_->monitor != nullptr && queue_->monitor->failing())) {
    return true;
  }
  std::lock_guard lock(queue_->mutex);
  return !queue_->first_failure.empty();
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
