// The NCCL communicator's contract beyond values: split into groups, several operations
// outstanding and waited out of order, wait() ordering a stream without blocking the host,
// rejection of bad input before anything is sent, and timeouts instead of hangs (a rank that
// never arrives at initialisation or at a split, an operation that never finishes). One GPU per
// rank.
//
// No case may hang under any number of ranks: the operations run on a blocking NCCL comm, so a
// rank whose peer never joins a collective would block inside NCCL. Every rank therefore issues
// the same operations on shared communicators in the same order; a missing peer is only tested
// where NCCL is non-blocking and bounded (init, split); an operation that never finishes is one
// held back on the GPU behind a bounded host spin, on a communicator of one rank; and every
// rank destroys shared communicators together (NCCL's destroy waits for the peers' destroy).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "collectives_nccl_support.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::test;

namespace {

// Blocks a CUDA stream from the host: work queued after block() waits until release() or until
// max_hold has passed (so that a failing test can never leave the stream blocked for good). The
// spin's state is shared with the callback, so the blocker may go before the callback ends.
class StreamBlocker {
 public:
  explicit StreamBlocker(std::chrono::milliseconds max_hold = std::chrono::seconds(20))
      : hold_(std::make_shared<Hold>()) {
    hold_->until = std::chrono::steady_clock::now() + max_hold;
  }
  ~StreamBlocker() { release(); }
  StreamBlocker(const StreamBlocker&) = delete;
  StreamBlocker& operator=(const StreamBlocker&) = delete;

  void block(const Stream& s) {
    auto* mine = new std::shared_ptr<Hold>(hold_);
    if (cudaLaunchHostFunc(s.handle(), &StreamBlocker::spin, mine) != cudaSuccess) {
      delete mine;
      FAIL("cudaLaunchHostFunc failed");
    }
  }
  void release() { hold_->released.store(true); }

 private:
  struct Hold {
    std::atomic<bool> released{false};
    std::chrono::steady_clock::time_point until;
  };
  static void spin(void* arg) {
    const std::unique_ptr<std::shared_ptr<Hold>> hold(static_cast<std::shared_ptr<Hold>*>(arg));
    while (!(*hold)->released.load() && std::chrono::steady_clock::now() < (*hold)->until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::shared_ptr<Hold> hold_;
};

// An MPI barrier on scope exit, even when a failed REQUIRE leaves the test case early, so that the
// ranks never drift into different test cases (which would hang them in MPI).
struct BarrierAtExit {
  BarrierAtExit() = default;
  BarrierAtExit(const BarrierAtExit&) = delete;
  BarrierAtExit& operator=(const BarrierAtExit&) = delete;
  ~BarrierAtExit() { MPI_Barrier(MPI_COMM_WORLD); }
};

}  // namespace

TEST_CASE("split into even/odd and block groups: each group reduces over its own ranks") {
  auto world = make_nccl_world("world");
  const int me = world->rank(), p = world->size();
  const Stream s = Stream::create(world->device());
  auto parity = world->split(me % 2, me, "parity");
  auto blocks = world->split(me / 2, me, "blocks");
  auto none = world->split(me == 0 ? -1 : 0, me, "all-but-0");
  REQUIRE(parity != nullptr);
  REQUIRE(blocks != nullptr);
  CHECK((none == nullptr) == (me == 0));
  const int parity_size = (p + 1 - me % 2) / 2;
  CHECK(parity->size() == parity_size);
  CHECK(parity->rank() == me / 2);
  CHECK(parity->backend() == (parity_size == 1 ? Backend::self : Backend::nccl));
  CHECK(blocks->size() == std::min(2, p - (me / 2) * 2));
  // Sum of the world ranks in each group, both groups' all_reduces outstanding at once.
  const Tensor a = Tensor::full({5}, me, DType::f64, world->device());
  const Tensor b = Tensor::full({3}, me, DType::f64, world->device());
  const Work wa = parity->all_reduce(a, ReduceOp::sum, s);
  const Work wb = blocks->all_reduce(b, ReduceOp::sum, s);
  double parity_sum = 0, block_sum = 0;
  for (int r = 0; r < p; ++r) {
    if (r % 2 == me % 2) parity_sum += r;
    if (r / 2 == me / 2) block_sum += r;
  }
  const Tensor ha = host_after(a, wa, s), hb = host_after(b, wb, s);
  for (double v : ha.to_vector<double>()) CHECK(v == parity_sum);
  for (double v : hb.to_vector<double>()) CHECK(v == block_sum);
  if (none) {
    const Tensor t = Tensor::full({2}, 1.0, DType::f32, world->device());
    const Tensor h = host_after(t, none->all_reduce(t, ReduceOp::sum, s), s);
    for (double v : h.to_vector<double>()) CHECK(v == p - 1);
  }
}

TEST_CASE("several operations outstanding at once, waited out of order") {
  auto c = make_nccl_world("outstanding");
  const int me = c->rank(), p = c->size();
  const Stream s = Stream::create(c->device());
  constexpr int kOps = 12;
  const std::int64_t n = 100003;
  std::vector<Tensor> tensors;
  std::vector<Work> works;
  for (int k = 0; k < kOps; ++k) {
    tensors.push_back(make_input(me, 100 + k, n, DType::f32, Values::add).to(c->device()));
    works.push_back(c->all_reduce(tensors.back(), ReduceOp::sum, s));
  }
  // Waited in reverse order, the even ones first with a deadline, then the odd ones.
  for (int k = kOps - 1; k >= 0; --k) {
    if (k % 2 == 0) {
      works[static_cast<std::size_t>(k)].wait_for(std::chrono::seconds(60));
      CHECK(works[static_cast<std::size_t>(k)].is_completed());
      check_values(
          tensors[static_cast<std::size_t>(k)].to(Device::cpu()), 0, n,
          [&](std::int64_t i) { return reduced(ReduceOp::sum, p, 100 + k, i, DType::f32); }, false,
          fmt::format("outstanding op {}", k));
    }
  }
  for (int k = 1; k < kOps; k += 2) {
    const Tensor h =
        host_after(tensors[static_cast<std::size_t>(k)], works[static_cast<std::size_t>(k)], s);
    check_values(
        h, 0, n, [&](std::int64_t i) { return reduced(ReduceOp::sum, p, 100 + k, i, DType::f32); },
        false, fmt::format("outstanding op {}", k));
  }
  CHECK(works.front().describe().find("all_reduce #1 on communicator 'outstanding'") !=
        std::string::npos);
}

TEST_CASE("wait(stream) orders the stream without blocking the host") {
  auto c = make_nccl_world("nonblocking");
  const int me = c->rank(), p = c->size();
  const Stream s = Stream::create(c->device());
  const Stream consumer = Stream::create(c->device());
  const std::int64_t n = 1 << 16;
  // The input lives in s's pool, as a tensor produced on s would.
  Tensor in = Tensor::empty({n}, DType::bf16, c->device(), s);
  in.copy_(make_input(me, 31, n, DType::bf16, Values::add), s);
  const Tensor out = Tensor::empty({n}, DType::bf16, c->device());
  void* const in_address = in.data_ptr();
  StreamBlocker blocker;
  blocker.block(s);  // the all_reduce's input is "produced" by work that has not run yet
  const Work w = c->all_reduce(in, out, ReduceOp::sum, s);
  const auto start = std::chrono::steady_clock::now();
  w.wait(consumer);  // must return at once: the operation cannot have run
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited < std::chrono::milliseconds(100));
  CHECK_FALSE(w.is_completed());
  CHECK(cudaStreamQuery(consumer.handle()) == cudaErrorNotReady);  // consumer now waits on it
  (void)cudaGetLastError();
  // Dropping our reference must not hand the block to the next allocation on s while the
  // operation (on the comm stream) has yet to read it.
  in = Tensor();
  const Tensor next = Tensor::empty({n}, DType::bf16, c->device(), s);
  CHECK(next.data_ptr() != in_address);
  blocker.release();
  consumer.synchronize();
  CHECK(w.is_completed());
  check_values(
      out.to(Device::cpu()), 0, n,
      [&](std::int64_t i) { return reduced(ReduceOp::sum, p, 31, i, DType::bf16); }, false,
      "all_reduce after the blocked producer");
}

TEST_CASE("bad inputs are rejected before anything is sent") {
  auto c = make_nccl_world("checks");
  const int me = c->rank(), p = c->size();
  const Device gpu = c->device();
  const Tensor f = Tensor::zeros({6 * p}, DType::f32, gpu);
  const Tensor h = Tensor::zeros({6 * p}, DType::f32, Device::cpu());
  REQUIRE_THROWS_QUINTET(c->all_reduce(h, ReduceOp::sum), InvalidArgument, "cpu");
  REQUIRE_THROWS_QUINTET(c->all_reduce(f, Tensor::zeros({6 * p}, DType::bf16, gpu), ReduceOp::sum),
                         InvalidArgument, "dtype");
  REQUIRE_THROWS_QUINTET(
      c->all_reduce(f, Tensor::zeros({6 * p + 1}, DType::f32, gpu), ReduceOp::sum), InvalidArgument,
      "elements");
  REQUIRE_THROWS_QUINTET(c->all_reduce(Tensor::zeros({4}, DType::u16, gpu), ReduceOp::sum),
                         InvalidArgument, "u16");
  REQUIRE_THROWS_QUINTET(c->all_reduce(Tensor::zeros({4}, DType::i32, gpu), ReduceOp::avg),
                         InvalidArgument, "avg");
  REQUIRE_THROWS_QUINTET(
      c->all_reduce(Tensor::zeros({4, 6}, DType::f32, gpu).transpose(0, 1), ReduceOp::sum),
      InvalidArgument, "contiguous");
  REQUIRE_THROWS_QUINTET(c->reduce_scatter(Tensor::zeros({6 * p + 1}, DType::f32, gpu),
                                           Tensor::zeros({6}, DType::f32, gpu), ReduceOp::sum),
                         InvalidArgument, "reduce_scatter");
  REQUIRE_THROWS_QUINTET(c->all_gather(Tensor::zeros({6}, DType::f32, gpu),
                                       Tensor::zeros({6 * p + 2}, DType::f32, gpu)),
                         InvalidArgument, "all_gather");
  REQUIRE_THROWS_QUINTET(
      c->all_to_all_v(f, {6 * p}, f.clone(), std::vector<std::int64_t>(p + 1, 0)), InvalidArgument,
      "entries");
  std::vector<std::int64_t> counts(static_cast<std::size_t>(p), 6);
  counts[0] = 7;
  REQUIRE_THROWS_QUINTET(c->all_to_all_v(f, counts, f.clone(), counts), InvalidArgument, "sum");
  REQUIRE_THROWS_QUINTET(c->broadcast(f, p), InvalidArgument, "root");
  REQUIRE_THROWS_QUINTET(c->reduce(f, f, ReduceOp::sum, -1), InvalidArgument, "root");
  REQUIRE_THROWS_QUINTET(c->send(f, p), InvalidArgument, "peer");
  REQUIRE_THROWS_QUINTET(c->recv(f, me), InvalidArgument, "peer");
  REQUIRE_THROWS_QUINTET(c->p2p({P2POp::send(f, me)}), InvalidArgument, "p2p");
  if (cuda_device_count() > 1) {
    const Stream other = Stream::create(Device::cuda((gpu.index() + 1) % cuda_device_count()));
    REQUIRE_THROWS_QUINTET(c->all_reduce(f, ReduceOp::sum, other), InvalidArgument, "stream");
  }
  // Nothing was sent: the ranks still agree on the next collective.
  const Tensor one = Tensor::full({3}, 1.0, DType::f32, gpu);
  c->all_reduce(one, ReduceOp::sum).synchronize();
  for (double v : one.to_vector<double>()) CHECK(v == p);
}

TEST_CASE("a rank that never arrives makes initialisation a Timeout naming rank and size") {
  // Each rank alone: a communicator of 2 ranks with an id nobody else has.
  const BarrierAtExit barrier;
  const std::vector<char> id = detail::nccl_make_unique_id();
  REQUIRE_THROWS_QUINTET(detail::nccl_create_communicator(id, 0, 2, local_gpu(), 3.0, "lonely"),
                         Timeout, "rank 0 of 2");
}

TEST_CASE("a rank that never calls split makes split a Timeout on the others, not a hang") {
  if (world_size() < 2) return;  // needs a rank that stays away
  constexpr double kTimeout = 2.0;
  const BarrierAtExit barrier;  // after c is gone, even if a check below fails
  auto c = make_nccl_world("split-deserted", kTimeout);
  // Only rank 0 splits. The split runs on the non-blocking control comm, so it is bounded.
  if (c->rank() == 0) {
    REQUIRE_THROWS_QUINTET(c->split(0, 0, "half"), Timeout, "did not call split");
    REQUIRE_THROWS_QUINTET(
        c->all_reduce(Tensor::zeros({4}, DType::f32, c->device()), ReduceOp::sum), Aborted,
        "aborted");
  } else {
    // Stay alive (touching neither NCCL nor MPI) until rank 0 has timed out: destroying our comm
    // earlier would fail its split with an error instead. Rank 0's abort may in turn wait for
    // this destroy (NCCL's destroy waits for the peers), so no MPI barrier may come first.
    std::this_thread::sleep_for(std::chrono::duration<double>(2 * kTimeout + 1));
  }
  c.reset();  // rank 0 aborted; the others finalize theirs, bounded by the timeout
}

TEST_CASE("an operation that never finishes makes wait_for a Timeout naming it, and aborts") {
  // A communicator of this rank alone (its own unique id), so that the held-back operation and
  // the abort involve no peer: every rank runs this case by itself.
  const std::vector<char> id = detail::nccl_make_unique_id();
  auto c = detail::nccl_create_communicator(id, 0, 1, local_gpu(), 30.0, "held");
  const Stream s = Stream::create(c->device());
  const Tensor in = Tensor::full({4096}, 1.0, DType::f32, c->device());
  const Tensor out = Tensor::zeros({4096}, DType::f32, c->device());
  StreamBlocker blocker(std::chrono::seconds(3));  // holds the input back; at most 3 s
  blocker.block(s);
  const Work w = c->all_reduce(in, out, ReduceOp::sum, s);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_QUINTET(w.wait_for(std::chrono::milliseconds(200)), Timeout,
                         "all_reduce #1 on communicator 'held'");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  REQUIRE_THROWS_QUINTET(c->all_reduce(in, out, ReduceOp::sum, s), Aborted, "timed out");
  REQUIRE_THROWS_QUINTET(c->split(0, 0, "child"), Aborted, "aborted");
  blocker.release();
  c.reset();  // bounded: the stream drains once the blocker lets go
  s.synchronize();
}
