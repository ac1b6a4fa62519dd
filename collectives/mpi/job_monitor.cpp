#include "collectives/mpi/job_monitor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "collectives/flight_recorder.hpp"
#include "collectives/laggard.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kFailureTag = 1;  // payload: the failing rank's message
constexpr int kAckTag = 2;      // payload: sizeof(int) bytes, unused
constexpr int kQueryTag = 3;    // payload: the query's id, as text
constexpr int kAnswerTag = 4;   // payload: "<id>\n<progress report>"
constexpr std::size_t kMaxMessage = 16 * 1024;
constexpr std::chrono::milliseconds kPollEvery{20};
// A rank that received a failure and is still alive this long after it was printed ends the job
// itself (the failing rank should have aborted it long before).
constexpr std::chrono::milliseconds kAbortAfter{20000};

// Posts a receive of up to buffer.size() chars with tag from any rank.
void post(MPI_Comm comm, int tag, MPI_Request* request, std::vector<char>& buffer) {
  QUINTET_MPI_CHECK(MPI_Irecv(buffer.data(), static_cast<int>(buffer.size()), MPI_CHAR,
                              MPI_ANY_SOURCE, tag, comm, request));
}

// Hands every message that has arrived on a posted receive to on_message(from, bytes), posting
// the receive again after each (a post that fails leaves the request null: no more messages).
template <class OnMessage>
void drain(MPI_Comm comm, int tag, MPI_Request* request, std::vector<char>& buffer,
           OnMessage on_message) {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (*request == MPI_REQUEST_NULL || MPI_Test(request, &flag, &status) != MPI_SUCCESS || !flag) {
      return;
    }
    int n = 0;
    MPI_Get_count(&status, MPI_CHAR, &n);
    on_message(status.MPI_SOURCE,
               std::string(buffer.data(), static_cast<std::size_t>(std::max(n, 0))));
    if (MPI_Irecv(buffer.data(), static_cast<int>(buffer.size()), MPI_CHAR, MPI_ANY_SOURCE, tag,
                  comm, request) != MPI_SUCCESS) {
      *request = MPI_REQUEST_NULL;
    }
  }
}

}  // namespace

JobMonitor::JobMonitor(MPI_Comm world, std::shared_ptr<FlightRegistry> flight)
    : failure_buffer_(kMaxMessage),
      ack_buffer_(sizeof(int)),
      flight_(std::move(flight)),
      query_buffer_(kMaxMessage),
      answer_buffer_(kMaxMessage) {
  QUINTET_MPI_CHECK(MPI_Comm_dup(world, &comm_));
  QUINTET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  QUINTET_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  QUINTET_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  post(comm_, kFailureTag, &failure_request_, failure_buffer_);
  post(comm_, kAckTag, &ack_request_, ack_buffer_);
  post(comm_, kQueryTag, &query_request_, query_buffer_);
  post(comm_, kAnswerTag, &answer_request_, answer_buffer_);
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
  for (MPI_Request* r : {&failure_request_, &ack_request_, &query_request_, &answer_request_}) {
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
  // Failures: every one is acknowledged, the first is recorded.
  drain(comm_, kFailureTag, &failure_request_, failure_buffer_, [&](int from, std::string message) {
    if (remote_rank_ < 0) {
      remote_rank_ = from;
      remote_message_ = std::move(message);
      remote_at_ = Clock::now();
      // Before this rank acknowledges (after which the failed rank may end the job).
      if (flight_) {
        flight_->dump_on_failure(fmt::format("rank {} failed: {}", from, remote_message_));
      }
      remote_failed_.store(true, std::memory_order_release);
    }
    if (acknowledged_) {
      send_locked(from, kAckTag, std::vector<char>(sizeof(int)));
    } else {
      unacknowledged_.insert(from);
    }
  });
  bool acked = false;  // acknowledgements of this rank's failure
  drain(comm_, kAckTag, &ack_request_, ack_buffer_, [&](int from, const std::string&) {
    acks_.insert(from);
    acked = true;
  });
  // Another rank asks for this rank's progress.
  drain(comm_, kQueryTag, &query_request_, query_buffer_, [&](int from, std::string answer) {
    answer += '\n';
    if (flight_) answer += progress_report(*flight_);
    if (answer.size() > kMaxMessage) answer.resize(kMaxMessage);
    send_locked(from, kAnswerTag, std::vector<char>(answer.begin(), answer.end()));
  });
  // Answers to this rank's query; those of an earlier query are dropped.
  bool answered = false;
  drain(comm_, kAnswerTag, &answer_request_, answer_buffer_,
        [&](int from, const std::string& answer) {
          const auto eol = answer.find('\n');
          if (query_id_ != 0 && eol != std::string::npos &&
              answer.substr(0, eol) == std::to_string(query_id_)) {
            answers_[from] = answer.substr(eol + 1);
            answered = true;
          }
        });
  // Sends that have completed give their buffers back; the others stay until they do.
  std::erase_if(sends_, [](const std::unique_ptr<Pending>& p) {
    int flag = 0;
    return MPI_Test(&p->request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag;
  });
  if (acked || answered) cv_.notify_all();
}

std::map<int, std::string> JobMonitor::query_progress(std::chrono::milliseconds wait) noexcept {
  try {
    std::lock_guard one(query_mutex_);
    std::unique_lock lock(mutex_);
    query_id_ = ++queries_;
    answers_.clear();
    const std::string id = std::to_string(query_id_);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) send_locked(peer, kQueryTag, std::vector<char>(id.begin(), id.end()));
    }
    const auto others = static_cast<std::size_t>(size_ - 1);
    cv_.wait_for(lock, wait, [&] { return answers_.size() >= others || stop_; });
    query_id_ = 0;
    return std::move(answers_);
  } catch (...) {
    return {};
  }
}

void JobMonitor::dump_flight(const std::string& reason) noexcept {
  if (flight_) flight_->dump_on_failure(reason);
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
  if (published_.load()) return;
  if (flight_ && !message.empty()) flight_->dump_on_failure(message);  // before the job is ended
  published_.store(true);
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

ProgressChannel progress_channel(std::shared_ptr<JobMonitor> monitor) {
  ProgressChannel channel;
  channel.world_rank = monitor->rank();
  channel.world_size = monitor->size();
  channel.query = [monitor = std::move(monitor)](std::chrono::milliseconds wait) {
    return monitor->query_progress(wait);
  };
  return channel;
}

}  // namespace quintet::detail
