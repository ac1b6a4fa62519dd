#include "quintet/collectives/timed_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/core/stream.hpp"

namespace quintet {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::int64_t bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

}  // namespace

// One operation's interval. The start is recorded by the issuing thread before the Work exists;
// the end by whichever thread completes the Work first; take_stats reads it: hence the mutex.
struct TimedCommunicator::Interval {
  explicit Interval(const Device& device) : start(device, /*timing=*/true) {}

  std::mutex mutex;
  Event start;
  Clock::time_point host_start;
  std::optional<Event> end;                   // ended by wait(stream)
  std::optional<Clock::time_point> host_end;  // ended by wait(stream) or on the host

  bool ended() const { return host_end.has_value(); }

  // end - start in ms; blocks until both events have completed. Events of different devices (a
  // CPU issue stream and a CUDA wait stream) cannot be compared: the host clocks are used then.
  // A waiting stream that is not ordered after the issuing one (a one-rank op that queues nothing
  // there) may pass its end before the start: it was exposed to nothing, hence the clamp at 0.
  double elapsed_ms() const {
    if (end && end->device() == start.device()) {
      start.synchronize();
      end->synchronize();
      return std::max(0.0, static_cast<double>(end->elapsed_ms(start)));
    }
    return std::max(0.0, ms_between(host_start, *host_end));
  }
};

namespace {

// The Work of a timed operation: forwards to the inner Work and ends the interval on the first
// completion.
class TimedWork final : public WorkImpl {
 public:
  TimedWork(Work inner, std::shared_ptr<TimedCommunicator::Interval> interval)
      : inner_(std::move(inner)), interval_(std::move(interval)) {}

  void wait(const Stream& stream) override {
    inner_.wait(stream);
    std::lock_guard<std::mutex> lock(interval_->mutex);
    if (interval_->ended()) return;
    // The end is recorded on the waiting stream after its wait: it completes when the stream can
    // continue past the operation.
    Event end(stream.device(), /*timing=*/true);
    end.record(stream);
    interval_->end.emplace(std::move(end));
    interval_->host_end = Clock::now();
  }

  bool synchronize_for(std::chrono::nanoseconds timeout) override {
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
    std::lock_guard<std::mutex> lock(interval_->mutex);
    if (!interval_->ended()) interval_->host_end = Clock::now();
    return true;
  }

  bool is_completed() override { return inner_.is_completed(); }

  std::string describe() const override { return inner_.describe(); }

 private:
  Work inner_;
  std::shared_ptr<TimedCommunicator::Interval> interval_;
};

}  // namespace

TimedCommunicator::TimedCommunicator(Communicator& inner) : inner_(&inner) {}

TimedCommunicator::~TimedCommunicator() = default;

template <typename Issue>
Work TimedCommunicator::timed(const Stream& stream, std::int64_t bytes, Issue&& issue) {
  auto interval = std::make_shared<Interval>(stream.device());
  interval->start.record(stream);
  interval->host_start = Clock::now();
  Work inner = issue();  // validation errors propagate from here, nothing counted
  window_.ops += 1;
  window_.bytes += bytes;
  pending_.push_back(interval);
  return Work(std::make_shared<TimedWork>(std::move(inner), std::move(interval)));
}

TimedCommunicator::Stats TimedCommunicator::take_stats() {
  Stats stats = window_;
  std::vector<std::shared_ptr<Interval>> open;
  for (auto& interval : pending_) {
    std::lock_guard<std::mutex> lock(interval->mutex);
    if (interval->ended()) {
      stats.exposed_ms += interval->elapsed_ms();
    } else if (interval.use_count() > 1) {
      open.push_back(interval);  // its Work is alive: it may still end, in a later window
    }
  }
  window_ = Stats{};
  pending_ = std::move(open);
  return stats;
}

void TimedCommunicator::reset() {
  window_ = Stats{};
  pending_.clear();
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
