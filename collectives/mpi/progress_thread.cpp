#include "collectives/mpi/progress_thread.hpp"

#include <chrono>
#include <thread>

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {
// How long a caller waiting for an operation the progress thread runs polls before sleeping.
constexpr std::chrono::microseconds kSpinBeforeSleep{2000};
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
    try {
      task.fn();
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

void OpQueue::help_until(const OpState& until) {
  std::unique_lock lock(mutex);
  bool ran = false;
  while (!until.done.load(std::memory_order_acquire) && !running && !tasks.empty()) {
    Task task = std::move(tasks.front());
    tasks.pop_front();
    running = true;
    lock.unlock();
    run(task);
    lock.lock();
    running = false;
    ran = true;
  }
  lock.unlock();
  // The thread may have found the queue busy and gone back to sleep: hand the rest (operations
  // queued after ours, or a pending stop) back to it.
  if (ran) work_cv.notify_all();
}

void CpuWork::wait(const Stream&) { synchronize_for(std::chrono::nanoseconds::max()); }

bool CpuWork::synchronize_for(std::chrono::nanoseconds timeout) {
  const bool forever = timeout == std::chrono::nanoseconds::max();
  // A bounded wait must not enter a blocking MPI call that could outlast its timeout: only an
  // unbounded one runs operations itself.
  if (forever && !state_->done.load(std::memory_order_acquire)) queue_->help_until(*state_);
  auto is_done = [&] { return state_->done.load(std::memory_order_acquire); };
  // The progress thread is running it: poll for a while before sleeping, as the raw MPI call
  // would, so the end of a short operation is seen at once instead of after a wake-up (tens of
  // µs on a loaded machine). Yielding keeps an oversubscribed core usable by the ranks.
  if (forever && !is_done()) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
    while (!is_done() && std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
  }
  std::unique_lock lock(state_->mutex);
  if (forever) {
    state_->done_cv.wait(lock, is_done);
  } else if (!state_->done_cv.wait_for(lock, timeout, is_done)) {
    return false;
  }
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

bool CpuWork::is_completed() { return state_->done.load(std::memory_order_acquire); }

ProgressThread::ProgressThread(std::string name)
    : name_(std::move(name)), queue_(std::make_shared<OpQueue>()) {
  thread_ = std::thread(&ProgressThread::loop, queue_);
}

ProgressThread::~ProgressThread() {
  if (thread_.joinable()) stop_and_join(-1.0);
}

Work ProgressThread::submit(std::string description, std::function<void()> fn) {
  auto state = std::make_shared<OpState>(std::move(description));
  bool wake = false;
  {
    std::lock_guard lock(queue_->mutex);
    QUINTET_CHECK(!queue_->stop, "{} submitted to communicator '{}' after it was shut down",
                  state->description, name_);
    queue_->tasks.push_back(OpQueue::Task{std::move(fn), state});
    // Only the first task of an idle queue needs a wake-up; a busy runner takes the next itself.
    wake = !queue_->running && queue_->tasks.size() == 1;
  }
  if (wake) queue_->work_cv.notify_all();
  return Work(std::make_shared<CpuWork>(std::move(state), queue_));
}

void ProgressThread::run_sync(std::string description, std::function<void()> fn) {
  submit(std::move(description), std::move(fn)).synchronize();
}

void ProgressThread::loop(std::shared_ptr<OpQueue> q) {
  std::unique_lock lock(q->mutex);
  for (;;) {
    q->work_cv.wait(lock, [&] { return !q->running && (q->stop || !q->tasks.empty()); });
    if (q->tasks.empty()) break;  // stopping, and everything queued has run
    OpQueue::Task task = std::move(q->tasks.front());
    q->tasks.pop_front();
    q->running = true;
    lock.unlock();
    q->run(task);
    lock.lock();
    q->running = false;
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
