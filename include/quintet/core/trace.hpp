// Trace recorder: a per-process timeline of compute ranges, communication and loader waits, for
// Chrome / Perfetto traces (chrome://tracing, ui.perfetto.dev) and Nsight Systems.
//
// Off by default. When off, every recording call is one branch on a relaxed atomic (enabled())
// and records nothing, allocates nothing and touches no CUDA. When on, events go into a ring of
// bounded size (TraceOptions::capacity; the oldest are dropped first and counted) under a mutex.
//
// What is recorded, and where its times come from:
//   - compute ranges (trace::Range, TraceKind::compute): the library's GPT records embedding, each
//     block's forward and backward, the head and loss, and the optimizer step; the loader records
//     its waits (loader) and host-to-device copies (h2d).
//   - every communication operation of the MPI and NCCL backends, with its kind (from the
//     communicator's name, see comm_kind(); a KindScope overrides it, e.g. ZeRO's gathers), its
//     bytes, its communicator and its sequence number there;
//   - every wait on one (Work::wait / synchronize): a "wait" event of that kind, on the stream or
//     thread that waited.
// On the GPU, a range is a pair of timing events recorded on its stream (for communication: the
// communicator's comm stream) and resolved after the step, in end_step(): no host
// synchronisation inside the step. Their times are placed on the host clock by the step's origin
// event (begin_step). On the CPU, times are the host clock read at the range's begin and end, by
// the thread that runs it (communication: the communicator's progress thread, or the caller that
// ran the operation in its wait). With CUDA, each GPU range is also an NVTX range (Nsight
// Systems shows the same names), pushed and popped on the host thread around its issue.
//
// Threading: the recording calls are thread-safe. start/stop/begin_step/end_step/events/
// write_chrome_json from one thread (the training loop's).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/core/stream.hpp"

namespace quintet::trace {

enum class TraceKind : std::uint8_t { compute, dp, tp, pp, ep, cp, zero, loader, h2d, other };
inline constexpr int kNumTraceKinds = 10;
std::string_view kind_name(TraceKind kind);  // "compute", "dp", ..., "other"

// The kind of a communicator's operations, from its name (the mesh names communicators after
// their axis, quintet/core/axis.hpp): tp, etp, tp-cp -> tp; dp, edp, dp-cp, tp-dp-cp -> dp;
// pp, tp-pp, embedding -> pp; ep, etp-ep -> ep; cp -> cp; anything else -> other.
TraceKind comm_kind(std::string_view communicator_name);

// One recorded event. Times in microseconds on the host's steady clock (since its epoch).
struct TraceEvent {
  std::string name;  // "block 3 fwd", "all_reduce", "wait all_gather"
  TraceKind kind = TraceKind::compute;
  bool wait = false;  // a wait on communication of `kind` (not the communication itself)
  double start_us = 0.0;
  double end_us = 0.0;
  std::int64_t step = -1;  // the step it was recorded in (begin_step), -1 outside steps
  std::int64_t bytes = 0;  // communication payload (0 for compute)
  std::string group;       // the communicator's name ("" for compute)
  std::int64_t seq = 0;    // the operation's number on its communicator (0 for compute)
  double issue_us = 0.0;   // communication on the CPU: when it was issued (start_us is when it
                           // began to run); 0 elsewhere
  int lane = 0;            // compute: 0 the main thread / compute stream, 2 the loader; the
                           // communication of each communicator gets its own lane when written
};

struct TraceOptions {
  std::int64_t capacity = 1 << 18;  // events kept at most (a ring: the oldest are dropped)
};

// ---- The switch ----
namespace detail {
extern std::atomic<bool> g_enabled;
}
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Clears the recorder and turns recording on / off. stop() keeps what was recorded.
void start(const TraceOptions& options = {});
void stop();

// Marks the start of a step on stream: the origin against which this step's GPU ranges are
// placed on the host clock. end_step() waits for the step's GPU ranges (call it after the step's
// own synchronisation), resolves them into events and closes the step. No-ops when off.
void begin_step(std::int64_t step, const Stream& origin);
void end_step();

// What was recorded (resolved events only, oldest first) and how many were dropped by the ring.
std::vector<TraceEvent> events();
std::int64_t dropped();

// Writes the events as Chrome trace JSON ({"traceEvents": [...]}): one process (pid = rank),
// threads "compute", "loader" and one "comm <group>" per communicator; each event a complete ("X")
// event with its kind as category and its bytes, group, seq and step as args; plus each ended
// step's range, from its begin_step to its end_step on the host clock (recorded there, not taken
// from its events), and the metadata given (JSON object members, e.g. "\"clock_sync_us\": 123.0",
// added to the top level).
void write_chrome_json(const std::string& path, int rank, const std::string& extra_members = {});

// ---- Recording (all no-ops when off) ----

using Clock = std::chrono::steady_clock;
double to_us(Clock::time_point t);

// A range on a stream: begun at construction, ended by end() or the destructor, on the stream
// given at construction (the CPU: the host clock; the GPU: timing events). Not copyable.
class Range {
 public:
  Range(TraceKind kind, std::string_view name, const Stream& stream, int lane = 0);
  ~Range() { end(); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
  void end();

 private:
  void begin_slow(TraceKind kind, std::string_view name, int lane);
  void end_slow();
  const Stream* stream_ = nullptr;  // null: not recording
  int pending_ = -1;                // GPU: the pending slot
  TraceEvent event_;                // CPU: filled at begin
};

// Records a finished host range (a communicator's progress thread, a wait).
void record_host(TraceEvent event);
// Begins a GPU range on stream and returns its slot; end_gpu records its end there. A slot is
// resolved into an event by end_step(). The two calls may come from different threads.
int begin_gpu(TraceEvent event, const Stream& stream);
void end_gpu(int slot, const Stream& stream);

// The kind the communication issued on this thread is recorded as, while the scope lives, in
// place of comm_kind(name): ZeRO's parameter gathers run on the dp communicator as `zero`.
class KindScope {
 public:
  explicit KindScope(TraceKind kind);
  ~KindScope();
  KindScope(const KindScope&) = delete;
  KindScope& operator=(const KindScope&) = delete;

 private:
  int previous_;
};
// While the scope lives, the waits of this thread are not traced (a wait that only marks an
// operation's end for a measurement, not a stall of the caller's compute).
class UntracedWaits {
 public:
  UntracedWaits();
  ~UntracedWaits();
  UntracedWaits(const UntracedWaits&) = delete;
  UntracedWaits& operator=(const UntracedWaits&) = delete;

 private:
  bool previous_;
};
// Whether a wait on this thread is to be recorded now: enabled() and no UntracedWaits scope.
bool waits_traced();
// The step begun by begin_step and not yet ended (-1 if none).
std::int64_t current_step();

// The override of this thread (-1: none), for the backends.
int kind_override();
// The kind to record for an operation issued now on a communicator of this name.
inline TraceKind issue_kind(std::string_view communicator_name) {
  const int o = kind_override();
  return o >= 0 ? static_cast<TraceKind>(o) : comm_kind(communicator_name);
}

}  // namespace quintet::trace
