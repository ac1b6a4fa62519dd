// OverlapMeter on the CPU: the union of in-flight intervals against hand-computed unions, and the
// totals of real intervals against host-clock bounds read around each mark by the test itself
// (lower and upper bounds only, so a slow machine cannot fail them); first end wins, unended
// intervals count nothing, take() carries open intervals into the next window.
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "quintet/parallel/overlap/overlap_meter.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

double ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A mark's time is known to lie in [before, after].
struct Bounds {
  Clock::time_point before, after;
};

template <typename F>
Bounds timed(F&& f) {
  Bounds b;
  b.before = Clock::now();
  f();
  b.after = Clock::now();
  return b;
}

}  // namespace

TEST_CASE("union_length: hand-computed unions") {
  CHECK(overlap::union_length({}) == 0.0);
  CHECK(overlap::union_length({{1.0, 4.0}}) == 3.0);
  CHECK(overlap::union_length({{0.0, 2.0}, {1.0, 3.0}, {5.0, 6.0}}) == 4.0);    // [0,3] + [5,6]
  CHECK(overlap::union_length({{5.0, 6.0}, {0.0, 10.0}, {2.0, 3.0}}) == 10.0);  // nested, unsorted
  CHECK(overlap::union_length({{0.0, 1.0}, {1.0, 2.0}}) == 2.0);                // touching
  CHECK(overlap::union_length({{3.0, 1.0}}) == 0.0);                            // reversed: empty
  CHECK(overlap::union_length({{0.0, 1.0}, {3.0, 2.0}, {4.0, 6.0}}) == 3.0);
}

TEST_CASE("in-flight intervals add up as a union, exposed ones as a sum") {
  const Stream cpu;
  overlap::OverlapMeter meter;
  meter.start_window(cpu);
  std::shared_ptr<overlap::OverlapInterval> a, b, x, y;
  // a: [A0, A1], b: [B0, B1] overlapping (A0 < B0 < A1 < B1); x, y: the same shape, exposed.
  const Bounds a0 = timed([&] {
    a = meter.begin(overlap::OverlapKind::in_flight, cpu);
    x = meter.begin(overlap::OverlapKind::exposed, cpu);
  });
  std::this_thread::sleep_for(15ms);
  const Bounds b0 = timed([&] {
    b = meter.begin(overlap::OverlapKind::in_flight, cpu);
    y = meter.begin(overlap::OverlapKind::exposed, cpu);
  });
  std::this_thread::sleep_for(15ms);
  const Bounds a1 = timed([&] {
    a->end(cpu);
    x->end(cpu);
  });
  std::this_thread::sleep_for(15ms);
  const Bounds b1 = timed([&] {
    b->end(cpu);
    y->end_on_host();
  });
  const overlap::OverlapTotals t = meter.totals();
  CHECK(t.in_flight == 2);
  CHECK(t.exposed == 2);
  // Union = B1 - A0; sum = (A1 - A0) + (B1 - B0).
  CHECK(t.comm_ms >= ms(a0.after, b1.before));
  CHECK(t.comm_ms <= ms(a0.before, b1.after));
  CHECK(t.exposed_ms >= ms(a0.after, a1.before) + ms(b0.after, b1.before));
  CHECK(t.exposed_ms <= ms(a0.before, a1.after) + ms(b0.before, b1.after));
  CHECK(t.exposed_ms > t.comm_ms + 10.0);  // the overlap (~15 ms) counts twice in the sum only

  // The first end wins; totals can be read again.
  std::this_thread::sleep_for(5ms);
  a->end(cpu);
  y->end(cpu);
  const overlap::OverlapTotals again = meter.totals();
  CHECK(again.comm_ms == t.comm_ms);
  CHECK(again.exposed_ms == t.exposed_ms);
}

TEST_CASE("unended intervals count nothing; windows forget or carry them") {
  const Stream cpu;
  overlap::OverlapMeter meter;
  meter.start_window();
  std::shared_ptr<overlap::OverlapInterval> open = meter.begin(overlap::OverlapKind::exposed, cpu);
  meter.begin(overlap::OverlapKind::exposed, cpu);  // handle dropped at once: never ended
  overlap::OverlapTotals t = meter.take();
  CHECK(t.exposed == 0);
  CHECK(t.exposed_ms == 0.0);
  CHECK_FALSE(open->ended());
  // open was carried into this window: it counts here, ended from another thread.
  std::this_thread::sleep_for(10ms);
  std::thread([&] { open->end_on_host(); }).join();
  std::shared_ptr<overlap::OverlapInterval> later;
  const Bounds l0 = timed([&] { later = meter.begin(overlap::OverlapKind::exposed, cpu); });
  std::this_thread::sleep_for(5ms);
  const Bounds l1 = timed([&] { later->end(cpu); });
  t = meter.take();
  CHECK(t.exposed == 2);
  CHECK(t.exposed_ms >= 10.0 + ms(l0.after, l1.before));
  // Ended intervals are not carried; start_window forgets even open ones.
  CHECK(meter.take().exposed == 0);
  std::shared_ptr<overlap::OverlapInterval> forgotten =
      meter.begin(overlap::OverlapKind::in_flight, cpu);
  meter.start_window(cpu);
  forgotten->end(cpu);
  CHECK(meter.totals().in_flight == 0);
  // Intervals are reused across windows: a new one starts fresh (not ended).
  for (int i = 0; i < 3; ++i) {
    meter.start_window(cpu);
    std::shared_ptr<overlap::OverlapInterval> n = meter.begin(overlap::OverlapKind::exposed, cpu);
    CHECK_FALSE(n->ended());
    CHECK(n->kind() == overlap::OverlapKind::exposed);
    n->end(cpu);
  }
}
