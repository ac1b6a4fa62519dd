// The communicators' Watchdog (collectives/watchdog.hpp): completed operations are dropped in issue
// order, the oldest one still pending past the deadline is reported once (within a period), an
// operation a caller still waits for is asked about again, stop() hands back what is pending, and
// bad settings are refused; the expiry message names who is behind when it is known.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/watchdog.hpp"
#include "support/catch.hpp"

using quintet::detail::Watchdog;
using namespace std::chrono_literals;

namespace {

class FakeOp final : public Watchdog::Op {
 public:
  FakeOp(int id, std::vector<int>* retired) : id_(id), retired_(retired) {}
  bool poll() noexcept override { return done.load(); }
  void retired() noexcept override { retired_->push_back(id_); }
  std::string describe() const override { return "op " + std::to_string(id_); }
  std::atomic<bool> done{false};

 private:
  int id_;
  std::vector<int>* retired_;
};

struct Expiries {
  std::mutex mutex;
  std::vector<std::string> ops;
  std::vector<std::chrono::nanoseconds> pending;
  std::chrono::steady_clock::time_point first;
};

}  // namespace

TEST_CASE("completed operations are retired in issue order, never out of it") {
  std::vector<int> retired;
  Watchdog dog("test", 60s, 10ms, [](Watchdog::Op&, std::chrono::nanoseconds) { return true; });
  std::vector<std::shared_ptr<FakeOp>> ops;
  for (int i = 0; i < 4; ++i) {
    ops.push_back(std::make_shared<FakeOp>(i, &retired));
    dog.add(ops.back());
  }
  ops[1]->done = true;  // completes before op 0: held until op 0 completes
  ops[2]->done = true;
  dog.reap();
  CHECK(retired.empty());
  CHECK(dog.pending() == 4);
  ops[0]->done = true;
  dog.reap();
  CHECK(retired == std::vector<int>{0, 1, 2});
  CHECK(dog.pending() == 1);
  ops[3]->done = true;
  dog.add(std::make_shared<FakeOp>(4, &retired));  // add reaps too
  CHECK(retired == std::vector<int>{0, 1, 2, 3});
  auto left = dog.stop();
  REQUIRE(left.size() == 1);
  CHECK(left.front()->describe() == "op 4");
  CHECK(dog.pending() == 0);
}

TEST_CASE("the oldest operation pending past the deadline is reported once, within a period") {
  std::vector<int> retired;
  Expiries seen;
  constexpr auto kTimeout = 300ms, kPeriod = 20ms;
  Watchdog dog("test", kTimeout, kPeriod, [&](Watchdog::Op& op, std::chrono::nanoseconds pending) {
    std::lock_guard lock(seen.mutex);
    if (seen.ops.empty()) seen.first = std::chrono::steady_clock::now();
    seen.ops.push_back(op.describe());
    seen.pending.push_back(pending);
    return true;
  });
  auto done = std::make_shared<FakeOp>(0, &retired);
  auto stuck = std::make_shared<FakeOp>(1, &retired);
  auto later = std::make_shared<FakeOp>(2, &retired);
  const auto start = std::chrono::steady_clock::now();
  dog.add(done);
  dog.add(stuck);
  dog.add(later);
  done->done = true;                 // completes before the deadline: never reported
  const auto give_up = start + 20s;  // a loaded machine delays the thread's wake-ups
  while (std::chrono::steady_clock::now() < give_up) {
    {
      std::lock_guard lock(seen.mutex);
      if (!seen.ops.empty()) break;
    }
    std::this_thread::sleep_for(kPeriod);
  }
  std::this_thread::sleep_for(10 * kPeriod);  // time enough to report it again, wrongly
  {
    std::lock_guard lock(seen.mutex);
    REQUIRE(seen.ops == std::vector<std::string>{"op 1"});  // once, and not the later one
    CHECK(seen.pending[0] >= kTimeout);
    CHECK(seen.first - start >= kTimeout);  // never before the deadline
  }
  CHECK(dog.pending() == 2);              // (takes the lock the thread retired under)
  CHECK(retired == std::vector<int>{0});  // the completed one was dropped by the thread
}

TEST_CASE("an operation whose handler declines is asked about again, one period later") {
  std::vector<int> retired;
  std::atomic<int> asked{0};
  Watchdog dog("test", 50ms, 10ms, [&](Watchdog::Op&, std::chrono::nanoseconds) {
    return ++asked >= 3;  // e.g. a caller still waits for it under its own deadline
  });
  auto op = std::make_shared<FakeOp>(0, &retired);
  dog.add(op);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (asked.load() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  std::this_thread::sleep_for(100ms);
  CHECK(asked.load() == 3);  // dealt with on the third call: no more after it
  op->done = true;
  dog.reap();
  CHECK(retired == std::vector<int>{0});
}

TEST_CASE("an operation completed in time is never reported, and stop() ends the thread") {
  std::vector<int> retired;
  std::atomic<int> asked{0};
  constexpr auto kTimeout = 500ms;
  auto dog = std::make_unique<Watchdog>("test", kTimeout, 10ms,
                                        [&](Watchdog::Op&, std::chrono::nanoseconds) {
                                          ++asked;
                                          return true;
                                        });
  auto op = std::make_shared<FakeOp>(0, &retired);
  dog->add(op);
  op->done = true;  // well before the deadline, however loaded the machine
  std::this_thread::sleep_for(kTimeout + 200ms);
  CHECK(asked.load() == 0);
  CHECK(dog->pending() == 0);  // (takes the lock the thread retired under)
  CHECK(retired == std::vector<int>{0});
  auto pending = std::make_shared<FakeOp>(1, &retired);
  dog->add(pending);
  CHECK(dog->stop().size() == 1);
  REQUIRE_THROWS_QUINTET(dog->add(pending), InvalidArgument, "after stop()");
  std::this_thread::sleep_for(kTimeout + 200ms);  // past the deadline: a stopped thread is silent
  CHECK(asked.load() == 0);
  dog.reset();
}

TEST_CASE("bad settings are refused") {
  auto never = [](Watchdog::Op&, std::chrono::nanoseconds) { return true; };
  REQUIRE_THROWS_QUINTET(Watchdog("bad", 0s, 10ms, never), InvalidArgument, "positive");
  REQUIRE_THROWS_QUINTET(Watchdog("bad", 1s, 0ms, never), InvalidArgument, "positive");
  REQUIRE_THROWS_QUINTET(Watchdog("bad", 1s, 10ms, nullptr), InvalidArgument, "handler");
  CHECK(Watchdog::period_for(3s) == 300ms);
  CHECK(Watchdog::period_for(20ms) == 10ms);
  CHECK(Watchdog::period_for(300s) == 1s);
}

TEST_CASE("the expiry message names who is behind, or says what may have happened") {
  using quintet::detail::expiry_message;
  const std::string named =
      expiry_message("all_reduce #7 on communicator 'dp' (nccl, rank 0 of 2, cuda:0)", 3, 3.04,
                     "rank 1 never reached all_reduce #7 on 'dp (nccl)' (...) (rank 0 waited 3 s)");
  CHECK(
      named ==
      "all_reduce #7 on communicator 'dp' (nccl, rank 0 of 2, cuda:0) did not complete within 3 s "
      "of being issued (3.0 s), and no thread waited for it (the communicator's timeout, "
      "--timeout-s): rank 1 never reached all_reduce #7 on 'dp (nccl)' (...) (rank 0 waited 3 "
      "s); the watchdog aborts the communicator and ends the process");
  const std::string unknown = expiry_message("barrier #2 on communicator 'held'", 0.5, 0.61, "");
  CHECK(unknown.find("within 0.5 s of being issued (0.6 s)") != std::string::npos);
  CHECK(
      unknown.find(": the GPU work it follows never finished, or a rank of the group did not "
                   "issue the matching operation, or is stopped, or failed; the watchdog aborts") !=
      std::string::npos);
}
