#include "collectives/mpi/progress_thread.hpp"

#include <chrono>

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

void OpState::finish(std::exception_ptr e) {
  {
    std::lock_guard lock(mutex);
    error = std::move(e);
    done = true;
  }
  done_cv.notify_all();
}

void CpuWork::wait(const Stream&) { synchronize_for(std::chrono::nanoseconds::max()); }

bool CpuWork::synchronize_for(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(state_->mutex);
  auto is_done = [&] { return state_->done; };
  if (timeout == std::chrono::nanoseconds::max()) {
    state_->done_cv.wait(lock, is_done);
  } else if (!state_->done_cv.wait_for(lock, timeout, is_done)) {
    return false;
  }
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

bool CpuWork::is_completed() {
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

ProgressThread::ProgressThread(std::string name)
    : name_(std::move(name)), shared_(std::make_shared<Shared>()) {
  thread_ = std::thread(&ProgressThread::loop, shared_);
}

ProgressThread::~ProgressThread() {
  if (thread_.joinable()) stop_and_join(-1.0);
}

Work ProgressThread::submit(std::string description, std::function<void()> fn) {
  auto state = std::make_shared<OpState>(std::move(description));
  {
    std::lock_guard lock(shared_->mutex);
    QUINTET_CHECK(!shared_->stop, "{} submitted to communicator '{}' after it was shut down",
                  state->description, name_);
    shared_->queue.push_back(Task{std::move(fn), state});
  }
  shared_->cv.notify_all();
  return Work(std::make_shared<CpuWork>(std::move(state)));
}

void ProgressThread::run_sync(std::string description, std::function<void()> fn) {
  submit(std::move(description), std::move(fn)).synchronize();
}

void ProgressThread::loop(std::shared_ptr<Shared> shared) {
  for (;;) {
    Task task;
    std::string failure;
    {
      std::unique_lock lock(shared->mutex);
      shared->cv.wait(lock, [&] { return shared->stop || !shared->queue.empty(); });
      if (shared->queue.empty()) break;  // stopping, and everything queued has run
      task = std::move(shared->queue.front());
      shared->queue.pop_front();
      failure = shared->first_failure;
    }
    std::exception_ptr error;
    if (!failure.empty()) {
      try {
        QUINTET_THROW(Aborted,
                      "{} was not run: an earlier operation on this communicator failed "
                      "({}); create a new communicator after handling that error",
                      task.state->description, failure);
      } catch (...) {
        error = std::current_exception();
      }
    } else {
      try {
        task.fn();
      } catch (const std::exception& e) {
        error = std::current_exception();
        std::lock_guard lock(shared->mutex);
        shared->first_failure = task.state->description + ": " + e.what();
      } catch (...) {
        error = std::current_exception();
        std::lock_guard lock(shared->mutex);
        shared->first_failure = task.state->description + ": unknown exception";
      }
    }
    task.fn = nullptr;  // release the tensors before signalling completion
    task.state->finish(error);
  }
  {
    std::lock_guard lock(shared->mutex);
    shared->exited = true;
  }
  shared->cv.notify_all();
}

bool ProgressThread::stop_and_join(double timeout_s) noexcept {
  if (!thread_.joinable()) return true;
  try {
    std::unique_lock lock(shared_->mutex);
    shared_->stop = true;
    shared_->cv.notify_all();
    auto exited = [&] { return shared_->exited; };
    if (timeout_s < 0) {
      shared_->cv.wait(lock, exited);
    } else if (!shared_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), exited)) {
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
