// The NCCL communicator against a reference computed on the CPU: every operation x every dtype x
// sizes 0, 1, odd and a few MiB, in and out of place, on an explicit stream and on the default
// stream, and on a communicator made by split; splits that name their members (the mesh's axes),
// or whose members are found over MPI, record into the flight recorder under their name with their
// world ranks (issue #44). One GPU per rank (mpirun -np 1 and -np 2).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "collectives/flight_recorder.hpp"
#include "collectives/split_exchange.hpp"
#include "collectives_nccl_support.hpp"
#include "quintet/parallel/mesh.hpp"
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

TEST_CASE("splits whose members are known record under their name with their world ranks") {
  const int me = world_rank(), p = world_size();
  // One directory for the job: rank 0 names it.
  unsigned tag = std::random_device{}();
  MPI_Bcast(&tag, 1, MPI_UNSIGNED, 0, MPI_COMM_WORLD);
  const auto dir =
      std::filesystem::temp_directory_path() / ("quintet_nccl_flight_" + std::to_string(tag));
  detail::NcclOptions options;
  options.timeout_s = 120;
  options.flight = std::make_shared<detail::FlightRegistry>(me, p, dir.string(), 64);
  options.world_ranks.resize(static_cast<std::size_t>(p));
  std::iota(options.world_ranks.begin(), options.world_ranks.end(), 0);
  options.split_exchange = std::make_shared<detail::SplitExchange>(MPI_COMM_WORLD);
  auto world = make_nccl_world("world", options);
  // Reversed by key: rank r of 'reversed' is world rank p - 1 - r.
  std::vector<int> reversed_ranks(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) reversed_ranks[static_cast<std::size_t>(r)] = p - 1 - r;
  auto reversed = world->split(0, p - me, "reversed", reversed_ranks);
  // The Mesh names its axes' members: dp holds every rank, the other axes one (Self backend).
  const Mesh mesh(Layout(ParallelConfig{}, p), *world);
  // A split without members: the world finds them over MPI (its split_exchange) and records;
  // a split of a split without members has no exchange and records nothing.
  auto plain = world->split(0, me, "plain");
  auto nested = reversed->split(0, me, "nested");
  const Stream s = Stream::create(world->device());
  const std::int64_t n = 1000;
  for (Communicator* c : {reversed.get(), &mesh.comm(Axis::dp), plain.get(), nested.get()}) {
    const Tensor t = make_input(me, 3, n, DType::f32, Values::add).to(world->device());
    c->all_reduce(t, t, ReduceOp::sum, s).wait(s);
  }
  s.synchronize();
  REQUIRE(options.flight->dump("test") == options.flight->path());
  std::ifstream in(options.flight->path());
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& c : doc["communicators"]) by_name[c["name"].get<std::string>()] = c;
  std::vector<int> all(static_cast<std::size_t>(p));
  std::iota(all.begin(), all.end(), 0);
  REQUIRE(by_name.count("world (nccl)") == 1);
  CHECK(by_name["world (nccl)"]["world_ranks"] == all);
  CHECK(by_name.count("nested (nccl)") == 0);
  if (p == 1) {  // groups of one rank are Self communicators, which record nothing
    CHECK(by_name.size() == 1);
  } else {
    const std::pair<std::string, std::vector<int>> expected[] = {
        {"reversed (nccl)", reversed_ranks}, {"dp (nccl)", all}, {"plain (nccl)", all}};
    for (const auto& [name, ranks] : expected) {
      INFO(name);
      REQUIRE(by_name.count(name) == 1);
      const auto& c = by_name[name];
      CHECK(c["world_ranks"] == ranks);
      CHECK(c["rank"] == std::find(ranks.begin(), ranks.end(), me) - ranks.begin());
      CHECK(c["enqueued"] == 1);
      REQUIRE(c["ops"].size() == 1);
      CHECK(c["ops"][0]["seq"] == 1);
      CHECK(c["ops"][0]["op"] == "all_reduce");
      CHECK(c["ops"][0]["dtype"] == "f32");
      CHECK(c["ops"][0]["count"] == n);
    }
    CHECK(by_name.size() == 4);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::remove_all(dir);
}
