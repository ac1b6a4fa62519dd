// TimedCommunicator: a Communicator that forwards every operation to another one and measures how
// long the caller's stream was exposed to it.
//
// Use it to report the communication a model layer could not hide, e.g. the tensor-parallel
// all-reduces that sit on the critical path of every block:
//
//   TimedCommunicator timed_tp(mesh.comm(Axis::tp));
//   model::ModelGroups groups = model::ModelGroups::of(mesh);
//   groups.tp = &timed_tp;                 // the layers issue their collectives through it
//   ... build the model's chunks with groups (model/gpt.hpp) ...
//   ... one step ...
//   const TimedCommunicator::Stats s = timed_tp.take_stats();   // s.exposed_ms of that step
//
// What is measured, per operation: one exposed interval of an OverlapMeter (overlap_meter.hpp),
// started by a mark recorded on the caller's stream just before the operation is issued, and ended
// by a mark recorded on the stream passed to the first Work::wait(stream) just after the wait. Its
// length is the time from issuing until that stream could continue: the communication the stream
// was exposed to. Where the caller computes on the stream between issuing and waiting (the
// column-parallel backward overlaps dx's all-reduce with the weight gradient), that compute is
// inside the interval, so exposed_ms is an UPPER BOUND on the exposed communication; where the
// wait follows the issue at once, it is the operation's whole latency. On the CPU the marks are
// host timestamps taken at record time (Event's CPU behaviour), so the interval is the host time
// from issue to the end of the (blocking) wait.
//
// A Work completed on the host instead (synchronize() or wait_for() before any wait(stream)) ends
// its interval on the host (OverlapInterval::end_on_host: the host clock when synchronize
// returns, against the host clock read at issue): the host, not a stream, was exposed. The host
// clocks are also used when the issuing and the waiting stream are on different devices. Only the
// first completion of a Work ends its interval; later waits are forwarded and not timed again. A
// Work never waited on nor synchronized counts in ops and bytes but adds no exposed time; one
// whose interval ends after a take_stats() adds its time to the window in which it ends.
//
// In flight: each operation also has an in_flight interval of the meter, from the same start mark
// at issue to its completion: on the GPU a mark recorded on a side stream of this communicator
// that waits (on the device) for the operation; on the CPU the host clock when the host first
// sees it complete (its wait or synchronize returns, or a later issue or take_stats finds it
// complete), an upper bound on the completion. Stats::comm_ms is their union: the communication
// time, hidden or not; comm_ms - exposed_ms is the part that ran hidden under compute.
//
// Measure::from_wait moves each interval's start to the wait instead: a mark recorded on the
// waiting stream just before Work::wait(stream) (the host clock before synchronize / wait_for).
// The interval is then the time the waiting stream (or the host) stalled on the operation, with
// the compute run between issue and wait left out: the exposed communication itself, also where
// a layer overlaps an exchange with compute on purpose (the MoE layer's chunked dispatch).
//
// Ownership: the inner communicator is borrowed and must outlive this one and every Work it
// returned. Results, errors and input validation are the inner communicator's: an operation that
// throws is not counted. Thread safety: as Communicator (issue from one thread at a time; call
// take_stats/reset from that thread); Works may be waited on from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/parallel/overlap/overlap_meter.hpp"

namespace quintet::overlap {

class TimedCommunicator final : public Communicator {
 public:
  // Totals of one window (the operations issued since the last take_stats or reset).
  struct Stats {
    std::int64_t ops = 0;     // operations issued (that did not throw)
    double exposed_ms = 0.0;  // sum over ended intervals of (end - start), milliseconds
                              // (OverlapTotals::exposed_ms of the window)
    std::int64_t bytes = 0;   // payload in bytes: per op the larger of its buffers on this rank
                              // (p2p: the sum of its tensors; barrier: 0)
    double comm_ms = 0.0;     // the operations in flight: the union over the window's ended
                              // operations of issue to completion, milliseconds
                              // (OverlapTotals::comm_ms; see "In flight" above)
  };

  // Where an operation's exposed interval starts (see above).
  enum class Measure { from_issue, from_wait };

  // Wraps inner (borrowed). The name of this communicator is inner's.
  explicit TimedCommunicator(Communicator& inner, Measure measure = Measure::from_issue);
  ~TimedCommunicator() override;
  TimedCommunicator(const TimedCommunicator&) = delete;
  TimedCommunicator& operator=(const TimedCommunicator&) = delete;

  // Returns the current window's totals and starts a new window. Blocks the host until the end
  // events of the intervals it sums have completed (on a GPU: cudaEventSynchronize), so call it
  // once a step, after the step's work has been synchronised anyway.
  Stats take_stats();
  // Starts a new window, discarding the current one's totals (intervals not yet ended are
  // forgotten too). On a GPU, comm_ms needs the window begun by reset(): its first operation's
  // stream is the origin of the in-flight timeline (a window begun by take_stats places the
  // marks by host clocks).
  void reset();

  // Forwarded to inner.
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Backend backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  const std::string& name() const override { return inner_->name(); }

  using Communicator::all_reduce;
  // Each operation: records start on stream, forwards to inner with the same arguments, returns a
  // Work that forwards to inner's Work and ends the interval (see above).
  Work all_reduce(const Tensor& in, const Tensor& out, ReduceOp op,
                  const Stream& stream = Stream()) override;
  Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                      const Stream& stream = Stream()) override;
  Work all_gather(const Tensor& in, const Tensor& out, const Stream& stream = Stream()) override;
  Work broadcast(const Tensor& inout, int root, const Stream& stream = Stream()) override;
  Work reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
              const Stream& stream = Stream()) override;
  Work all_to_all(const Tensor& in, const Tensor& out, const Stream& stream = Stream()) override;
  Work all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                    const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                    const Stream& stream = Stream()) override;
  Work send(const Tensor& in, int peer, const Stream& stream = Stream()) override;
  Work recv(const Tensor& out, int peer, const Stream& stream = Stream()) override;
  Work p2p(const std::vector<P2POp>& ops, const Stream& stream = Stream()) override;
  Work barrier(const Stream& stream = Stream()) override;

  // inner.split(color, key, name): a PLAIN (untimed) sub-communicator, owned by the caller; wrap
  // it in its own TimedCommunicator to measure it. Not counted as an operation.
  using Communicator::split;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 protected:
  // inner.split(color, key, name, members), as above.
  std::unique_ptr<Communicator> split_with_members(int color, int key, const std::string& name,
                                                   const std::vector<int>& members) override;

 private:
  // Records start on stream, runs issue() (the inner call), counts the op and wraps its Work.
  template <typename Issue>
  Work timed(const Stream& stream, std::int64_t bytes, Issue&& issue);

  // CPU: ends the in-flight intervals of the operations seen complete.
  void poll_in_flight();

  struct Open {  // a CPU operation whose in-flight interval has not ended
    Work work;
    std::shared_ptr<OverlapInterval> in_flight;
  };

  Communicator* inner_;
  Measure measure_;
  std::unique_ptr<Stream> side_;  // GPU: waits for each operation, to mark its end
  std::vector<Open> open_;
  bool fresh_window_ = true;  // reset() since the last operation
  Stats window_;              // ops and bytes of this window
  OverlapMeter meter_;        // its exposed intervals (shared with their Works)
};

}  // namespace quintet::overlap
