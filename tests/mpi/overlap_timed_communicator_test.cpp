// TimedCommunicator: results are the inner communicator's, every operation is counted with its
// bytes, the exposed time covers issue to wait (and so any work the caller does in between), a
// window is reset by take_stats and reset, and bad input is rejected by the inner validation.
// Runs on the MPI world (the Self backend at one rank).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "collectives_support.hpp"
#include "quintet/collectives/mpi.hpp"
#include "quintet/parallel/overlap/timed_communicator.hpp"

using namespace quintet;
using namespace quintet::test;
using namespace std::chrono_literals;

namespace {

// The two tensors hold the same bits.
void check_same(const Tensor& a, const Tensor& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.numel() == b.numel());
  CHECK(a.to_vector<float>() == b.to_vector<float>());
}

double host_ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("results equal the inner communicator's; ops and bytes are counted") {
  World world = cpu_world();
  Communicator& c = world.comm();
  overlap::TimedCommunicator timed(c);
  const int p = c.size(), me = c.rank();
  CHECK(timed.rank() == me);
  CHECK(timed.size() == p);
  CHECK(timed.backend() == c.backend());
  CHECK(timed.device() == c.device());
  CHECK(timed.name() == c.name());

  const std::uint64_t seed = 11;
  const std::int64_t n = 4099 * p;  // odd block size
  const Tensor in = make_input(me, seed, n, DType::f32, Values::add);
  std::int64_t bytes = 0;

  // all_reduce (out of place and in place)
  Tensor ref = Tensor::zeros({n}, DType::f32), got = Tensor::zeros({n}, DType::f32);
  c.all_reduce(in, ref, ReduceOp::sum).wait();
  timed.all_reduce(in, got, ReduceOp::sum).wait();
  check_same(ref, got, "all_reduce");
  Tensor inplace = in.clone();
  timed.all_reduce(inplace, ReduceOp::max).wait();
  c.all_reduce(ref.copy_(in), ReduceOp::max).wait();
  check_same(ref, inplace, "all_reduce in place");
  bytes += 2 * n * 4;

  // reduce_scatter and all_gather
  Tensor rs_ref = Tensor::zeros({n / p}, DType::f32), rs_got = Tensor::zeros({n / p}, DType::f32);
  c.reduce_scatter(in, rs_ref, ReduceOp::sum).wait();
  timed.reduce_scatter(in, rs_got, ReduceOp::sum).wait();
  check_same(rs_ref, rs_got, "reduce_scatter");
  Tensor ag_ref = Tensor::zeros({n}, DType::f32), ag_got = Tensor::zeros({n}, DType::f32);
  c.all_gather(rs_ref, ag_ref).wait();
  timed.all_gather(rs_ref, ag_got).wait();
  check_same(ag_ref, ag_got, "all_gather");
  bytes += 2 * n * 4;

  // broadcast from the last rank, all_to_all
  Tensor b_ref = in.clone(), b_got = in.clone();
  c.broadcast(b_ref, p - 1).wait();
  timed.broadcast(b_got, p - 1).wait();
  check_same(b_ref, b_got, "broadcast");
  Tensor a2a_ref = Tensor::zeros({n}, DType::f32), a2a_got = Tensor::zeros({n}, DType::f32);
  c.all_to_all(in, a2a_ref).wait();
  timed.all_to_all(in, a2a_got).wait();
  check_same(a2a_ref, a2a_got, "all_to_all");
  bytes += 2 * n * 4;

  // a ring exchange with p2p, and a barrier (no bytes)
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  Tensor r_ref = Tensor::zeros({n}, DType::f32), r_got = Tensor::zeros({n}, DType::f32);
  c.p2p({P2POp::send(in, next), P2POp::recv(r_ref, prev)}).wait();
  timed.p2p({P2POp::send(in, next), P2POp::recv(r_got, prev)}).wait();
  check_same(r_ref, r_got, "p2p ring");
  bytes += 2 * n * 4;
  timed.barrier().wait();

  const overlap::TimedCommunicator::Stats s = timed.take_stats();
  CHECK(s.ops == 8);
  CHECK(s.bytes == bytes);
  CHECK(s.exposed_ms > 0.0);
  CHECK(std::isfinite(s.exposed_ms));

  // take_stats started a new window.
  const overlap::TimedCommunicator::Stats empty = timed.take_stats();
  CHECK(empty.ops == 0);
  CHECK(empty.bytes == 0);
  CHECK(empty.exposed_ms == 0.0);
}

TEST_CASE("exposed time runs from issue to wait, host synchronize included") {
  World world = cpu_world();
  overlap::TimedCommunicator timed(world.comm());
  const Tensor t = Tensor::full({1024}, 1.0, DType::f32);

  SECTION("work between issue and wait(stream) is inside the interval (an upper bound)") {
    const auto t0 = std::chrono::steady_clock::now();
    Work w = timed.all_reduce(t, ReduceOp::sum);
    std::this_thread::sleep_for(30ms);  // the caller "computes" before waiting
    w.wait(Stream());
    const double host_ms = host_ms_since(t0);
    w.wait(Stream());  // a second wait is forwarded, not timed again
    const auto s = timed.take_stats();
    CHECK(s.ops == 1);
    CHECK(s.exposed_ms >= 30.0);
    CHECK(s.exposed_ms <= host_ms);
  }
  SECTION("from_wait: work between issue and wait is left out") {
    overlap::TimedCommunicator at_wait(world.comm(),
                                       overlap::TimedCommunicator::Measure::from_wait);
    Work w = at_wait.all_reduce(t, ReduceOp::sum);
    const auto t_sync = std::chrono::steady_clock::now();
    w.synchronize();  // done long before the wait below
    const double sync_ms = host_ms_since(t_sync);
    Work v = at_wait.all_reduce(t, ReduceOp::sum);
    std::this_thread::sleep_for(30ms);  // the caller computes while it runs
    const auto t0 = std::chrono::steady_clock::now();
    v.wait(Stream());
    const double wait_ms = host_ms_since(t0);
    const auto s = at_wait.take_stats();
    INFO("exposed " << s.exposed_ms << " ms, the waits took " << sync_ms << " + " << wait_ms
                    << " ms");
    CHECK(s.ops == 2);
    // Each interval lies inside its wait (measured around it here), so the 30 ms of compute
    // between issue and wait is left out, however slow the other ranks are to arrive.
    CHECK(s.exposed_ms <= sync_ms + wait_ms + 1e-3);
    CHECK(s.exposed_ms >= 0.0);
  }
  SECTION("a Work completed on the host with synchronize or wait_for") {
    const auto t0 = std::chrono::steady_clock::now();
    Work a = timed.all_reduce(t, ReduceOp::sum);
    Work b = timed.broadcast(t, 0);
    std::this_thread::sleep_for(20ms);
    a.synchronize();
    b.wait_for(60s);
    const double host_ms = host_ms_since(t0);
    CHECK(a.is_completed());
    const auto s = timed.take_stats();
    CHECK(s.ops == 2);
    CHECK(s.exposed_ms >= 2 * 20.0);
    CHECK(s.exposed_ms <= 2 * host_ms);
  }
  SECTION("an interval ending after take_stats counts in the window where it ends") {
    Work w = timed.all_reduce(t, ReduceOp::sum);
    const auto first = timed.take_stats();
    CHECK(first.ops == 1);
    CHECK(first.exposed_ms == 0.0);
    std::this_thread::sleep_for(10ms);
    w.wait();
    const auto second = timed.take_stats();
    CHECK(second.ops == 0);
    CHECK(second.exposed_ms >= 10.0);
  }
  SECTION("reset discards the window") {
    timed.all_reduce(t, ReduceOp::sum).wait();
    timed.barrier().wait();
    timed.reset();
    const auto s = timed.take_stats();
    CHECK(s.ops == 0);
    CHECK(s.bytes == 0);
    CHECK(s.exposed_ms == 0.0);
    timed.all_reduce(t, ReduceOp::sum).wait();
    const auto after = timed.take_stats();
    CHECK(after.ops == 1);
    CHECK(after.bytes == 1024 * 4);
  }
}

TEST_CASE("bad input is rejected by the inner validation and not counted") {
  World world = cpu_world();
  overlap::TimedCommunicator timed(world.comm());
  const int p = timed.size();
  const Tensor a = Tensor::zeros({4 * p}, DType::f32);
  REQUIRE_THROWS_QUINTET(timed.all_reduce(a, Tensor::zeros({4 * p}, DType::f64), ReduceOp::sum),
                         InvalidArgument, "in has dtype f32 but out has dtype f64");
  REQUIRE_THROWS_QUINTET(timed.reduce_scatter(a, Tensor::zeros({5}, DType::f32), ReduceOp::sum),
                         InvalidArgument,
                         fmt::format("reduce_scatter on communicator '{}'", timed.name()));
  REQUIRE_THROWS_QUINTET(timed.broadcast(a, p), InvalidArgument, "broadcast");
  const auto s = timed.take_stats();
  CHECK(s.ops == 0);
  CHECK(s.bytes == 0);
  // The communicator still works (nothing was sent by the rejected calls).
  Tensor ones = Tensor::full({3}, 1.0, DType::f32);
  timed.all_reduce(ones, ReduceOp::sum).wait();
  CHECK(ones.to_vector<float>() == std::vector<float>(3, static_cast<float>(p)));
}

TEST_CASE("split returns a plain sub-communicator of the inner one") {
  World world = cpu_world();
  overlap::TimedCommunicator timed(world.comm());
  const int me = timed.rank(), p = timed.size();
  std::unique_ptr<Communicator> parity = timed.split(me % 2, me, "parity");
  REQUIRE(parity);
  CHECK(dynamic_cast<overlap::TimedCommunicator*>(parity.get()) == nullptr);
  CHECK(parity->size() == (p + 1 - me % 2) / 2);
  CHECK(parity->rank() == me / 2);
  CHECK(parity->name() == "parity");
  Tensor t = Tensor::full({5}, 1.0, DType::f32);
  parity->all_reduce(t, ReduceOp::sum).wait();
  CHECK(t.to_vector<float>() == std::vector<float>(5, static_cast<float>(parity->size())));
  CHECK(timed.take_stats().ops == 0);
  CHECK(timed.split(-1, me, "none") == nullptr);
}
