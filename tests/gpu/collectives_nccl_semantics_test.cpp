// The NCCL communicator's contract beyond values: split into groups, several operations
// outstanding and waited out of order, wait() ordering a stream without blocking the host,
// rejection of bad input before anything is sent, and timeouts instead of hangs (a rank that
// never arrives at initialisation, a collective that a peer never joins). One GPU per rank.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "collectives_nccl_support.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::test;

namespace {

// Blocks a CUDA stream from the host: work queued after block() waits until release().
class StreamBlocker {
 public:
  void block(const Stream& s) {
    REQUIRE(cudaLaunchHostFunc(s.handle(), &StreamBlocker::spin, this) == cudaSuccess);
  }
  void release() { released_.store(true); }

 private:
  static void spin(void* self) {
    while (!static_cast<StreamBlocker*>(self)->released_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> released_{false};
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
  const std::vector<char> id = detail::nccl_make_unique_id();
  REQUIRE_THROWS_QUINTET(detail::nccl_create_communicator(id, 0, 2, local_gpu(), 3.0, "lonely"),
                         Timeout, "rank 0 of 2");
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a collective that a peer never joins times out, naming it, and aborts") {
  if (world_size() < 2) return;  // needs a peer that stays away
  auto c = make_nccl_world("deserted", 10.0);
  const Stream s = Stream::create(c->device());
  const Tensor t = Tensor::full({1024}, 1.0, DType::f32, c->device());
  // Once together, so that NCCL has connected the peers for this operation (it does that inside
  // the first call of a kind, on the host); then rank 0 stays away.
  c->all_reduce(t, ReduceOp::sum, s).synchronize();
  if (c->rank() == 1) {
    const Work w = c->all_reduce(t, ReduceOp::sum, s);
    REQUIRE_THROWS_QUINTET(w.wait_for(std::chrono::milliseconds(500)), Timeout,
                           "all_reduce #2 on communicator 'deserted'");
    REQUIRE_THROWS_QUINTET(c->all_reduce(t, ReduceOp::sum, s), Aborted, "aborted");
  }
  c.reset();  // rank 0 finalizes alone; bounded by the 10 s timeout, never a hang
  MPI_Barrier(MPI_COMM_WORLD);
}
