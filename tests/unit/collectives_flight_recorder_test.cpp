// The flight recorder (issue #44): the ring keeps the last N operations with their states and
// times, wraps around, drops a state change for an operation whose slot was reused, keeps only
// the counters at size 0; the registry dumps every live recorder to flight_rank<r>.json. (Naming
// the laggard from the recorders' progress: collectives_laggard_test.cpp.)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "collectives/flight_recorder.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::detail;

TEST_CASE("the ring keeps the last N operations, oldest first, with their states") {
  FlightRecorder rec("tp", 1, {4, 5}, 4);
  CHECK(rec.snapshot().empty());
  CHECK(rec.progress().enqueued == -1);
  rec.enqueued(0, "all_reduce", DType::bf16, 1024, -1);
  rec.enqueued(1, "send", DType::f32, 8, 0);
  rec.started(0);
  rec.completed(0, true);
  rec.started(1);
  auto ops = rec.snapshot();
  REQUIRE(ops.size() == 2);
  CHECK(ops[0].seq == 0);
  CHECK(ops[0].op == "all_reduce");
  CHECK(ops[0].dtype == DType::bf16);
  CHECK(ops[0].count == 1024);
  CHECK(ops[0].state == FlightState::completed);
  CHECK(ops[0].enqueued_ns > 0);
  CHECK(ops[0].started_ns >= ops[0].enqueued_ns);
  CHECK(ops[0].completed_ns >= ops[0].started_ns);
  CHECK(ops[1].op == "send");
  CHECK(ops[1].peer == 0);
  CHECK(ops[1].state == FlightState::started);
  CHECK(ops[1].completed_ns == 0);
  CHECK(rec.progress().enqueued == 1);
  CHECK(rec.progress().started == 1);
  CHECK(rec.progress().completed == 0);

  // Wraparound: 4 slots, 11 operations; a random number of them still in flight.
  std::mt19937 rng(44);
  const int done = 2 + static_cast<int>(rng() % 6);
  rec.completed(1, false);
  for (int s = 2; s <= 10; ++s) rec.enqueued(s, "all_gather", DType::f32, s, -1);
  for (int s = 2; s <= done; ++s) {
    rec.started(s);  // slots 2..6 were reused by 6..10 when done >= 6: those changes are dropped
    rec.completed(s, true);
  }
  ops = rec.snapshot();
  REQUIRE(ops.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(ops[i].seq == 7 + i);
    CHECK(ops[i].count == 7 + i);
    CHECK(ops[i].state == (7 + i <= done ? FlightState::completed : FlightState::enqueued));
  }
  FlightOp op;
  CHECK_FALSE(rec.find(3, &op));  // overwritten
  REQUIRE(rec.find(9, &op));
  CHECK(op.seq == 9);
  CHECK(rec.progress().completed == done);
}

TEST_CASE("a failed or refused operation is marked failed") {
  FlightRecorder rec("dp", 0, {0, 1}, 8);
  rec.enqueued(0, "all_reduce", DType::f32, 4, -1);
  rec.enqueued(1, "all_reduce", DType::f32, 4, -1);
  rec.started(0);
  rec.completed(0, false);
  rec.completed(1, false);  // refused before it started
  const auto ops = rec.snapshot();
  REQUIRE(ops.size() == 2);
  CHECK(ops[0].state == FlightState::failed);
  CHECK(ops[1].state == FlightState::failed);
  CHECK(ops[1].started_ns == 0);
  CHECK(rec.progress().completed == -1);  // failures do not count as progress
}

TEST_CASE("size 0 keeps the sequence counters only") {
  FlightRecorder rec("pp", 0, {0, 1}, 0);
  rec.enqueued(0, "send", DType::f32, 4, 1);
  rec.started(0);
  rec.completed(0, true);
  rec.enqueued(1, "send", DType::f32, 4, 1);
  CHECK(rec.snapshot().empty());
  CHECK(rec.progress().enqueued == 1);
  CHECK(rec.progress().completed == 0);
}

TEST_CASE("the registry dumps every live recorder as JSON") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("quintet_flight_" + std::to_string(std::random_device{}()));
  FlightRegistry registry(3, 4, dir.string(), 16);
  CHECK(registry.path() == (dir / "flight_rank3.json").string());
  auto tp = std::make_shared<FlightRecorder>("tp", 1, std::vector<int>{2, 3}, 16);
  registry.add(tp);
  for (int i = 0; i < 20; ++i) {  // communicators made and gone: the last 16 are kept
    auto gone =
        std::make_shared<FlightRecorder>("tmp" + std::to_string(i), 0, std::vector<int>{3}, 16);
    registry.add(gone);
    gone->retire();
  }
  registry.add(std::make_shared<FlightRecorder>("dp", 0, std::vector<int>{3}, 16));
  REQUIRE(registry.recorders().size() == 18);
  CHECK(registry.recorders()[1]->name() == "tmp4");
  CHECK(registry.recorders()[17]->name() == "dp");
  tp->enqueued(0, "all_reduce", DType::f32, 64, -1);
  tp->started(0);
  tp->completed(0, true);
  tp->enqueued(1, "broadcast", DType::i64, 2, 0);
  REQUIRE(registry.dump("on demand") == registry.path());
  std::ifstream in(registry.path());
  const nlohmann::json doc = nlohmann::json::parse(in);
  CHECK(doc["rank"] == 3);
  CHECK(doc["world_size"] == 4);
  CHECK(doc["reason"] == "on demand");
  REQUIRE(doc["communicators"].size() == 18);
  CHECK(doc["communicators"][1]["retired"] == true);
  const auto& c = doc["communicators"][0];
  CHECK(c["retired"] == false);
  CHECK(c["name"] == "tp");
  CHECK(c["world_ranks"] == std::vector<int>{2, 3});
  CHECK(c["enqueued"] == 1);
  CHECK(c["completed"] == 0);
  REQUIRE(c["ops"].size() == 2);
  CHECK(c["ops"][1]["op"] == "broadcast");
  CHECK(c["ops"][1]["dtype"] == "i64");
  CHECK(c["ops"][1]["state"] == "enqueued");
  CHECK(c["ops"][1]["peer"] == 0);
  const auto unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  CHECK(std::abs(c["ops"][0]["completed_us"].get<std::int64_t>() - unix_us) < 60'000'000);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a snapshot taken while operations are recorded reads every entry whole") {
  // The issuing thread enqueues, a runner thread starts and completes them in order (the MPI
  // backend's progress thread), a third thread dumps meanwhile (SIGUSR1, a watchdog): every
  // entry it reads is one operation's, in a state and with times that operation had.
  constexpr std::size_t kCapacity = 8;  // small: slots are reused while they are read
  FlightRecorder rec("dp", 0, {0, 1}, kCapacity);
  const char* const names[] = {"all_reduce", "send", "recv"};
  std::atomic<std::int64_t> issued{-1};
  std::atomic<bool> stop{false};
  std::thread runner([&] {
    for (std::int64_t s = 0; !stop.load();) {
      if (s > issued.load(std::memory_order_acquire)) {
        std::this_thread::yield();
        continue;
      }
      rec.started(s);
      rec.completed(s, s % 7 != 3);
      ++s;
    }
  });
  std::int64_t reads = 0, torn = 0, partial = 0;
  std::thread dumper([&] {
    do {  // at least once, after the last operation if this thread starts late
      const auto ops = rec.snapshot();
      reads += static_cast<std::int64_t>(ops.size());
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const FlightOp& op = ops[i];
        const bool whole = op.op == names[op.seq % 3] && op.count == 3 * op.seq &&
                           op.peer == static_cast<int>(op.seq % 5) &&
                           op.dtype == (op.seq % 2 == 0 ? DType::f32 : DType::bf16) &&
                           (i == 0 || op.seq > ops[i - 1].seq);
        const bool timed =
            op.enqueued_ns > 0 && (op.state == FlightState::enqueued) == (op.started_ns == 0) &&
            (op.state == FlightState::enqueued || op.state == FlightState::started) ==
                (op.completed_ns == 0) &&
            // Read on another core: the time-stamp counter is not ordered with the hand-over.
            (op.started_ns == 0 || op.started_ns + 1000 >= op.enqueued_ns) &&
            (op.completed_ns == 0 || op.completed_ns >= op.started_ns) &&
            (op.state != FlightState::failed || op.seq % 7 == 3) &&
            (op.state != FlightState::completed || op.seq % 7 != 3);
        torn += whole ? 0 : 1;
        partial += timed ? 0 : 1;
      }
    } while (!stop.load());
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  std::int64_t s = 0;
  for (; s < 64 || std::chrono::steady_clock::now() < until; ++s) {
    rec.enqueued(s, names[s % 3], s % 2 == 0 ? DType::f32 : DType::bf16, 3 * s,
                 static_cast<int>(s % 5));
    issued.store(s, std::memory_order_release);
    while (s - rec.progress().started > static_cast<std::int64_t>(kCapacity) / 2 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }
  stop.store(true);
  runner.join();
  dumper.join();
  INFO(s << " operations recorded, " << reads << " entries read");
  CHECK(reads > 0);
  CHECK(torn == 0);
  CHECK(partial == 0);
}

// Not a check: the record path's cost, enqueued + started + completed per operation, at the
// default capacity and with the counters only (docs/PERFORMANCE.md). Hidden; run with
//   build/tests/collectives_flight_recorder_test "[bench]"
TEST_CASE("the record path's cost per operation", "[.][bench]") {
  constexpr std::int64_t kOps = 4'000'000;
  for (const std::size_t capacity : {std::size_t{2048}, std::size_t{0}}) {
    FlightRecorder rec("dp", 0, {0, 1}, capacity);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (std::int64_t s = rep * kOps; s < (rep + 1) * kOps; ++s) {
        rec.enqueued(s, "all_reduce", DType::f32, 2, -1);
        rec.started(s);
        rec.completed(s, true);
      }
      const std::chrono::duration<double, std::nano> t = std::chrono::steady_clock::now() - t0;
      best = std::min(best, t.count() / static_cast<double>(kOps));
    }
    std::printf("flight record, capacity %zu: %.1f ns per operation (best of 5 x %lld)\n", capacity,
                best, static_cast<long long>(kOps));
    CHECK(rec.progress().completed == 5 * kOps - 1);
  }
  // The clock it reads three times per operation, and steady_clock for comparison.
  const auto per_read = [&](auto clock) {
    std::int64_t sum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < kOps; ++i) sum += clock();
    const std::chrono::duration<double, std::nano> t = std::chrono::steady_clock::now() - t0;
    CHECK(sum != 0);
    return t.count() / static_cast<double>(kOps);
  };
  std::printf("flight clock: %.1f ns per read; steady_clock: %.1f ns per read\n",
              per_read([] { return flight_clock_now(); }),
              per_read([] { return steady_now_ns(); }));
}
