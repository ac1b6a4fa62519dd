// Work: the handle of one asynchronous communication operation.
//
// Every Communicator operation returns a Work at once; the operation runs on the communicator's
// comm stream (NCCL) or progress thread (MPI). wait(stream) orders stream after it without
// blocking the host when the backend can (NCCL); synchronize() blocks the host; an error raised
// inside the operation is rethrown from wait/synchronize as a quintet::Error. Work is a cheap
// shared handle: copies refer to the same operation. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "quintet/core/stream.hpp"

namespace quintet {

// What a backend implements for one operation.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  // Makes stream wait for the operation (GPU-side where possible, else blocks the host).
  virtual void wait(const Stream& stream) = 0;
  // Blocks the host until done or until timeout passes; returns false on timeout. Rethrows the
  // operation's error. nanoseconds::max() means the communicator's own deadline
  // (RuntimeConfig::timeout_s), past which it throws a Timeout error instead of returning false.
  virtual bool synchronize_for(std::chrono::nanoseconds timeout) = 0;
  // True when finished (successfully or not); never throws.
  virtual bool is_completed() = 0;
  // Describes the operation for messages: "all_reduce #12 on communicator 'dp' (4 ranks)".
  virtual std::string describe() const = 0;
};

class Work {
 public:
  Work() = default;  // an already-completed no-op
  explicit Work(std::shared_ptr<WorkImpl> impl) : impl_(std::move(impl)) {}

  // Orders stream after the operation. For MPI (CPU) this blocks the host until it completes, for
  // at most the communicator's timeout (RuntimeConfig::timeout_s): past it, a Timeout error naming
  // the operation, its sequence number and the communicator.
  void wait(const Stream& stream = Stream()) const;
  // Blocks the host until the operation (and on a GPU its kernels) has finished, for at most the
  // communicator's timeout: past it, a Timeout error as for wait. When another rank of the job
  // has failed (it published its error, see World::fail), a wait that has not finished throws
  // ErrorCode::Remote, "rank k failed: <its message>".
  void synchronize() const;
  // Like synchronize, but throws a Timeout quintet::Error naming the operation, the communicator
  // and its sequence number if it has not finished within timeout.
  void wait_for(std::chrono::milliseconds timeout) const;
  bool is_completed() const;
  std::string describe() const;

 private:
  std::shared_ptr<WorkImpl> impl_;
};

}  // namespace quintet
