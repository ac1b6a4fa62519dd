// TimedCommunicator: forwarding, counting, and one exposed OverlapMeter interval per operation (see
// timed_communicator.hpp for what is measured).
#include "quintet/parallel/overlap/timed_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/core/stream.hpp"

namespace quintet {

namespace {

std::int64_t bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

// The Work of a timed operation: forwards to the inner Work and ends the operation's exposed
// interval on the first completion (the interval ignores later ends).
class TimedWork final : public WorkImpl {
 public:
  TimedWork(Work inner, std::shared_ptr<OverlapInterval> interval, bool from_wait)
      : inner_(std::move(inner)), interval_(std::move(interval)), from_wait_(from_wait) {}

  void wait(const Stream& stream) override {
    if (from_wait_) interval_->restart_at(stream);
    inner_.wait(stream);
    // The end is recorded on the waiting stream after its wait: it completes when the stream can
    // continue past the operation.
    interval_->end(stream);
  }

  bool synchronize_for(std::chrono::nanoseconds timeout) override {
    if (from_wait_) interval_->restart_on_host();
    if (timeout == std::chrono::nanoseconds::max()) {
      inner_.synchronize();
    } else {
      // Work exposes a timed wait only as a throwing wait_for; its Timeout means "not yet".
      try {
        inner_.wait_for(std::chrono::ceil<std::chrono::milliseconds>(timeout));
      } catch (const Error& e) {
        if (e.code() == ErrorCode::Timeout) return false;
        throw;
      }
    }
    interval_->end_on_host();
    return true;
  }

  bool is_completed() override { return inner_.is_completed(); }

  std::string describe() const override { return inner_.describe(); }

 private:
  Work inner_;
  std::shared_ptr<OverlapInterval> interval_;
  bool from_wait_;
};

}  // namespace

TimedCommunicator::TimedCommunicator(Communicator& inner, Measure measure)
    : inner_(&inner), measure_(measure) {}

TimedCommunicator::~TimedCommunicator() = default;

template <typename Issue>
Work TimedCommunicator::timed(const Stream& stream, std::int64_t bytes, Issue&& issue) {
  // An operation that throws leaves its interval unended: it adds nothing to exposed_ms.
  std::shared_ptr<OverlapInterval> interval = meter_.begin(OverlapKind::exposed, stream);
  Work inner = issue();  // validation errors propagate from here, nothing counted
  window_.ops += 1;
  window_.bytes += bytes;
  return Work(std::make_shared<TimedWork>(std::move(inner), std::move(interval),
                                          measure_ == Measure::from_wait));
}

TimedCommunicator::Stats TimedCommunicator::take_stats() {
  Stats stats = window_;
  stats.exposed_ms = meter_.take().exposed_ms;
  window_ = Stats{};
  return stats;
}

void TimedCommunicator::reset() {
  window_ = Stats{};
  meter_.start_window();
}

Work TimedCommunicator::all_reduce(const Tensor& in, const Tensor& out, ReduceOp op,
                                   const Stream& stream) {
  return timed(stream, std::max(bytes_of(in), bytes_of(out)),
               [&] { return inner_->all_reduce(in, out, op, stream); });
}

Work TimedCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                       const Stream& stream) {
  return timed(stream, std::max(bytes_of(in), bytes_of(out)),
               [&] { return inner_->reduce_scatter(in, out, op, stream); });
}

Work TimedCommunicator::all_gather(const Tensor& in, const Tensor& out, const Stream& stream) {
  return timed(stream, std::max(bytes_of(in), bytes_of(out)),
               [&] { return inner_->all_gather(in, out, stream); });
}

Work TimedCommunicator::broadcast(const Tensor& inout, int root, const Stream& stream) {
  return timed(stream, bytes_of(inout), [&] { return inner_->broadcast(inout, root, stream); });
}

Work TimedCommunicator::reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
                               const Stream& stream) {
  return timed(stream, std::max(bytes_of(in), bytes_of(out)),
               [&] { return inner_->reduce(in, out, op, root, stream); });
}

Work TimedCommunicator::all_to_all(const Tensor& in, const Tensor& out, const Stream& stream) {
  return timed(stream, std::max(bytes_of(in), bytes_of(out)),
               [&] { return inner_->all_to_all(in, out, stream); });
}

Work TimedCommunicator::all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                                     const Tensor& out,
                                     const std::vector<std::int64_t>& recv_counts,
                                     const Stream& stream) {
  return timed(stream, std::max(bytes_of(in), bytes_of(out)),
               [&] { return inner_->all_to_all_v(in, send_counts, out, recv_counts, stream); });
}

Work TimedCommunicator::send(const Tensor& in, int peer, const Stream& stream) {
  return timed(stream, bytes_of(in), [&] { return inner_->send(in, peer, stream); });
}

Work TimedCommunicator::recv(const Tensor& out, int peer, const Stream& stream) {
  return timed(stream, bytes_of(out), [&] { return inner_->recv(out, peer, stream); });
}

Work TimedCommunicator::p2p(const std::vector<P2POp>& ops, const Stream& stream) {
  std::int64_t bytes = 0;
  for (const P2POp& op : ops) bytes += bytes_of(op.tensor);
  return timed(stream, bytes, [&] { return inner_->p2p(ops, stream); });
}

Work TimedCommunicator::barrier(const Stream& stream) {
  return timed(stream, 0, [&] { return inner_->barrier(stream); });
}

std::unique_ptr<Communicator> TimedCommunicator::split(int color, int key,
                                                       const std::string& name) {
  return inner_->split(color, key, name);
}

}  // namespace quintet
