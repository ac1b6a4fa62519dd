// JobMonitor: how the first error of one rank reaches every rank of an MPI job, so that a rank
// that fails on its own ends the job with its message instead of leaving the others waiting.
//
// quintet::init makes one per job of more than one rank, over a duplicate of MPI_COMM_WORLD on
// which nothing else travels. Its thread keeps a receive posted there and polls it (every 20 ms):
//   - publish(message): this rank has failed (and has printed why). The message goes to every
//     other rank with nonblocking sends; then it waits (bounded, kAckWait) until each has
//     acknowledged, i.e. printed either its own error or this one.
//   - A rank that receives a failure records the first one: from then on, every wait of its
//     MPI communicators that is not inside an MPI call throws ErrorCode::Remote, "rank k failed:
//     <message>" (failed(), remote_error()), and no new operation is started. The program prints
//     it and calls acknowledge() (World::fail does). A thread blocked inside an MPI call cannot
//     be woken: if the rank has not acknowledged after kPrintWait, the monitor prints the failure
//     itself and acknowledges.
//   - abort_job(code): MPI_Abort over the world, which ends every rank.
//   - query_progress(wait): asks every other rank for its communicators' sequence numbers (its
//     flight recorders' progress, laggard.hpp); the monitor thread of each rank answers from its
//     FlightRegistry, even while the rank's own threads are blocked inside MPI calls or on the GPU.
//     A rank that is stopped or dead does not answer. progress_channel() hands it to the code that
//     names the laggard (MPI and NCCL communicators alike).
//   - With a FlightRegistry, the first failure this rank publishes or receives dumps it first
//     (flight_rank<r>.json), so every rank that can leaves its record before the job is ended.
// Bounded everywhere: a rank that is stopped or dead delays the others by kAckWait at most.
// Thread-safe. Implementation details below the class.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collectives/laggard.hpp"

namespace quintet::detail {

class FlightRegistry;

class JobMonitor {
 public:
  // How long publish waits for the other ranks to acknowledge a failure.
  static constexpr std::chrono::milliseconds kAckWait{5000};
  // How long a rank that received a failure leaves its program to print it before printing it
  // itself.
  static constexpr std::chrono::milliseconds kPrintWait{1500};

  // Collective over world, which it duplicates. flight: this process's recorders (may be null).
  explicit JobMonitor(MPI_Comm world, std::shared_ptr<FlightRegistry> flight = nullptr);
  JobMonitor(const JobMonitor&) = delete;
  JobMonitor& operator=(const JobMonitor&) = delete;
  // Stops the thread; in a job that has not failed, cancels the posted receives and frees the
  // duplicate. Never throws.
  ~JobMonitor();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // True once another rank's failure has arrived. Cheap (one atomic load).
  bool failed() const noexcept { return remote_failed_.load(std::memory_order_acquire); }
  // True once this rank published a failure or received one.
  bool failing() const noexcept { return failed() || published_.load(std::memory_order_acquire); }
  // True once this rank published a failure.
  bool published() const noexcept { return published_.load(std::memory_order_acquire); }
  // "rank k failed: <message>" of the first failure received (empty before one has).
  std::string remote_error() const;

  // Sends "this rank failed: message" to every other rank, then waits up to kAckWait for each to
  // acknowledge. Also acknowledges the failures this rank has received (it is printing its own
  // error). Returns whether every rank acknowledged. Later calls only wait. Never throws.
  bool publish(const std::string& message) noexcept;
  // Sends it like publish, without waiting. Never throws.
  void publish_nowait(const std::string& message) noexcept;
  // This rank has printed the failures it received (and will print nothing else about them):
  // acknowledges them, and later ones on arrival. Never throws.
  void acknowledge() noexcept;
  // Ends every rank of the job: MPI_Abort over the world with code.
  [[noreturn]] void abort_job(int code) noexcept;
  // For an operation that passed its deadline inside an MPI call (which cannot be interrupted):
  // prints message, publishes it, and ends the job.
  [[noreturn]] void fatal(const std::string& message) noexcept;

  // Asks every other rank for the progress of its communicators and waits up to `wait` for the
  // answers: rank -> its report (progress_report in laggard.hpp). Ranks that did not answer are
  // absent. One query at a time per process (a second caller waits for the first). Never throws.
  std::map<int, std::string> query_progress(std::chrono::milliseconds wait) noexcept;
  // Dumps the flight recorder for a failure (once per process; later calls do nothing). Never
  // throws.
  void dump_flight(const std::string& reason) noexcept;

  // ---- implementation details ----
 private:
  struct Pending {  // a nonblocking send and its buffer
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<char> bytes;
  };
  void loop();
  void poll_locked();  // tests the posted receives and the sends; call with mutex_ held
  void send_locked(int peer, int tag, std::vector<char> bytes);
  void acknowledge_locked();
  void publish_locked(const std::string& message);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  mutable std::mutex mutex_;
  std::condition_variable cv_;  // acks arrived, or stop
  std::atomic<bool> remote_failed_{false};
  std::atomic<bool> published_{false};
  bool stop_ = false;
  bool acknowledged_ = false;  // this rank printed: acknowledge failures at once
  int remote_rank_ = -1;
  std::string remote_message_;
  std::chrono::steady_clock::time_point remote_at_;
  std::set<int> unacknowledged_;  // ranks whose failure this rank has not acknowledged yet
  std::set<int> acks_;            // ranks that acknowledged this rank's failure
  std::vector<char> failure_buffer_;
  MPI_Request failure_request_ = MPI_REQUEST_NULL;
  std::vector<char> ack_buffer_;
  MPI_Request ack_request_ = MPI_REQUEST_NULL;
  std::vector<std::unique_ptr<Pending>> sends_;
  std::shared_ptr<FlightRegistry> flight_;
  std::vector<char> query_buffer_;  // a query's id, or an answer: "<id>\n<report>"
  MPI_Request query_request_ = MPI_REQUEST_NULL;
  std::vector<char> answer_buffer_;
  MPI_Request answer_request_ = MPI_REQUEST_NULL;
  std::mutex query_mutex_;  // one query at a time
  int query_id_ = 0;        // the query in flight (0: none)
  int queries_ = 0;         // queries made so far
  std::map<int, std::string> answers_;
  std::thread thread_;
};

// The channel over which laggard.hpp's name_laggards asks the other ranks: monitor's rank, size
// and query_progress (the channel holds monitor).
ProgressChannel progress_channel(std::shared_ptr<JobMonitor> monitor);

}  // namespace quintet::detail
