// The trace recorder: the ring of events, the GPU slots resolved at end_step, NVTX, and the
// Chrome trace writer (see trace.hpp).
#include "quintet/core/trace.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "quintet/core/config.hpp"
#include "quintet/core/error.hpp"
#if QUINTET_HAS_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace quintet::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

// A GPU range waiting for end_step: its event pair and what it stands for.
struct Slot {
  TraceEvent event;
  std::optional<Event> start;
  std::optional<Event> end;
  bool begun = false;
  bool ended = false;
};

struct Recorder {
  std::mutex mutex;
  TraceOptions options;
  std::deque<TraceEvent> ring;
  std::int64_t dropped = 0;
  std::int64_t step = -1;
  std::vector<Slot> slots;
  std::vector<int> free_slots;
  std::map<std::int64_t, std::pair<double, double>> spans;  // step -> host begin, end
  std::optional<Event> origin;                              // this step's origin on the GPU
  double origin_us = 0.0;                                   // the host clock at its record

  void push(TraceEvent e) {  // with the mutex held
    if (static_cast<std::int64_t>(ring.size()) >= options.capacity) {
      ring.pop_front();
      ++dropped;
    }
    ring.push_back(std::move(e));
  }
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: progress threads may outlive main
  return *r;
}

thread_local int t_kind_override = -1;
thread_local bool t_untraced_waits = false;

// Escapes a string for a JSON string literal.
std::string json_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string_view kind_name(TraceKind kind) {
  switch (kind) {
    case TraceKind::compute:
      return "compute";
    case TraceKind::dp:
      return "dp";
    case TraceKind::tp:
      return "tp";
    case TraceKind::pp:
      return "pp";
    case TraceKind::ep:
      return "ep";
    case TraceKind::cp:
      return "cp";
    case TraceKind::zero:
      return "zero";
    case TraceKind::loader:
      return "loader";
    case TraceKind::h2d:
      return "h2d";
    case TraceKind::other:
      return "other";
  }
  return "other";
}

TraceKind comm_kind(std::string_view n) {
  if (n == "tp" || n == "etp" || n == "tp-cp") return TraceKind::tp;
  if (n == "dp" || n == "edp" || n == "dp-cp" || n == "tp-dp-cp") return TraceKind::dp;
  if (n == "pp" || n == "tp-pp" || n == "embedding") return TraceKind::pp;
  if (n == "ep" || n == "etp-ep") return TraceKind::ep;
  if (n == "cp") return TraceKind::cp;
  return TraceKind::other;
}

double to_us(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

void start(const TraceOptions& options) {
  QUINTET_CHECK(options.capacity > 0, "trace::start: capacity {} must be positive",
                options.capacity);
  Recorder& r = recorder();
  {
    std::lock_guard lock(r.mutex);
    r.options = options;
    r.ring.clear();
    r.dropped = 0;
    r.step = -1;
    r.spans.clear();
    r.slots.clear();
    r.free_slots.clear();
    r.origin.reset();
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void stop() { detail::g_enabled.store(false, std::memory_order_relaxed); }

void begin_step(std::int64_t step, const Stream& origin) {
  if (!enabled()) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.step = step;
  r.spans[step] = {to_us(Clock::now()), 0.0};
  if (origin.device().is_cuda()) {
    if (!r.origin || r.origin->device() != origin.device()) r.origin.emplace(origin.device(), true);
    r.origin_us = to_us(Clock::now());
    r.origin->record(origin);
  }
}

void end_step() {
  if (!enabled()) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  for (int i = 0; i < static_cast<int>(r.slots.size()); ++i) {
    Slot& s = r.slots[i];
    if (!s.begun || !s.ended) continue;
    s.end->synchronize();
    TraceEvent e = std::move(s.event);
    if (r.origin) {
      e.start_us = r.origin_us + 1000.0 * s.start->elapsed_ms(*r.origin);
      e.end_us = r.origin_us + 1000.0 * s.end->elapsed_ms(*r.origin);
    }
    r.push(std::move(e));
    s.begun = s.ended = false;
    r.free_slots.push_back(i);
  }
  // The step ends here: after its own synchronisation and once its GPU ranges have completed.
  if (r.step >= 0) r.spans[r.step].second = to_us(Clock::now());
  r.step = -1;
}

std::vector<TraceEvent> events() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  return {r.ring.begin(), r.ring.end()};
}

std::int64_t dropped() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  return r.dropped;
}

void record_host(TraceEvent event) {
  if (!enabled()) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  if (event.step < 0) event.step = r.step;
  r.push(std::move(event));
}

int begin_gpu(TraceEvent event, const Stream& stream) {
  if (!enabled()) return -1;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  int i = 0;
  if (r.free_slots.empty()) {
    i = static_cast<int>(r.slots.size());
    r.slots.emplace_back();
  } else {
    i = r.free_slots.back();
    r.free_slots.pop_back();
  }
  Slot& s = r.slots[i];
  if (!s.start || s.start->device() != stream.device()) {
    s.start.emplace(stream.device(), true);
    s.end.emplace(stream.device(), true);
  }
  if (event.step < 0) event.step = r.step;
  s.event = std::move(event);
  s.begun = true;
  s.ended = false;
  s.start->record(stream);
  return i;
}

void end_gpu(int slot, const Stream& stream) {
  if (slot < 0) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  if (slot >= static_cast<int>(r.slots.size()) || !r.slots[slot].begun) return;  // restarted
  Slot& s = r.slots[slot];
  s.end->record(stream);
  s.ended = true;
}

Range::Range(TraceKind kind, std::string_view name, const Stream& stream, int lane) {
  if (!enabled()) return;  // the one branch a range costs when tracing is off
  stream_ = &stream;
  begin_slow(kind, name, lane);
}

void Range::begin_slow(TraceKind kind, std::string_view name, int lane) {
  event_.kind = kind;
  event_.name = std::string(name);
  event_.lane = lane;
  if (stream_->device().is_cuda()) {
#if QUINTET_HAS_CUDA
    nvtxRangePushA(event_.name.c_str());
#endif
    pending_ = begin_gpu(event_, *stream_);
  } else {
    event_.start_us = to_us(Clock::now());
  }
}

void Range::end() {
  if (stream_ == nullptr) return;
  end_slow();
  stream_ = nullptr;
}

void Range::end_slow() {
  if (stream_->device().is_cuda()) {
    end_gpu(pending_, *stream_);
#if QUINTET_HAS_CUDA
    nvtxRangePop();
#endif
  } else {
    event_.end_us = to_us(Clock::now());
    record_host(std::move(event_));
  }
}

KindScope::KindScope(TraceKind kind) : previous_(t_kind_override) {
  t_kind_override = static_cast<int>(kind);
}
KindScope::~KindScope() { t_kind_override = previous_; }
int kind_override() { return t_kind_override; }

UntracedWaits::UntracedWaits() : previous_(t_untraced_waits) { t_untraced_waits = true; }
UntracedWaits::~UntracedWaits() { t_untraced_waits = previous_; }
bool waits_traced() { return enabled() && !t_untraced_waits; }

std::int64_t current_step() {
  if (!enabled()) return -1;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  return r.step;
}

void write_chrome_json(const std::string& path, int rank, const std::string& extra_members) {
  const std::vector<TraceEvent> all = events();
  // Threads: 0 compute, 2 loader, then one per communicator (in order of first appearance).
  std::map<std::string, int> comm_tid;
  std::vector<std::string> comm_names;
  for (const TraceEvent& e : all) {
    if (e.kind == TraceKind::compute || e.kind == TraceKind::loader || e.kind == TraceKind::h2d ||
        e.wait)
      continue;
    if (comm_tid.emplace(e.group, 10 + static_cast<int>(comm_names.size())).second)
      comm_names.push_back(e.group);
  }
  std::string out = "{\"traceEvents\": [\n";
  auto thread_name = [&](int tid, std::string_view name) {
    out += fmt::format(
        "{{\"ph\": \"M\", \"pid\": {}, \"tid\": {}, \"name\": \"thread_name\", "
        "\"args\": {{\"name\": \"{}\"}}}},\n",
        rank, tid, json_escape(name));
  };
  out += fmt::format(
      "{{\"ph\": \"M\", \"pid\": {}, \"name\": \"process_name\", \"args\": {{\"name\": \"rank "
      "{}\"}}}},\n",
      rank, rank);
  thread_name(0, "compute");
  thread_name(1, "steps");
  thread_name(2, "loader");
  for (std::size_t i = 0; i < comm_names.size(); ++i)
    thread_name(10 + static_cast<int>(i), "comm " + comm_names[i]);
  // Steps: from begin_step to end_step, on the host clock (not derived from their events).
  std::map<std::int64_t, std::pair<double, double>> steps;
  {
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    for (const auto& [step, span] : r.spans) {
      if (span.second > 0.0) steps.emplace(step, span);  // ended steps only
    }
  }
  for (const auto& [step, span] : steps) {
    out += fmt::format(
        "{{\"ph\": \"X\", \"pid\": {}, \"tid\": 1, \"name\": \"step {}\", \"cat\": \"step\", "
        "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{\"step\": {}}}}},\n",
        rank, step, span.first, span.second - span.first, step);
  }
  for (const TraceEvent& e : all) {
    int tid = e.lane;
    if (!(e.kind == TraceKind::compute || e.kind == TraceKind::loader || e.kind == TraceKind::h2d ||
          e.wait))
      tid = comm_tid[e.group];
    out += fmt::format(
        "{{\"ph\": \"X\", \"pid\": {}, \"tid\": {}, \"name\": \"{}\", \"cat\": \"{}\", "
        "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{\"step\": {}, \"kind\": \"{}\", "
        "\"wait\": {}, \"bytes\": {}, \"group\": \"{}\", \"seq\": {}}}}},\n",
        rank, tid, json_escape(e.name),
        e.wait ? fmt::format("{} wait", kind_name(e.kind)) : std::string(kind_name(e.kind)),
        e.start_us, std::max(0.0, e.end_us - e.start_us), e.step, kind_name(e.kind),
        e.wait ? "true" : "false", e.bytes, json_escape(e.group), e.seq);
  }
  // Drop the last ",\n" (there is always the process name before it).
  out.resize(out.size() - 2);
  out += fmt::format("\n], \"displayTimeUnit\": \"ms\", \"rank\": {}, \"dropped_events\": {}", rank,
                     dropped());
  if (!extra_members.empty()) out += ", " + extra_members;
  out += "}\n";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  QUINTET_CHECK(f != nullptr, "trace: cannot open {} for writing", path);
  const std::size_t written = std::fwrite(out.data(), 1, out.size(), f);
  const int closed = std::fclose(f);
  QUINTET_CHECK(written == out.size() && closed == 0, "trace: writing {} failed", path);
}

}  // namespace quintet::trace
