// TimedCommunicator: forwarding, counting, and one exposed OverlapMeter interval per operation (see
// timed_communicator.hpp for what is measured).
#include "quintet/parallel/overlap/timed_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/trace.hpp"

namespace quintet::overlap {

namespace {

std::int64_t bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

// The Work of a timed operation: forwards to the inner Work, ends the operation's exposed
// interval on the first completion (the interval ignores later ends), and on the CPU ends its
// in-flight interval there too (unless a poll saw the operation complete first).
class TimedWork final : public WorkImpl {
 public:
  TimedWork(Work inner, std::shared_ptr<OverlapInterval> interval,
            std::shared_ptr<OverlapInterval> in_flight, bool from_wait)
      : inner_(std::move(inner)),
        interval_(std::move(interval)),
        in_flight_(std::move(in_flight)),
        from_wait_(from_wait) {}

  void wait(const Stream& stream) override {
    if (from_wait_) interval_->restart_at(stream);
    inner_.wait(stream);
    // The end is recorded on the waiting stream after its wait: it completes when the stream can
    // continue past the operation.
    interval_->end(stream);
    if (!stream.device().is_cuda()) in_flight_->end_on_host();
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
    in_flight_->end_on_host();
    return true;
  }

  bool is_completed() override { return inner_.is_completed(); }

  std::string describe() const override { return inner_.describe(); }

 private:
  Work inner_;
  std::shared_ptr<OverlapInterval> interval_;
  std::shared_ptr<OverlapInterval> in_flight_;
  bool from_wait_;
};

}  // namespace

TimedCommunicator::TimedCommunicator(Communicator& inner, Measure measure)
    : inner_(&inner), measure_(measure) {}

TimedCommunicator::~TimedCommunicator() = default;

template <typename Issue>
Work TimedCommunicator::timed(const Stream& stream, std::int64_t bytes, Issue&& issue) {
  // An operation that throws leaves its intervals unended: it adds nothing.
  if (fresh_window_ && stream.device().is_cuda()) {
    meter_.start_window(stream);  // GPU marks are placed on the device's timeline
  }
  fresh_window_ = false;
  std::shared_ptr<OverlapInterval> interval = meter_.begin(OverlapKind::exposed, stream);
  std::shared_ptr<OverlapInterval> in_flight = meter_.begin(OverlapKind::in_flight, stream);
  Work inner = issue();  // validation errors propagate from here, nothing counted
  window_.ops += 1;
  window_.bytes += bytes;
  if (stream.device().is_cuda()) {
    // GPU: the operation's end, on a side stream that waits for it (the host does not block);
    // that wait is not the caller's, so it is not traced as one.
    if (!side_ || side_->device() != stream.device()) {
      side_ = std::make_unique<Stream>(Stream::create(stream.device()));
    }
    in_flight->wait_for_start(*side_);
    {
      const trace::UntracedWaits untraced;
      inner.wait(*side_);
    }
    in_flight->end(*side_);
  } else {
    // CPU: the end is the first time the host sees the operation complete: at its wait, or at a
    // later issue that finds it complete (whichever comes first).
    poll_in_flight();
    open_.push_back({inner, in_flight});
  }
  return Work(std::make_shared<TimedWork>(std::move(inner), std::move(interval),
                                          std::move(in_flight), measure_ == Measure::from_wait));
}

void TimedCommunicator::poll_in_flight() {
  std::erase_if(open_, [](const Open& o) {
    if (!o.in_flight->ended() && o.work.is_completed()) o.in_flight->end_on_host();
    return o.in_flight->ended();
  });
}

TimedCommunicator::Stats TimedCommunicator::take_stats() {
  poll_in_flight();
  Stats stats = window_;
  const OverlapTotals totals = meter_.take();
  stats.exposed_ms = totals.exposed_ms;
  stats.comm_ms = totals.comm_ms;
  window_ = Stats{};
  return stats;
}

void TimedCommunicator::reset() {
  window_ = Stats{};
  open_.clear();
  meter_.start_window();
  fresh_window_ = true;
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

std::unique_ptr<Communicator> TimedCommunicator::split_with_members(
    int color, int key, const std::string& name, const std::vector<int>& members) {
  return inner_->split(color, key, name, members);
}

}  // namespace quintet::overlap
