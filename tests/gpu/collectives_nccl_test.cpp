// The NCCL communicator against a reference computed on the CPU: every operation x every dtype x
// sizes 0, 1, odd and a few MiB, in and out of place, on an explicit stream and on the default
// stream, and on a communicator made by split. One GPU per rank (mpirun -np 1 and -np 2).
#include "collectives_nccl_support.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::test;

TEST_CASE("every operation on an NCCL world communicator matches the reference") {
  auto c = make_nccl_world("world");
  REQUIRE(c->backend() == Backend::nccl);
  REQUIRE(c->rank() == world_rank());
  REQUIRE(c->size() == world_size());
  REQUIRE(c->device() == local_gpu());
  const Stream s = Stream::create(c->device());
  run_gpu_suite(*c, s, 1000);
}

TEST_CASE("operations on the default stream (no stream argument) match the reference") {
  auto c = make_nccl_world("world-default-stream");
  const Stream cpu_stream;  // a CPU stream: the operations use the GPU's default stream
  run_gpu_suite(*c, cpu_stream, 5000, {0, 1, 1001});
}

TEST_CASE("a communicator made by split runs the suite while the parent works too") {
  auto world = make_nccl_world("parent");
  const int me = world->rank(), p = world->size();
  // Reversed order by key: rank r of the child is p - 1 - r of the parent.
  auto child = world->split(0, p - me, "reversed");
  REQUIRE(child != nullptr);
  CHECK(child->size() == p);
  CHECK(child->rank() == p - 1 - me);
  CHECK(child->backend() == (p == 1 ? Backend::self : Backend::nccl));
  const Stream s = Stream::create(world->device());
  // Both communicators busy at once: a parent all_reduce outstanding during the child's suite.
  const std::int64_t n = 4097;
  const Tensor big = make_input(me, 7, n, DType::f32, Values::add).to(world->device());
  const Work parent_work = world->all_reduce(big, big, ReduceOp::sum, s);
  run_gpu_suite(*child, s, 9000, {0, 1, 37, 70001});
  check_values(
      host_after(big, parent_work, s), 0, n,
      [&](std::int64_t i) { return reduced(ReduceOp::sum, p, 7, i, DType::f32); }, false,
      "parent all_reduce while the child ran");
}
