// OverlapMeter: how long communication was in flight and how long a stream was exposed to it
// (waited for it), measured from marks recorded on the streams involved. DataParallel (gradient
// reductions) and TimedCommunicator (any collective) record their intervals through it, so comm
// and exposed time are measured one way everywhere.
//
// An interval has a start mark and an end mark. A mark made on a stream is a timing Event recorded
// there (GPU: it completes when the stream reaches it; CPU: the host clock at the record, Event's
// CPU behaviour) together with the host clock (std::chrono::steady_clock) read at the record; a
// mark made on the host (end_on_host) is the host clock only. Only the first end of an interval
// counts; later ends are ignored.
//
// A window holds the intervals begun since it started. totals() adds up its ENDED intervals, in
// milliseconds, by kind:
//   in_flight -> comm_ms     the length of the UNION of the intervals (concurrent operations count
//                            once), each placed on a timeline that starts at the window's origin:
//                            an event recorded by start_window(origin stream). Positions are the
//                            events' times when the origin and both marks are events of one
//                            device, else host clocks (from the host clock read at start_window).
//   exposed   -> exposed_ms  the SUM of the intervals' lengths end - start: the events' elapsed
//                            time when both marks are events of one device, else the host clocks'
//                            (an interval ended on the host, or begun on a CPU stream and ended
//                            on a CUDA one). Each is clamped at 0: a waiting stream that is not
//                            ordered after the issuing one (a one-rank operation that queues
//                            nothing) may pass its end before the start.
// An interval never ended adds nothing. The meter measures; what an interval stands for (issue to
// completion, issue to the end of a wait, a stream blocked at the end of backward) is its user's
// choice, documented there (data_parallel.hpp, timed_communicator.hpp).
//
// Threading: start_window, begin, totals, take on one thread at a time (the issuing thread); an
// interval may be ended from any thread. Ownership: an interval is shared by the meter and the
// handles begin() gives out; once no handle is left and its window is over, the meter reuses its
// events for a later interval (no event is created per operation in steady state).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "quintet/core/stream.hpp"

namespace quintet::overlap {

enum class OverlapKind {
  in_flight,  // an operation from issue to completion: summed as a union (comm_ms)
  exposed,    // a stream (or the host) waiting for communication: summed as lengths (exposed_ms)
};

// One window's totals (see the header comment), over the intervals that have ended.
struct OverlapTotals {
  double comm_ms = 0.0;     // union of the in_flight intervals
  double exposed_ms = 0.0;  // sum of the exposed intervals, each clamped at 0
  int in_flight = 0;        // in_flight intervals counted
  int exposed = 0;          // exposed intervals counted
};

// One measured interval. Begun by OverlapMeter::begin; ended by whoever holds a handle.
class OverlapInterval {
 public:
  // Ends the interval with a mark recorded on stream now (after the work queued there so far),
  // unless it has ended already. Any thread.
  void end(const Stream& stream);
  // Ends the interval with the host clock now, unless it has ended already. Any thread.
  void end_on_host();
  // Moves the start to a mark recorded on stream now (and to the host clock now), unless the
  // interval has ended; restart_on_host moves the host start only. Any thread.
  void restart_at(const Stream& stream);
  void restart_on_host();
  bool ended() const;
  // Makes stream wait (on the device, not the host) for the start mark, so that an end recorded on
  // stream afterwards cannot precede the start.
  void wait_for_start(const Stream& stream) const;
  OverlapKind kind() const { return kind_; }

  // ---- Implementation details below ----
  using Clock = std::chrono::steady_clock;

 private:
  friend class OverlapMeter;
  void restart(OverlapKind kind, const Stream& stream);  // reuse for a new interval
  // end - start in ms (exposed), or (start, end) from the origin (in_flight); block on the events.
  double length_ms() const;
  std::pair<double, double> position_ms(const std::optional<Event>& origin,
                                        Clock::time_point host_origin) const;

  mutable std::mutex mutex_;
  OverlapKind kind_ = OverlapKind::exposed;
  std::optional<Event> start_;
  std::optional<Event> end_;  // kept for reuse; meaningful when end_recorded_
  Clock::time_point host_start_;
  std::optional<Clock::time_point> host_end_;  // set by either end: the interval has ended
  bool end_recorded_ = false;                  // ended on a stream (end_ holds its mark)
};

class OverlapMeter {
 public:
  OverlapMeter() = default;
  OverlapMeter(const OverlapMeter&) = delete;
  OverlapMeter& operator=(const OverlapMeter&) = delete;

  // Starts a new window: forgets every interval of the current one (ended or not) and records the
  // origin of the in_flight timeline on stream. The form without a stream has a host origin only.
  void start_window(const Stream& origin);
  void start_window();
  // Begins an interval of this window with a start mark recorded on stream now.
  std::shared_ptr<OverlapInterval> begin(OverlapKind kind, const Stream& stream);
  // The window's totals so far. Blocks the host until the marks it reads have completed.
  OverlapTotals totals() const;
  // totals(), then a new window (host origin only) that keeps the intervals that have not ended
  // and whose handle is still held elsewhere: they count in the window in which they end.
  OverlapTotals take();

 private:
  void recycle(std::vector<std::shared_ptr<OverlapInterval>> intervals);

  std::vector<std::shared_ptr<OverlapInterval>> window_;
  std::vector<std::shared_ptr<OverlapInterval>> spare_;  // ended windows' intervals, for reuse
  std::optional<Event> origin_;                          // none for a host-origin window
  OverlapInterval::Clock::time_point host_origin_ = OverlapInterval::Clock::now();
};

// The total length of the union of [first, second] intervals (in any order; an interval with
// second < first counts as empty). The in_flight sum of OverlapMeter::totals.
double union_length(std::vector<std::pair<double, double>> intervals);

}  // namespace quintet::overlap
