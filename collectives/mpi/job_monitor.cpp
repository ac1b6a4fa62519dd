#include "collectives/mpi/job_monitor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kFailureTag = 1;  // payload: the failing rank's message
constexpr int kAckTag = 2;      // payload: one int, unused
constexpr std::size_t kMaxMessage = 16 * 1024;
constexpr std::chrono::milliseconds kPollEvery{20};
// A rank that received a failure and is still alive this long after it was printed ends the job
// itself (the failing rank should have aborted it long before).
constexpr std::chrono::milliseconds kAbortAfter{20000};

}  // namespace

JobMonitor::JobMonitor(MPI_Comm world) : failure_buffer_(kMaxMessage) {
  QUINTET_MPI_CHECK(MPI_Comm_dup(world, &comm_));
  QUINTET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  QUINTET_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  QUINTET_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  QUINTET_MPI_CHECK(MPI_Irecv(failure_buffer_.data(), static_cast<int>(kMaxMessage), MPI_CHAR,
                              MPI_ANY_SOURCE, kFailureTag, comm_, &failure_request_));
  QUINTET_MPI_CHECK(
      MPI_Irecv(&ack_buffer_, 1, MPI_INT, MPI_ANY_SOURCE, kAckTag, comm_, &ack_request_));
  thread_ = std::thread(&JobMonitor::loop, this);
}

JobMonitor::~JobMonitor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  int finalized = 1;
  MPI_Finalized(&finalized);
  // Sends still in flight (to a rank that is stopped or gone) keep their buffers, leaked.
  std::erase_if(sends_, [&](const std::unique_ptr<Pending>& p) {
    int flag = 1;
    if (!finalized) MPI_Test(&p->request, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  });
  if (!sends_.empty()) (void)new std::vector<std::unique_ptr<Pending>>(std::move(sends_));
  if (finalized || failing()) return;  // a failing job is aborted, not shut down: leave it all
  for (MPI_Request* r : {&failure_request_, &ack_request_}) {
    if (*r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(r);
    MPI_Wait(r, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&comm_);
}

std::string JobMonitor::remote_error() const {
  std::lock_guard lock(mutex_);
  if (remote_rank_ < 0) return {};
  return fmt::format("rank {} failed: {}", remote_rank_, remote_message_);
}

void JobMonitor::send_locked(int peer, int tag, std::vector<char> bytes) {
  auto p = std::make_unique<Pending>();
  p->bytes = std::move(bytes);
  if (MPI_Isend(p->bytes.data(), static_cast<int>(p->bytes.size()), MPI_CHAR, peer, tag, comm_,
                &p->request) == MPI_SUCCESS) {
    sends_.push_back(std::move(p));
  }
}

void JobMonitor::acknowledge_locked() {
  acknowledged_ = true;
  for (int peer : unacknowledged_) send_locked(peer, kAckTag, std::vector<char>(sizeof(int)));
  unacknowledged_.clear();
}

void JobMonitor::poll_locked() {
  for (;;) {  // failures: every one is acknowledged, the first is recorded
    int flag = 0;
    MPI_Status status;
    if (failure_request_ == MPI_REQUEST_NULL ||
        MPI_Test(&failure_request_, &flag, &status) != MPI_SUCCESS || !flag) {
      break;
    }
    int n = 0;
    MPI_Get_count(&status, MPI_CHAR, &n);
    const int from = status.MPI_SOURCE;
    if (remote_rank_ < 0) {
      remote_rank_ = from;
      remote_message_.assign(failure_buffer_.data(), static_cast<std::size_t>(std::max(n, 0)));
      remote_at_ = Clock::now();
      remote_failed_.store(true, std::memory_order_release);
    }
    if (acknowledged_) {
      send_locked(from, kAckTag, std::vector<char>(sizeof(int)));
    } else {
      unacknowledged_.insert(from);
    }
    if (MPI_Irecv(failure_buffer_.data(), static_cast<int>(kMaxMessage), MPI_CHAR, MPI_ANY_SOURCE,
                  kFailureTag, comm_, &failure_request_) != MPI_SUCCESS) {
      failure_request_ = MPI_REQUEST_NULL;
    }
  }
  bool acked = false;
  for (;;) {  // acknowledgements of this rank's failure
    int flag = 0;
    MPI_Status status;
    if (ack_request_ == MPI_REQUEST_NULL ||
        MPI_Test(&ack_request_, &flag, &status) != MPI_SUCCESS || !flag) {
      break;
    }
    acks_.insert(status.MPI_SOURCE);
    acked = true;
    if (MPI_Irecv(&ack_buffer_, 1, MPI_INT, MPI_ANY_SOURCE, kAckTag, comm_, &ack_request_) !=
        MPI_SUCCESS) {
      ack_request_ = MPI_REQUEST_NULL;
    }
  }
  // Sends that have completed give their buffers back; the others stay until they do.
  std::erase_if(sends_, [](const std::unique_ptr<Pending>& p) {
    int flag = 0;
    return MPI_Test(&p->request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag;
  });
  if (acked) cv_.notify_all();
}

void JobMonitor::loop() {
  std::unique_lock lock(mutex_);
  bool printed = false;
  while (!stop_) {
    poll_locked();
    if (remote_rank_ >= 0 && !acknowledged_ && !unacknowledged_.empty() &&
        Clock::now() - remote_at_ >= kPrintWait) {
      // The program has not printed it: a thread of this rank is blocked inside an MPI call that
      // the failed rank will never join. Say so here, then let the failed rank end the job.
      log::error(
          "rank {} failed: {} (this rank is waiting inside an MPI call that rank {} will not "
          "join; the job ends)",
          remote_rank_, remote_message_, remote_rank_);
      printed = true;
      acknowledge_locked();
    }
    if (printed && Clock::now() - remote_at_ >= kPrintWait + kAbortAfter) {
      lock.unlock();
      abort_job(1);
    }
    cv_.wait_for(lock, kPollEvery, [&] { return stop_; });
  }
}

void JobMonitor::publish_locked(const std::string& message) {
  acknowledge_locked();  // this rank prints its own error: the ones it received are answered
  if (published_.exchange(true)) return;
  const std::vector<char> bytes(message.begin(),
                                message.begin() + std::min(message.size(), kMaxMessage));
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) send_locked(peer, kFailureTag, bytes);
  }
}

void JobMonitor::publish_nowait(const std::string& message) noexcept {
  try {
    std::lock_guard lock(mutex_);
    publish_locked(message);
  } catch (...) {
  }
}

bool JobMonitor::publish(const std::string& message) noexcept {
  try {
    std::unique_lock lock(mutex_);
    publish_locked(message);
    const auto others = static_cast<std::size_t>(size_ - 1);
    return cv_.wait_for(lock, kAckWait, [&] { return acks_.size() >= others || stop_; }) &&
           acks_.size() >= others;
  } catch (...) {
    return false;
  }
}

void JobMonitor::acknowledge() noexcept {
  try {
    std::lock_guard lock(mutex_);
    acknowledge_locked();
  } catch (...) {
  }
}

void JobMonitor::abort_job(int code) noexcept {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; should it, the process still ends
}

void JobMonitor::fatal(const std::string& message) noexcept {
  log::error("{}", message);
  publish(message);
  abort_job(1);
}

}  // namespace quintet::detail
