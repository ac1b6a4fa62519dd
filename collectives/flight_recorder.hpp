// FlightRecorder: what a communicator did last, for the post-mortem of a hang or a failure (the
// counterpart of PyTorch's NCCL flight recorder). FlightRegistry: this process's recorders, dumped
// together as flight_rank<r>.json (scripts/analyze_flight.py reads the dumps of every rank).
//
// A recorder keeps, per communicator, a fixed ring of the last `capacity` operations: sequence
// number, operation, dtype, element count, peer or root, state (enqueued, started, completed,
// failed) and the time of each state. The communicator's sequence counters (the highest operation
// enqueued, started and completed) are kept whatever the capacity; the ranks compare them to name
// the one that is behind when a wait times out (laggard.hpp). Capacity 0 keeps only the counters.
//
// Cost: no allocation, no lock and no read-modify-write per operation (a loop of enqueued, started,
// completed: tests/unit/collectives_flight_recorder_test.cpp "[bench]"); times are read from the
// time-stamp counter (steady_clock where there is none), once per state change, and converted
// when a dump reads them. enqueued() is called by the thread that issues operations (one at a
// time, in sequence order: a communicator is not shared by issuing threads), started() and
// completed() by whoever runs them (in order, after their enqueued()). Each slot is one cache line
// of relaxed atomics: the issuing thread's fields are published by the sequence number, written
// last (a seqlock), and the runner's times by a word (sequence number, state) written after them,
// so a dump taken from another thread at any moment (the SIGUSR1 thread, a watchdog) reads each
// slot whole or skips it, and a state change for an operation whose slot has since been reused by
// a newer one is dropped. The ring is the capacity rounded up to a power of two; the last
// `capacity` operations are reported.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/core/dtype.hpp"

namespace quintet::detail {

enum class FlightState : std::uint8_t { enqueued, started, completed, failed };
std::string_view flight_state_name(FlightState state);

// One operation as a dump reads it. Times are steady_clock nanoseconds since its epoch (0: not
// reached).
struct FlightOp {
  std::int64_t seq = -1;
  std::string_view op;  // a static name: "all_reduce", "send", ...
  DType dtype = DType::f32;
  std::int64_t count = 0;  // elements of the tensor that describes the operation (0: none)
  int peer = -1;           // peer (send, recv, p2p with one peer) or root; -1: none
  FlightState state = FlightState::enqueued;
  std::int64_t enqueued_ns = 0, started_ns = 0, completed_ns = 0;
};

// The highest sequence number enqueued, started and completed (-1: none yet).
struct FlightProgress {
  std::int64_t enqueued = -1;
  std::int64_t started = -1;
  std::int64_t completed = -1;
};

class FlightRecorder {
 public:
  // name: the communicator's; world_ranks[i]: the world rank of its rank i.
  FlightRecorder(std::string name, int rank, std::vector<int> world_ranks, std::size_t capacity);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }  // in the communicator
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  std::size_t capacity() const { return capacity_; }

  // Hot path; never throw. op must be a string with static storage.
  void enqueued(std::int64_t seq, const char* op, DType dtype, std::int64_t count,
                int peer) noexcept;
  void started(std::int64_t seq) noexcept;
  void completed(std::int64_t seq, bool ok) noexcept;

  FlightProgress progress() const noexcept;
  // Its communicator is gone. The registry keeps a few retired recorders: a failure that unwinds
  // a communicator's scope is dumped after it (their progress is not reported to other ranks).
  void retire() noexcept { retired_.store(true, std::memory_order_relaxed); }
  bool retired() const noexcept { return retired_.load(std::memory_order_relaxed); }
  // The operations in the ring, oldest first (those being rewritten at this moment are skipped).
  std::vector<FlightOp> snapshot() const;
  // The entry of seq if the ring still holds it.
  bool find(std::int64_t seq, FlightOp* out) const;

  // ---- implementation details ----
 private:
  // One cache line per operation. The issuing thread writes the operation (tag, op .. enqueued);
  // whoever runs it writes started / completed and then `run`, which says whose they are.
  struct alignas(64) Slot {
    // The operation's seq, written last (release); kEmpty while the slot is free or being written.
    std::atomic<std::uint64_t> tag{kEmpty};
    // seq << 2 | state of the last state change the runner wrote here (started, completed,
    // failed), written after its time (release); an operation whose seq it is not is enqueued.
    std::atomic<std::uint64_t> run{kEmpty};
    std::atomic<const char*> op{nullptr};
    std::atomic<std::int64_t> count{0};
    std::atomic<std::int64_t> enqueued{0}, started{0}, completed{0};  // ticks (0: not reached)
    std::atomic<std::int32_t> peer{-1};
    std::atomic<std::uint8_t> dtype{0};
  };
  static_assert(sizeof(Slot) == 64);
  // Ticks -> steady_clock nanoseconds, measured when a dump reads the ring.
  struct TickScale {
    std::int64_t ticks, ns;
    double ns_per_tick;
    std::int64_t to_ns(std::int64_t t) const;
  };
  static TickScale tick_scale();
  bool find(std::int64_t seq, const TickScale& scale, FlightOp* out) const;
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  static std::uint64_t tag_of(std::int64_t seq, FlightState s) {
    return static_cast<std::uint64_t>(seq) << 2 | static_cast<std::uint64_t>(s);
  }
  Slot& slot(std::int64_t seq) { return slots_[static_cast<std::size_t>(seq) & mask_]; }
  bool read(const Slot& s, const TickScale& scale, FlightOp* out) const;

  const std::string name_;
  const int rank_;
  const std::vector<int> world_ranks_;
  const std::size_t capacity_;
  // capacity_ rounded up to a power of two (none at capacity 0): the slot of seq is seq & mask_.
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::atomic<bool> retired_{false};
  // The issuing thread's counter and the runner's, each on its own cache line (apart from the
  // fields above, which both read on every call).
  alignas(64) std::atomic<std::int64_t> enqueued_{-1};
  alignas(64) std::atomic<std::int64_t> started_{-1}, completed_{-1};
};

// The recorders of one process, and where their dumps go. Shared by quintet::init's World and the
// communicators it makes (MpiOptions::flight); a communicator adds its recorder when it is made.
// Thread-safe.
class FlightRegistry {
 public:
  // rank, world_size: this process's place in the job; dir: where dumps go ("" or "." : the
  // working directory).
  FlightRegistry(int rank, int world_size, std::string dir, std::size_t capacity);

  int rank() const { return rank_; }
  std::size_t capacity() const { return capacity_; }
  // The file this rank dumps to: <dir>/flight_rank<rank>.json.
  std::string path() const;

  // How many retired recorders are kept (the most recently added).
  static constexpr std::size_t kRetiredKept = 16;

  void add(std::shared_ptr<FlightRecorder> recorder);
  // The recorders, in the order they were added: those of live communicators and the last
  // kRetiredKept retired ones.
  std::vector<std::shared_ptr<FlightRecorder>> recorders() const;

  // Writes every recorder to path() (through a temporary file, renamed), with the reason
  // and the time. Returns the path, or "" when it could not be written (the error is logged).
  // Never throws.
  std::string dump(std::string_view reason) noexcept;
  // Dumps once per process for a failure: the first call writes (and returns the path, as dump),
  // later ones return "" at once.
  std::string dump_on_failure(std::string_view reason) noexcept;

 private:
  const int rank_;
  const int world_size_;
  const std::string dir_;
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<FlightRecorder>> recorders_;
  std::mutex dump_mutex_;  // one dump at a time
  std::atomic<bool> failure_dumped_{false};
};

// The world ranks of a split's members (Communicator::split with members): parent_world_ranks[m]
// for each member m, a rank of the parent, in order. Empty when the parent's world ranks are
// unknown (empty) or no members are given. Throws InvalidArgument naming the member that is not a
// rank of the parent.
std::vector<int> split_world_ranks(const std::vector<int>& parent_world_ranks,
                                   const std::vector<int>& members);

// steady_clock's now, in ns since its epoch: the clock the records' times are read in.
std::int64_t steady_now_ns();

// What the record path reads once per state change: the time-stamp counter's ticks
// (steady_now_ns() where there is none). For the record path's bench: its cost is most of it.
std::int64_t flight_clock_now() noexcept;

// Converts a steady_clock time (ns since its epoch) to Unix time in microseconds.
std::int64_t steady_to_unix_us(std::int64_t steady_ns);

}  // namespace quintet::detail
