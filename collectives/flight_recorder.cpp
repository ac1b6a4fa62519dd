#include "collectives/flight_recorder.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif
#include <bit>
#include <filesystem>
#include <thread>

#include <fstream>
#include <nlohmann/json.hpp>

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

// The hot path's clock: the time-stamp counter where there is one (a few ns to read, against
// ~40 ns for steady_clock, which the recorder would read three times per operation), converted to
// steady_clock time when a dump reads it; steady_clock nanoseconds elsewhere.
#if defined(__x86_64__) || defined(__i386__)
std::int64_t ticks() { return static_cast<std::int64_t>(__rdtsc()); }
constexpr bool kTicksAreNs = false;
#else
std::int64_t ticks() { return steady_now_ns(); }
constexpr bool kTicksAreNs = true;
#endif

struct TickAnchor {
  std::int64_t ticks, ns;
};
// Taken once, when the first recorder is made.
const TickAnchor& tick_anchor() {
  static const TickAnchor anchor{ticks(), steady_now_ns()};
  return anchor;
}

}  // namespace

FlightRecorder::TickScale FlightRecorder::tick_scale() {
  const TickAnchor& a = tick_anchor();
  if (kTicksAreNs) return TickScale{a.ticks, a.ns, 1.0};
  // Measured against steady_clock since the anchor, at least 2 ms apart.
  std::int64_t t = 0, ns = 0;
  for (;;) {
    ns = steady_now_ns();
    t = ticks();
    if (ns - a.ns >= 2'000'000 && t > a.ticks) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return TickScale{a.ticks, a.ns,
                   static_cast<double>(ns - a.ns) / static_cast<double>(t - a.ticks)};
}

std::int64_t FlightRecorder::TickScale::to_ns(std::int64_t t) const {
  if (t == 0) return 0;
  return ns + static_cast<std::int64_t>(static_cast<double>(t - ticks) * ns_per_tick);
}

std::string_view flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::enqueued:
      return "enqueued";
    case FlightState::started:
      return "started";
    case FlightState::completed:
      return "completed";
    case FlightState::failed:
      return "failed";
  }
  return "unknown";
}

std::vector<int> split_world_ranks(const std::vector<int>& parent_world_ranks,
                                   const std::vector<int>& members) {
  std::vector<int> out;
  if (parent_world_ranks.empty()) return out;
  out.reserve(members.size());
  for (const int m : members) {
    QUINTET_CHECK(m >= 0 && static_cast<std::size_t>(m) < parent_world_ranks.size(),
                  "split member {} is not a rank of the parent's {}", m, parent_world_ranks.size());
    out.push_back(parent_world_ranks[static_cast<std::size_t>(m)]);
  }
  return out;
}

std::int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::int64_t flight_clock_now() noexcept { return ticks(); }

std::int64_t steady_to_unix_us(std::int64_t steady_ns) {
  if (steady_ns == 0) return 0;
  const auto unix_now = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  return unix_now - (steady_now_ns() - steady_ns) / 1000;
}

namespace {

std::size_t ring_size(std::size_t capacity) { return capacity == 0 ? 0 : std::bit_ceil(capacity); }

}  // namespace

FlightRecorder::FlightRecorder(std::string name, int rank, std::vector<int> world_ranks,
                               std::size_t capacity)
    : name_(std::move(name)),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      capacity_(capacity),
      slots_(ring_size(capacity)),
      mask_(slots_.empty() ? 0 : slots_.size() - 1) {
  tick_anchor();
}

void FlightRecorder::enqueued(std::int64_t seq, const char* op, DType dtype, std::int64_t count,
                              int peer) noexcept {
  enqueued_.store(seq, std::memory_order_relaxed);
  if (slots_.empty()) return;
  Slot& s = slot(seq);
  s.tag.store(kEmpty, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // a reader sees kEmpty before the fields
  s.op.store(op, std::memory_order_relaxed);
  s.count.store(count, std::memory_order_relaxed);
  s.peer.store(peer, std::memory_order_relaxed);
  s.dtype.store(static_cast<std::uint8_t>(dtype), std::memory_order_relaxed);
  s.enqueued.store(ticks(), std::memory_order_relaxed);
  // started, completed and run keep an older operation's: `run` says they are not this one's.
  s.tag.store(static_cast<std::uint64_t>(seq), std::memory_order_release);
}

// started and completed write plain stores, no read-modify-write: an operation's state changes
// are made by whoever runs it, after its enqueued() (the queue's lock orders them) and in
// sequence order. A change for an operation whose slot holds a newer one is dropped (the tag
// says so; a change racing with that newer enqueued() is one `run` shows as not the newer's).
void FlightRecorder::started(std::int64_t seq) noexcept {
  started_.store(seq, std::memory_order_relaxed);
  if (slots_.empty()) return;
  Slot& s = slot(seq);
  if (s.tag.load(std::memory_order_relaxed) != static_cast<std::uint64_t>(seq)) return;
  // A reader that sees this time also sees the enqueued() before it (and so a newer tag).
  std::atomic_thread_fence(std::memory_order_release);
  s.started.store(ticks(), std::memory_order_relaxed);
  s.run.store(tag_of(seq, FlightState::started), std::memory_order_release);
}

void FlightRecorder::completed(std::int64_t seq, bool ok) noexcept {
  if (ok) completed_.store(seq, std::memory_order_relaxed);  // a failure is no progress
  if (slots_.empty()) return;
  Slot& s = slot(seq);
  if (s.tag.load(std::memory_order_relaxed) != static_cast<std::uint64_t>(seq)) return;
  std::atomic_thread_fence(std::memory_order_release);
  // An operation refused before it started (an earlier one failed) goes from enqueued.
  if (s.run.load(std::memory_order_relaxed) != tag_of(seq, FlightState::started)) {
    s.started.store(0, std::memory_order_relaxed);
  }
  s.completed.store(ticks(), std::memory_order_relaxed);
  s.run.store(tag_of(seq, ok ? FlightState::completed : FlightState::failed),
              std::memory_order_release);
}

FlightProgress FlightRecorder::progress() const noexcept {
  return FlightProgress{enqueued_.load(std::memory_order_relaxed),
                        started_.load(std::memory_order_relaxed),
                        completed_.load(std::memory_order_relaxed)};
}

bool FlightRecorder::read(const Slot& s, const TickScale& scale, FlightOp* out) const {
  // A state change made while it is read is read again; a slot rewritten for a newer operation
  // meanwhile, or changing on every try, is skipped.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::uint64_t tag = s.tag.load(std::memory_order_acquire);
    if (tag == kEmpty) return false;
    FlightOp op;
    op.seq = static_cast<std::int64_t>(tag);
    const char* name = s.op.load(std::memory_order_relaxed);
    op.op = name != nullptr ? std::string_view(name) : std::string_view("?");
    op.count = s.count.load(std::memory_order_relaxed);
    op.peer = s.peer.load(std::memory_order_relaxed);
    op.dtype = static_cast<DType>(s.dtype.load(std::memory_order_relaxed));
    op.enqueued_ns = s.enqueued.load(std::memory_order_relaxed);
    const std::uint64_t run = s.run.load(std::memory_order_acquire);
    const std::int64_t started = s.started.load(std::memory_order_relaxed);
    const std::int64_t completed = s.completed.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.tag.load(std::memory_order_relaxed) != tag) return false;  // rewritten meanwhile
    if (s.run.load(std::memory_order_relaxed) != run) continue;      // its state changed
    if (run != kEmpty && (run >> 2) == tag) {
      op.state = static_cast<FlightState>(run & 3);
      op.started_ns = started;
      if (op.state != FlightState::started) op.completed_ns = completed;
    }
    op.enqueued_ns = scale.to_ns(op.enqueued_ns);
    op.started_ns = scale.to_ns(op.started_ns);
    op.completed_ns = scale.to_ns(op.completed_ns);
    *out = op;
    return true;
  }
  return false;
}

std::vector<FlightOp> FlightRecorder::snapshot() const {
  std::vector<FlightOp> ops;
  const std::int64_t last = enqueued_.load(std::memory_order_relaxed);
  if (slots_.empty() || last < 0) return ops;
  const auto n = static_cast<std::int64_t>(capacity_);
  ops.reserve(capacity_);
  const TickScale scale = tick_scale();
  for (std::int64_t seq = std::max<std::int64_t>(0, last - n + 1); seq <= last; ++seq) {
    FlightOp op;
    if (find(seq, scale, &op)) ops.push_back(op);
  }
  return ops;
}

bool FlightRecorder::find(std::int64_t seq, FlightOp* out) const {
  return find(seq, tick_scale(), out);
}

bool FlightRecorder::find(std::int64_t seq, const TickScale& scale, FlightOp* out) const {
  // The last capacity_ operations only (the ring may hold a few more).
  if (slots_.empty() || seq < 0 ||
      seq <= enqueued_.load(std::memory_order_relaxed) - static_cast<std::int64_t>(capacity_)) {
    return false;
  }
  FlightOp op;
  if (!read(slots_[static_cast<std::size_t>(seq) & mask_], scale, &op) || op.seq != seq) {
    return false;
  }
  *out = op;
  return true;
}

FlightRegistry::FlightRegistry(int rank, int world_size, std::string dir, std::size_t capacity)
    : rank_(rank), world_size_(world_size), dir_(std::move(dir)), capacity_(capacity) {}

std::string FlightRegistry::path() const {
  const std::string name = fmt::format("flight_rank{}.json", rank_);
  return dir_.empty() ? name : (std::filesystem::path(dir_) / name).string();
}

void FlightRegistry::add(std::shared_ptr<FlightRecorder> recorder) {
  std::lock_guard lock(mutex_);
  recorders_.push_back(std::move(recorder));
  std::size_t retired = 0;
  for (const auto& r : recorders_) retired += r->retired() ? 1 : 0;
  // Drop the oldest retired ones beyond what is kept.
  std::erase_if(recorders_, [&](const std::shared_ptr<FlightRecorder>& r) {
    if (retired <= kRetiredKept || !r->retired()) return false;
    --retired;
    return true;
  });
}

std::vector<std::shared_ptr<FlightRecorder>> FlightRegistry::recorders() const {
  std::lock_guard lock(mutex_);
  return recorders_;
}

std::string FlightRegistry::dump(std::string_view reason) noexcept {
  try {
    std::lock_guard lock(dump_mutex_);
    nlohmann::json communicators = nlohmann::json::array();
    for (const auto& rec : recorders()) {
      const FlightProgress p = rec->progress();
      nlohmann::json ops = nlohmann::json::array();
      for (const FlightOp& op : rec->snapshot()) {
        ops.push_back({{"seq", op.seq},
                       {"op", op.op},
                       {"dtype", dtype_name(op.dtype)},
                       {"count", op.count},
                       {"peer", op.peer},
                       {"state", flight_state_name(op.state)},
                       {"enqueued_us", steady_to_unix_us(op.enqueued_ns)},
                       {"started_us", steady_to_unix_us(op.started_ns)},
                       {"completed_us", steady_to_unix_us(op.completed_ns)}});
      }
      communicators.push_back({{"name", rec->name()},
                               {"rank", rec->rank()},
                               {"world_ranks", rec->world_ranks()},
                               {"enqueued", p.enqueued},
                               {"started", p.started},
                               {"completed", p.completed},
                               {"capacity", rec->capacity()},
                               {"retired", rec->retired()},
                               {"ops", std::move(ops)}});
    }
    const nlohmann::json doc = {{"version", 1},
                                {"rank", rank_},
                                {"world_size", world_size_},
                                {"reason", std::string(reason)},
                                {"time_us", steady_to_unix_us(steady_now_ns())},
                                {"communicators", std::move(communicators)}};
    const std::string target = path();
    if (!dir_.empty()) std::filesystem::create_directories(dir_);
    const std::string tmp = target + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << doc.dump(1) << '\n';
      f.close();
      QUINTET_CHECK(f.good(), "could not write {}", tmp);
    }
    std::filesystem::rename(tmp, target);
    // The reason is in the file; whoever failed has printed it already.
    log::info("flight recorder: wrote {}", target);
    return target;
  } catch (const std::exception& e) {
    log::error("flight recorder: could not dump to {}: {}", path(), e.what());
  } catch (...) {
  }
  return {};
}

std::string FlightRegistry::dump_on_failure(std::string_view reason) noexcept {
  if (failure_dumped_.exchange(true)) return {};
  return dump(reason);
}

}  // namespace quintet::detail
