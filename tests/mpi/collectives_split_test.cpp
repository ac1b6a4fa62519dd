// Sub-communicators from split used concurrently, several operations outstanding and waited out
// of order, callers taking over the queue while they wait (several at once, or leaving early),
// timeouts and errors carried to Work, and World under mpirun.
#include <mpi.h>

#include <chrono>
#include <exception>
#include <numeric>
#include <thread>
#include <vector>

#include "collectives_suite.hpp"
#include "quintet/collectives/mpi.hpp"

using namespace quintet;
using namespace quintet::test;
using namespace std::chrono_literals;

TEST_CASE("World under mpirun") {
  World world = cpu_world();
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(world.launcher() == Launcher::mpi);
  CHECK(world.rank() == rank);
  CHECK(world.size() == size);
  CHECK(world.local_size() == size);  // one node here
  CHECK(world.local_rank() == rank);
  CHECK(world.device() == Device::cpu());
  CHECK(&world.comm() == &world.cpu_comm());
  CHECK(world.comm().rank() == rank);
  CHECK(world.comm().name() == "world");
  // A second World in the same process works too (MPI was initialised by the test main, so
  // neither finalizes it).
  World again = cpu_world();
  Tensor t = Tensor::full({2}, rank + 1.0, DType::f64);
  again.comm().all_reduce(t, ReduceOp::sum).wait();
  CHECK(t.item({0}) == size * (size + 1) / 2.0);
}

TEST_CASE("split groups: even/odd and blocks of two, used at the same time") {
  World world = cpu_world();
  Communicator& c = world.comm();
  const int me = c.rank(), p = c.size();
  auto parity = c.split(me % 2, me, "parity");
  auto block = c.split(me / 2, -me, "block");  // key -me: reversed order inside each block
  REQUIRE(parity);
  REQUIRE(block);
  CHECK(parity->size() == (p + 1 - me % 2) / 2);
  CHECK(parity->rank() == me / 2);
  const int block_size = std::min(2, p - (me / 2) * 2);
  CHECK(block->size() == block_size);
  CHECK(block->rank() == block_size - 1 - me % 2);
  CHECK(block->backend() == (block_size == 1 ? Backend::self : Backend::mpi));

  // Many operations on both groups and the world, all outstanding, waited in reverse order.
  std::vector<Work> works;
  std::vector<Tensor> on_parity, on_block, on_world;
  for (int k = 0; k < 6; ++k) {
    on_parity.push_back(Tensor::full({1000 + k}, me + k, DType::f64));
    on_block.push_back(Tensor::full({999 - k}, 10.0 * me + k, DType::f32));
    on_world.push_back(Tensor::full({17}, 1.0, DType::i64));
    works.push_back(parity->all_reduce(on_parity.back(), ReduceOp::sum));
    works.push_back(block->all_reduce(on_block.back(), ReduceOp::max));
    works.push_back(c.all_reduce(on_world.back(), ReduceOp::sum));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
  for (int k = 0; k < 6; ++k) {
    double parity_sum = 0;
    for (int r = me % 2; r < p; r += 2) parity_sum += r + k;
    const int block_max = std::min(p - 1, (me / 2) * 2 + 1);
    CHECK(on_parity[k].item({999 + k}) == parity_sum);
    CHECK(on_block[k].item({0}) == 10.0 * block_max + k);
    CHECK(on_world[k].item({16}) == p);
  }
  for (const Work& w : works) CHECK(w.is_completed());

  // The whole suite on a split group (small sizes), the other group busy at the same time.
  Tensor background = Tensor::full({1 << 16}, 1.0, DType::f32);
  Work busy = block->all_reduce(background, ReduceOp::sum);
  run_suite(*parity, 9000 + 100 * (me % 2), {0, 1, 37});
  busy.wait();
  CHECK(background.item({123}) == block_size);
}

namespace {

// Operation k of a queue of mixed operations on c, and the value its tensor must hold after it.
struct Queued {
  Tensor t;
  double expected = 0;
  Work work;
};

// Issues n operations on c (all_reduce, broadcast and all_gather in turn), none waited. The last
// rank joins 20 ms late, so on the other ranks the first operation is still running on the
// communicator's thread (it waits for that rank) while the caller issues the rest and waits.
std::vector<Queued> issue_queue(Communicator& c, int n) {
  const int me = c.rank(), p = c.size();
  if (me == p - 1) std::this_thread::sleep_for(20ms);
  std::vector<Queued> q;
  for (int k = 0; k < n; ++k) {
    Queued op;
    if (k % 3 == 0) {  // element-wise sum of me + k over the ranks
      op.t = Tensor::full({(k == 0 ? 1 << 15 : 64) + k}, me + k, DType::f32);
      op.expected = p * (p - 1) / 2.0 + p * k;
      op.work = c.all_reduce(op.t, ReduceOp::sum);
    } else if (k % 3 == 1) {  // rank k % p's values
      const int root = k % p;
      op.t = Tensor::full({33 + k}, me == root ? 1000.0 + k : -1.0, DType::f64);
      op.expected = 1000.0 + k;
      op.work = c.broadcast(op.t, root);
    } else {  // all_gather of one element per rank, summed after: the same sum as above
      op.t = Tensor::zeros({p}, DType::i64);
      op.expected = p * (p - 1) / 2.0 + p * k;
      op.work = c.all_gather(Tensor::full({1}, me + k, DType::i64), op.t);
    }
    q.push_back(std::move(op));
    if (k == 0) std::this_thread::sleep_for(5ms);  // lets the thread start the first one
  }
  return q;
}

void check_queue(const std::vector<Queued>& q) {
  for (std::size_t k = 0; k < q.size(); ++k) {
    INFO("operation " << k << " " << q[k].work.describe());
    CHECK(q[k].work.is_completed());
    const std::vector<double> v = q[k].t.to_vector<double>();
    const double got = k % 3 == 2 ? std::accumulate(v.begin(), v.end(), 0.0) : v.back();
    CHECK(got == q[k].expected);
    if (k % 3 != 2) CHECK(v.front() == q[k].expected);
  }
}

}  // namespace

TEST_CASE("a waiting caller runs the queued operations, alone, with another waiter, or leaving") {
  World world = cpu_world();
  auto c = world.comm().split(0, world.rank(), "takeover");
  REQUIRE(c);
  constexpr int kOps = 40;

  SECTION("many operations outstanding, the last waited while the thread runs the first") {
    std::vector<Queued> q = issue_queue(*c, kOps);
    q.back().work.wait();
    check_queue(q);  // everything before the last has completed, with its values
  }
  SECTION("two threads waiting on the same communicator at once") {
    std::vector<Queued> q = issue_queue(*c, kOps);
    std::exception_ptr helper_error;
    std::thread helper([&] {
      try {
        for (int k = kOps - 1; k >= 0; k -= 2) q[k].work.wait();  // the last one first
      } catch (...) {
        helper_error = std::current_exception();
      }
    });
    for (int k = 0; k < kOps; k += 2) q[k].work.synchronize();
    helper.join();
    if (helper_error) std::rethrow_exception(helper_error);
    check_queue(q);
  }
  SECTION("a waiter that leaves with operations queued: the thread runs them") {
    std::vector<Queued> q = issue_queue(*c, kOps);
    q[kOps / 4].work.wait();
    // A bounded wait runs nothing itself: these complete only if the thread resumes the queue.
    for (int k = kOps / 4 + 1; k < kOps; ++k) q[k].work.wait_for(60s);
    check_queue(q);
  }
  SECTION("a waiter that leaves with operations queued, then shutdown: they all run") {
    std::vector<Queued> q = issue_queue(*c, kOps);
    q[kOps / 2].work.wait();
    c.reset();  // drains the queue before joining the thread
    check_queue(q);
  }
}

TEST_CASE("split with a negative color, and groups of one rank") {
  World world = cpu_world();
  Communicator& c = world.comm();
  const int me = c.rank();
  auto none = c.split(me == 0 ? -1 : 1, 0, "not rank 0");
  CHECK((none == nullptr) == (me == 0));
  auto alone = c.split(me, 0, "alone");
  REQUIRE(alone);
  CHECK(alone->backend() == Backend::self);
  CHECK(alone->size() == 1);
  run_suite(*alone, 7000, {0, 1, 37});
  // Self makes no copy in place, and copies out of place.
  Tensor t = Tensor::full({5}, 3.0, DType::bf16), u = Tensor::zeros({5}, DType::bf16);
  alone->all_reduce(t, u, ReduceOp::avg).wait();
  CHECK(u.item({4}) == 3.0);
}

TEST_CASE("wait_for names the operation, the communicator and its sequence number") {
  World world = cpu_world();
  Communicator& c = world.comm();
  if (c.size() < 2) return;  // needs a peer that is late
  auto late = c.split(0, c.rank(), "late");
  const int me = c.rank();
  Tensor t = Tensor::zeros({8}, DType::i32);
  if (me == 0) {
    late->barrier().wait();     // #0
    Work w = late->recv(t, 1);  // #1: rank 1 sends only after the world barrier
    REQUIRE_THROWS_QUINTET(w.wait_for(50ms), Timeout, "recv #1 (8 x i32) on communicator 'late'");
    CHECK(!w.is_completed());
    c.barrier().wait();
    w.wait_for(30s);
    CHECK(t.item({7}) == 42);
  } else {
    late->barrier().wait();
    c.barrier().wait();
    if (me == 1) late->send(Tensor::full({8}, 42, DType::i32), 0).wait();
  }
}

TEST_CASE("an error inside the progress thread is rethrown from wait, and later ops abort") {
  World world = cpu_world();
  Communicator& c = world.comm();
  if (c.size() < 2) return;
  auto broken = c.split(c.rank() < 2 ? 0 : -1, c.rank(), "broken");
  if (c.rank() == 0) {
    broken->send(Tensor::full({10}, 1.0, DType::f32), 1).wait();  // small: completes eagerly
  } else if (c.rank() == 1) {
    Tensor small = Tensor::zeros({5}, DType::f32);  // too small for the 10 elements sent
    Work w = broken->recv(small, 0);
    REQUIRE_THROWS_QUINTET(w.wait(), Mpi, "MPI_Recv");
    REQUIRE_THROWS_QUINTET(w.synchronize(), Mpi, "MPI_Recv");
    REQUIRE_THROWS_QUINTET(broken->barrier().wait(), Aborted,
                           "an earlier operation on this "
                           "communicator failed (recv #0 (5 x f32) on communicator 'broken'");
  }
  c.barrier().wait();
}
