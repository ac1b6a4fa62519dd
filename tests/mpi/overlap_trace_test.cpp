// The trace recorder (quintet/core/trace.hpp) on CPU ranks: nothing is recorded while it is off;
// when on, compute ranges, every MPI operation (with its kind from the communicator's name, its
// bytes and sequence number) and every wait on one are recorded inside their step; ZeRO's kind
// override; the bounded ring; the Chrome JSON; find_stragglers names a rank made late on
// purpose; TimedCommunicator's in-flight time covers its exposed time.
#include <mpi.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/trace.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/overlap/straggler.hpp"
#include "quintet/parallel/overlap/timed_communicator.hpp"
#include "support/catch.hpp"
#include "tp_support.hpp"  // cpu_world

using namespace quintet;
using namespace std::chrono_literals;

namespace {

const Stream kCpu;
using tp_test::cpu_world;

std::vector<trace::TraceEvent> of_kind(const std::vector<trace::TraceEvent>& all,
                                       trace::TraceKind kind, bool wait) {
  std::vector<trace::TraceEvent> out;
  for (const auto& e : all)
    if (e.kind == kind && e.wait == wait) out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE("off: operations and ranges record nothing") {
  World world = cpu_world();
  trace::start();
  trace::stop();
  REQUIRE_FALSE(trace::enabled());
  Tensor t = Tensor::full({16}, 1.0);
  world.comm().all_reduce(t, ReduceOp::sum).wait();
  { const trace::Range r(trace::TraceKind::compute, "nothing", kCpu); }
  trace::begin_step(1, kCpu);
  trace::end_step();
  CHECK(trace::events().empty());
  CHECK(trace::current_step() == -1);
}

TEST_CASE("on: compute, communication with its kind, and waits, each inside its step") {
  World world = cpu_world();
  const int p = world.size(), me = world.rank();
  ParallelConfig pc;
  pc.tp = p >= 2 ? 2 : 1;
  pc.dp = p / pc.tp;
  if (p % 2 == 1 && p > 1) pc.tp = 1, pc.dp = p;  // odd counts: dp only
  const Mesh mesh(Layout(pc, p), world.comm());
  trace::start();
  for (std::int64_t step = 1; step <= 2; ++step) {
    trace::begin_step(step, kCpu);
    CHECK(trace::current_step() == step);
    {
      const trace::Range r(trace::TraceKind::compute, "block 0 fwd", kCpu);
      Tensor a = Tensor::full({1000}, 1.0 + me);
      mesh.comm(Axis::tp).all_reduce(a, ReduceOp::sum).wait();
      std::this_thread::sleep_for(1ms);
    }
    Tensor g = Tensor::full({4096}, 2.0);
    Work w = mesh.comm(Axis::dp).all_reduce(g, ReduceOp::avg);
    {
      const trace::KindScope zero(trace::TraceKind::zero);
      Tensor shard = Tensor::full({8}, 1.0);
      Tensor full = Tensor::zeros({8 * mesh.size(Axis::dp)});
      mesh.comm(Axis::dp).all_gather(shard, full).wait();
    }
    w.wait();
    trace::end_step();
  }
  trace::stop();
  const std::vector<trace::TraceEvent> all = trace::events();

  const auto compute = of_kind(all, trace::TraceKind::compute, false);
  REQUIRE(compute.size() == 2);
  CHECK(compute[0].name == "block 0 fwd");
  CHECK(compute[0].end_us - compute[0].start_us >= 1000.0);
  if (mesh.size(Axis::dp) > 1) {
    const auto dp = of_kind(all, trace::TraceKind::dp, false);
    REQUIRE(dp.size() == 2);
    CHECK(dp[0].name == "all_reduce");
    CHECK(dp[0].group == "dp");
    CHECK(dp[0].bytes == 4096 * 4);
    CHECK(dp[1].seq > dp[0].seq);
    const auto zero = of_kind(all, trace::TraceKind::zero, false);
    REQUIRE(zero.size() == 2);
    CHECK(zero[0].name == "all_gather");
    CHECK(zero[0].group == "dp");
  }
  if (mesh.size(Axis::tp) > 1) {
    const auto tp = of_kind(all, trace::TraceKind::tp, false);
    REQUIRE(tp.size() == 2);
    CHECK(tp[0].group == "tp");
    // The tp all-reduce is waited at once: the wait is recorded (the caller ran it or waited).
    CHECK(of_kind(all, trace::TraceKind::tp, true).size() >= 1);
  }
  // Steps: every event of step s lies between the first and last event of step s, and its step
  // is 1 or 2; compute ranges enclose their waits.
  for (const auto& e : all) {
    CHECK((e.step == 1 || e.step == 2));
    CHECK(e.end_us >= e.start_us);
  }
  for (const auto& w : all) {
    if (!w.wait || w.kind != trace::TraceKind::tp || w.step != 1) continue;
    CHECK(w.start_us >= compute[0].start_us);
    CHECK(w.end_us <= compute[0].end_us);
  }

  // The JSON names the rank, its communicators' threads and the metadata given.
  const std::string path = "overlap_trace_test_rank" + std::to_string(me) + ".json";
  trace::write_chrome_json(path, me, "\"clock_sync_us\": 1.5");
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string json = ss.str();
  CHECK(json.find("\"traceEvents\": [") == 1);
  CHECK(json.find("\"name\": \"rank " + std::to_string(me) + "\"") != std::string::npos);
  CHECK(json.find("\"clock_sync_us\": 1.5") != std::string::npos);
  CHECK(json.find("\"cat\": \"compute\"") != std::string::npos);
  if (mesh.size(Axis::dp) > 1) CHECK(json.find("comm dp") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("the ring keeps the newest events and counts the dropped ones") {
  trace::start(trace::TraceOptions{.capacity = 3});
  for (int i = 0; i < 5; ++i) {
    trace::TraceEvent e;
    e.name = std::to_string(i);
    trace::record_host(e);
  }
  trace::stop();
  const auto all = trace::events();
  REQUIRE(all.size() == 3);
  CHECK(all.front().name == "2");
  CHECK(all.back().name == "4");
  CHECK(trace::dropped() == 2);
  CHECK_THROWS_AS(trace::start(trace::TraceOptions{.capacity = 0}), Error);
}

TEST_CASE("communicator names map to kinds") {
  using trace::TraceKind;
  CHECK(trace::comm_kind("tp") == TraceKind::tp);
  CHECK(trace::comm_kind("etp") == TraceKind::tp);
  CHECK(trace::comm_kind("tp-dp-cp") == TraceKind::dp);
  CHECK(trace::comm_kind("edp") == TraceKind::dp);
  CHECK(trace::comm_kind("pp") == TraceKind::pp);
  CHECK(trace::comm_kind("etp-ep") == TraceKind::ep);
  CHECK(trace::comm_kind("cp") == TraceKind::cp);
  CHECK(trace::comm_kind("world") == TraceKind::other);
  CHECK(trace::kind_name(TraceKind::zero) == "zero");
}

TEST_CASE("find_stragglers names the rank that is late to every collective") {
  World world = cpu_world();
  const int p = world.size(), me = world.rank();
  ParallelConfig pc;
  pc.dp = p;
  const Mesh mesh(Layout(pc, p), world.comm());
  world.comm().barrier().wait();
  const double sync = trace::to_us(trace::Clock::now());
  trace::start();
  trace::begin_step(1, kCpu);
  const int late = p - 1;
  for (int i = 0; i < 6; ++i) {
    Tensor t = Tensor::full({64}, 1.0);
    if (me != late) {
      Work w = mesh.comm(Axis::dp).all_reduce(t, ReduceOp::sum);
      // Issued (its arrival is recorded): tell the late rank, over MPI itself (not traced).
      int issued = i;
      MPI_Send(&issued, 1, MPI_INT, late, 0, MPI_COMM_WORLD);
      w.wait();
    } else {
      // Late by construction: issues only after every other rank has, and 30 ms after that, so
      // that the clocks' alignment (the barrier's exit on each rank) cannot reorder arrivals.
      for (int k = 0; k < p - 1; ++k) {
        int issued = -1;
        MPI_Recv(&issued, 1, MPI_INT, MPI_ANY_SOURCE, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        REQUIRE(issued == i);
      }
      std::this_thread::sleep_for(30ms);
      mesh.comm(Axis::dp).all_reduce(t, ReduceOp::sum).wait();
    }
  }
  trace::end_step();
  trace::stop();
  const overlap::StragglerReport r =
      overlap::find_stragglers(mesh, world.comm(), trace::events(), sync, kCpu);
  REQUIRE(r.last_at.size() == static_cast<std::size_t>(p));
  if (p == 1) {
    CHECK(r.collectives == 0);
    CHECK(r.straggler() == -1);
  } else {
    // dp and the combined axes that equal it here (dp-cp, tp-dp-cp) each see the 6 all-reduces.
    CHECK(r.collectives >= 6);
    CHECK(r.straggler() == late);
    // Every one, unless a rank's barrier exit (its clock's alignment) was 30 ms late.
    CHECK(2 * r.last_at[static_cast<std::size_t>(late)] > r.collectives);
    std::int64_t total = 0;
    for (const std::int64_t c : r.last_at) total += c;
    CHECK(total == r.collectives);
  }
}

TEST_CASE("TimedCommunicator: the in-flight time covers the exposed time") {
  World world = cpu_world();
  overlap::TimedCommunicator timed(world.comm(), overlap::TimedCommunicator::Measure::from_wait);
  timed.reset();
  Tensor t = Tensor::full({1 << 16}, 1.0);
  Work w = timed.all_reduce(t, ReduceOp::sum);
  std::this_thread::sleep_for(3ms);  // compute between issue and wait: hidden, not exposed
  w.wait();
  const overlap::TimedCommunicator::Stats s = timed.take_stats();
  CHECK(s.ops == 1);
  CHECK(s.comm_ms >= 3.0);  // issue to the first time the host saw it complete
  CHECK(s.exposed_ms <= s.comm_ms);
}
