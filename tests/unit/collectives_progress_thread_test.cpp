// The MPI backend's ProgressThread: operations run one at a time and in submission order, whether
// the thread or a caller blocked in Work::synchronize runs them (work stealing); failures abort
// what was queued after them; bounded waits time out; shutdown drains the queue; a new operation
// is left to its caller for the idle delay; an unbounded wait ends at the communicator's deadline
// with a Timeout and poisons the queue, and one made by a destructor during an exception at 1 s.
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "collectives/mpi/progress_thread.hpp"
#include "support/catch.hpp"

using quintet::Work;
using quintet::detail::ProgressThread;

namespace {
thread_local bool tl_test_thread = false;  // set on the test's own threads, not the progress thread
}  // namespace

TEST_CASE("operations run one at a time, in order, with several threads waiting") {
  constexpr int kOps = 3000, kWaiters = 3;
  std::vector<int> order;
  order.reserve(kOps);
  std::atomic<int> active{0}, overlaps{0};
  std::atomic<int> off_thread{0};  // run by a waiting caller rather than the progress thread
  std::mutex order_mutex;          // only so that a broken exclusion cannot corrupt the vector
  std::vector<Work> works(kOps);
  std::atomic<int> submitted{0};
  {
    ProgressThread thread("test");
    std::vector<std::thread> waiters;
    for (int w = 0; w < kWaiters; ++w) {
      waiters.emplace_back([&, w] {
        tl_test_thread = true;
        std::mt19937 rng(w);
        for (int k = 0; k < 200; ++k) {
          const int n = submitted.load();
          if (n == 0) continue;
          works[std::uniform_int_distribution<int>(0, n - 1)(rng)].synchronize();
        }
      });
    }
    tl_test_thread = true;
    for (int i = 0; i < kOps; ++i) {
      works[i] = thread.submit("op " + std::to_string(i), [&, i] {
        if (active.fetch_add(1) != 0) ++overlaps;
        if (tl_test_thread) ++off_thread;
        {
          std::lock_guard lock(order_mutex);
          order.push_back(i);
        }
        active.fetch_sub(1);
      });
      submitted.store(i + 1);
      if (i % 7 == 0) works[i].synchronize();  // the caller often finds the queue idle
    }
    for (std::thread& t : waiters) t.join();
    works.back().synchronize();
  }
  CHECK(overlaps.load() == 0);
  REQUIRE(order.size() == static_cast<std::size_t>(kOps));
  for (int i = 0; i < kOps; ++i) REQUIRE(order[i] == i);
  for (const Work& w : works) CHECK(w.is_completed());
  INFO("operations run by waiting callers: " << off_thread.load());
  // A caller that waits at once on what it just submitted is faster to the queue than a thread
  // woken from sleep, so some operations (usually most of those) ran on callers.
  CHECK(off_thread.load() > 0);
}

TEST_CASE("a failed operation aborts the ones after it, also when a caller runs them") {
  ProgressThread thread("test");
  std::atomic<int> ran_after{0};
  Work ok = thread.submit("ok", [] {});
  Work bad = thread.submit("bad op", [] { QUINTET_THROW(InvalidArgument, "boom"); });
  std::vector<Work> after;
  for (int i = 0; i < 3; ++i) after.push_back(thread.submit("after", [&] { ++ran_after; }));
  REQUIRE_THROWS_QUINTET(after.back().synchronize(), Aborted, "bad op: ");
  REQUIRE_THROWS_QUINTET(after.back().synchronize(), Aborted, "boom");
  REQUIRE_NOTHROW(ok.synchronize());
  REQUIRE_THROWS_QUINTET(bad.synchronize(), InvalidArgument, "boom");
  REQUIRE_THROWS_QUINTET(after.front().wait(), Aborted, "was not run");
  CHECK(ran_after.load() == 0);
}

TEST_CASE("a bounded wait times out behind a blocked operation; the queue then continues") {
  ProgressThread thread("test");
  std::atomic<bool> release{false};
  std::atomic<bool> second_ran{false};
  Work blocked = thread.submit("blocked", [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  Work second = thread.submit("second op", [&] { second_ran = true; });
  REQUIRE_THROWS_QUINTET(second.wait_for(std::chrono::milliseconds(30)), Timeout, "second op");
  CHECK_FALSE(second.is_completed());
  CHECK_FALSE(second_ran.load());
  release = true;
  REQUIRE_NOTHROW(second.synchronize());
  CHECK(second_ran.load());
  CHECK(blocked.is_completed());
}

TEST_CASE("shutdown runs every queued operation; their Works stay valid") {
  std::atomic<int> ran{0};
  std::vector<Work> works;
  {
    ProgressThread thread("test");
    for (int i = 0; i < 100; ++i) works.push_back(thread.submit("op", [&] { ++ran; }));
  }
  CHECK(ran.load() == 100);
  for (const Work& w : works) REQUIRE_NOTHROW(w.synchronize());
}

TEST_CASE("a new operation is left to its caller for the idle delay, then the thread starts it") {
  using std::chrono::milliseconds;
  using Clock = std::chrono::steady_clock;
  {
    // A delay no scheduling hiccup outlasts: the caller, waiting at once, always runs it.
    ProgressThread thread("test", std::chrono::seconds(5));
    std::thread::id ran_on;
    Work w = thread.submit("waited", [&] { ran_on = std::this_thread::get_id(); });
    w.synchronize();
    CHECK(ran_on == std::this_thread::get_id());
  }
  for (const auto delay : {milliseconds(0), milliseconds(20)}) {
    INFO("idle start delay " << delay.count() << " ms");
    // Nobody waits (is_completed runs nothing): the thread starts it, no sooner than the delay.
    ProgressThread thread("test", delay);
    std::thread::id ran_on;
    std::atomic<bool> started{false};
    Clock::time_point start_time;
    const Clock::time_point submitted = Clock::now();
    Work w = thread.submit("not waited", [&] {
      start_time = Clock::now();
      ran_on = std::this_thread::get_id();
      started = true;
    });
    const Clock::time_point give_up = submitted + std::chrono::seconds(60);
    while (!w.is_completed() && Clock::now() < give_up)
      std::this_thread::sleep_for(milliseconds(1));
    REQUIRE(w.is_completed());
    CHECK(started.load());
    CHECK(ran_on != std::this_thread::get_id());
    CHECK(start_time - submitted >= delay);
  }
}

// Deadlines (issue #21). A task blocked on a flag stands for an MPI call whose peers never come.
TEST_CASE("an unbounded wait ends at the deadline with a Timeout; the queue is then poisoned") {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> release{false}, started{false};
  {
    ProgressThread thread("dp", std::chrono::microseconds(0), 300ms);
    Work stuck = thread.submit("all_reduce #7 on communicator 'dp'", [&] {
      started = true;
      while (!release) std::this_thread::sleep_for(1ms);
    });
    Work queued = thread.submit("broadcast #8 on communicator 'dp'", [] {});
    const Clock::time_point give_up = Clock::now() + 60s;
    while (!started && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
    REQUIRE(started.load());  // the thread runs it: the wait below sleeps
    const auto t0 = Clock::now();
    REQUIRE_THROWS_QUINTET(stuck.synchronize(), Timeout,
                           "all_reduce #7 on communicator 'dp' did not finish within 0.3 s");
    CHECK(Clock::now() - t0 >= 250ms);
    // Queued behind it, and submitted after: they fail at once, naming the timeout.
    REQUIRE_THROWS_QUINTET(queued.synchronize(), Aborted, "timed out: all_reduce #7");
    REQUIRE_THROWS_QUINTET(thread.submit("barrier #9", [] {}).synchronize(), Aborted,
                           "timed out: all_reduce #7");
    CHECK(thread.broken());
    // A bounded wait still only reports "not yet".
    CHECK_FALSE(stuck.is_completed());
    REQUIRE_THROWS_QUINTET(stuck.wait_for(10ms), Timeout, "did not finish within 10 ms");
    release = true;  // the peers come after all: the operation ends, and the thread with it
  }
}

namespace {
// Waits for work in its destructor, as GradientReducer does, swallowing the error.
struct WaitsWhenDestroyed {
  Work work;
  bool* threw;
  ~WaitsWhenDestroyed() {
    try {
      work.synchronize();
    } catch (const quintet::Error& e) {
      *threw = e.code() == quintet::ErrorCode::Timeout;
    }
  }
};
}  // namespace

TEST_CASE("a wait in a destructor run by an exception is bounded by 1 s, not the timeout") {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> release{false}, started{false};
  ProgressThread thread("tp", std::chrono::microseconds(0), std::chrono::seconds(300));
  Work stuck = thread.submit("all_gather #3 on communicator 'tp'", [&] {
    started = true;
    while (!release) std::this_thread::sleep_for(1ms);
  });
  const Clock::time_point give_up = Clock::now() + 60s;
  while (!started && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
  REQUIRE(started.load());
  bool threw = false;
  const auto t0 = Clock::now();
  try {
    WaitsWhenDestroyed guard{stuck, &threw};
    throw std::runtime_error("this rank failed");
  } catch (const std::runtime_error&) {
  }
  const auto waited = Clock::now() - t0;
  CHECK(threw);
  CHECK(waited >= 900ms);
  CHECK(waited < 60s);  // 1 s, with room for a loaded machine; not the 300 s timeout
  release = true;
}
