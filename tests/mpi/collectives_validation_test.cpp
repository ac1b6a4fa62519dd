// Bad input to every operation is rejected before anything is sent, with an InvalidArgument that
// names the operation and the values. Runs on the MPI world (the Self backend at one rank), and
// every rank checks the same cases, so a rank that wrongly sent something would hang the others.
#include <mpi.h>

#include "collectives_support.hpp"
#include "quintet/collectives/mpi.hpp"

using namespace quintet;
using namespace quintet::test;

namespace {

// A tensor that claims to live on cuda:0 over host memory: validation must reject it without
// touching it (it works without a GPU).
Tensor fake_cuda_tensor(std::int64_t n) {
  static std::vector<float> backing(1024);
  return Tensor::from_storage(std::shared_ptr<void>(backing.data(), [](void*) {}),
                              backing.size() * sizeof(float), {n}, DType::f32, Device::cuda(0));
}

}  // namespace

TEST_CASE("bad inputs are rejected before anything is sent") {
  World world = cpu_world();
  Communicator& c = world.comm();
  const int p = c.size(), me = c.rank();
  const Tensor a = Tensor::zeros({4 * p}, DType::f32);
  const Tensor b = Tensor::zeros({4 * p}, DType::f32);

  SECTION("dtype mismatch") {
    REQUIRE_THROWS_QUINTET(c.all_reduce(a, Tensor::zeros({4 * p}, DType::f64), ReduceOp::sum),
                           InvalidArgument, "all_reduce on communicator 'world'");
    REQUIRE_THROWS_QUINTET(c.all_reduce(a, Tensor::zeros({4 * p}, DType::f64), ReduceOp::sum),
                           InvalidArgument, "in has dtype f32 but out has dtype f64");
    REQUIRE_THROWS_QUINTET(c.all_gather(a, Tensor::zeros({4 * p * p}, DType::bf16)),
                           InvalidArgument, "all_gather");
  }
  SECTION("a CUDA tensor on a CPU communicator, and a CPU tensor on a CUDA one") {
    REQUIRE_THROWS_QUINTET(c.all_reduce(fake_cuda_tensor(4 * p), ReduceOp::sum), InvalidArgument,
                           "in is on cuda:0 but this communicator moves cpu tensors");
    REQUIRE_THROWS_QUINTET(c.broadcast(fake_cuda_tensor(4), 0), InvalidArgument, "broadcast");
    auto gpu_self = make_self_communicator(Device::cuda(0), "gpu");
    REQUIRE_THROWS_QUINTET(gpu_self->all_reduce(a, ReduceOp::sum), InvalidArgument,
                           "in is on cpu but this communicator moves cuda:0 tensors");
  }
  SECTION("non-contiguous tensors") {
    const Tensor m = Tensor::zeros({4, 2 * p}, DType::f32).transpose(0, 1);
    REQUIRE_THROWS_QUINTET(c.all_reduce(m, ReduceOp::sum), InvalidArgument, "is not contiguous");
    REQUIRE_THROWS_QUINTET(c.send(m, (me + 1) % p), InvalidArgument, "not contiguous");
  }
  SECTION("sizes that do not divide by the group size") {
    const Tensor odd = Tensor::zeros({4 * p + 1}, DType::f32);
    if (p > 1) {
      REQUIRE_THROWS_QUINTET(c.reduce_scatter(odd, Tensor::zeros({4}, DType::f32), ReduceOp::sum),
                             InvalidArgument, "reduce_scatter on communicator 'world'");
      REQUIRE_THROWS_QUINTET(c.all_to_all(odd, odd), InvalidArgument,
                             fmt::format("divisible by the group size {}", p));
    }
    REQUIRE_THROWS_QUINTET(c.reduce_scatter(a, Tensor::zeros({5}, DType::f32), ReduceOp::sum),
                           InvalidArgument, fmt::format("in has {} elements but out has 5", 4 * p));
    REQUIRE_THROWS_QUINTET(c.all_gather(Tensor::zeros({3}, DType::f32), a), InvalidArgument,
                           fmt::format("in has 3 elements but out has {}", 4 * p));
    REQUIRE_THROWS_QUINTET(c.all_reduce(a, Tensor::zeros({3}, DType::f32), ReduceOp::max),
                           InvalidArgument, "elements but out has 3");
  }
  SECTION("count vectors of the wrong length or not matching the tensors") {
    std::vector<std::int64_t> counts(p, 4);
    REQUIRE_THROWS_QUINTET(c.all_to_all_v(a, std::vector<std::int64_t>(p + 1, 1), b, counts),
                           InvalidArgument, fmt::format("send_counts has {} entries", p + 1));
    std::vector<std::int64_t> more = counts;
    more[0] += 1;
    REQUIRE_THROWS_QUINTET(c.all_to_all_v(a, more, b, counts), InvalidArgument,
                           fmt::format("send_counts sum to {} but in has {}", 4 * p + 1, 4 * p));
    REQUIRE_THROWS_QUINTET(c.all_to_all_v(a, counts, b, more), InvalidArgument,
                           fmt::format("recv_counts sum to {} but out has {}", 4 * p + 1, 4 * p));
    std::vector<std::int64_t> negative = counts;
    negative[0] = -1;
    REQUIRE_THROWS_QUINTET(c.all_to_all_v(a, negative, b, counts), InvalidArgument,
                           "must not be negative");
  }
  SECTION("a peer or root out of range") {
    REQUIRE_THROWS_QUINTET(c.broadcast(a, p), InvalidArgument,
                           fmt::format("root {} is out of range; expected 0..{}", p, p - 1));
    REQUIRE_THROWS_QUINTET(c.reduce(a, b, ReduceOp::sum, -1), InvalidArgument, "root -1");
    REQUIRE_THROWS_QUINTET(c.send(a, p + 3), InvalidArgument, fmt::format("peer {}", p + 3));
    REQUIRE_THROWS_QUINTET(c.recv(a, -2), InvalidArgument, "peer -2 is out of range");
    REQUIRE_THROWS_QUINTET(c.send(a, me), InvalidArgument, "is this rank");
    REQUIRE_THROWS_QUINTET(c.p2p({P2POp::send(a, p)}), InvalidArgument, "p2p op 0 (send) peer");
    REQUIRE_THROWS_QUINTET(c.p2p({P2POp::send(a, me), P2POp::recv(Tensor::zeros({1}), me)}),
                           InvalidArgument, "each send to self must match a receive");
  }
  SECTION("a reduction the dtype does not support") {
    const Tensor i = Tensor::zeros({4 * p}, DType::i32);
    REQUIRE_THROWS_QUINTET(c.all_reduce(i, ReduceOp::avg), InvalidArgument,
                           "reduction 'avg' is not supported for dtype i32");
    const Tensor u = Tensor::zeros({4 * p}, DType::u16);
    REQUIRE_THROWS_QUINTET(c.reduce_scatter(u, u.narrow(0, 4 * me, 4), ReduceOp::sum),
                           InvalidArgument, "reduction 'sum' is not supported for dtype u16");
    REQUIRE_THROWS_QUINTET(c.reduce(u, u, ReduceOp::max, 0), InvalidArgument, "reduce on");
  }
  SECTION("undefined tensors and partly overlapping in and out") {
    REQUIRE_THROWS_QUINTET(c.all_reduce(Tensor(), a, ReduceOp::sum), InvalidArgument,
                           "in is an undefined tensor");
    const Tensor big = Tensor::zeros({8 * p}, DType::f32);
    REQUIRE_THROWS_QUINTET(
        c.all_reduce(big.narrow(0, 0, 4 * p), big.narrow(0, 1, 4 * p), ReduceOp::sum),
        InvalidArgument, "overlap without being the in-place form");
  }
  // Nothing above was sent: the communicator still works, and the numbering shows no gap.
  Tensor x = Tensor::full({3}, 1.0, DType::f32);
  c.all_reduce(x, ReduceOp::sum).wait();
  CHECK(x.to_vector<double>() == std::vector<double>(3, p));
}

TEST_CASE("bad MpiOptions are rejected before the communicator is made") {
  World world = cpu_world();  // initialises MPI
  MpiOptions bad;
  bad.idle_start_delay_us = -1.0;
  REQUIRE_THROWS_QUINTET(make_mpi_communicator(MPI_COMM_WORLD, "bad", bad), InvalidArgument,
                         "idle_start_delay_us is -1");
}
