// The collective-consistency debug mode (--check-collectives, issue #21) on the MPI backend:
// mismatched collectives (count, dtype, op order, root, reduce op, all_to_all_v counts) and a
// mismatched send/receive are errors naming both ranks and both fingerprints, raised before MPI
// is called (the communicator stays usable); a rank that skips an operation is reported as
// "rank k never reached seq s on '<name>'" within the deadline; matched operations give the
// right results; the mode is off by default and on with the flag or the variable.
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/collectives/checked_communicator.hpp"
#include "quintet/collectives/mpi.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/tensor.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

using Clock = std::chrono::steady_clock;

// This rank and the number of ranks of the job.
std::pair<int, int> rank_and_size() {
  std::pair<int, int> rs{0, 1};
  MPI_Comm_rank(MPI_COMM_WORLD, &rs.first);
  MPI_Comm_size(MPI_COMM_WORLD, &rs.second);
  return rs;
}

std::unique_ptr<Communicator> checked(const std::string& name, double timeout_s = 30.0) {
  MpiOptions options;
  options.timeout_s = timeout_s;
  CollectiveCheckOptions check;
  check.timeout_s = timeout_s;
  return make_checked_communicator(make_mpi_communicator(MPI_COMM_WORLD, name, options),
                                   MPI_COMM_WORLD, check);
}

// Runs f, which must throw a quintet::Error of `code` whose message has every one of `parts`.
template <class F>
void expect_error(F&& f, ErrorCode code, const std::vector<std::string>& parts) {
  bool threw = false;
  try {
    f();
  } catch (const Error& e) {
    threw = true;
    const std::string what = e.what();
    INFO(what);
    CHECK(e.code() == code);
    for (const std::string& p : parts) CHECK(what.find(p) != std::string::npos);
  }
  CHECK(threw);
}

std::string rank_s(int r) { return "rank " + std::to_string(r); }

}  // namespace

TEST_CASE("check-collectives: matched operations pass and give the right results",
          "[collectives][reliability]") {
  const auto [r, n] = rank_and_size();
  if (n < 2) return;
  auto comm = checked("matched");
  REQUIRE(checks_collectives(*comm));
  const std::int64_t checked_before = checked_operations();
  const Tensor a = Tensor::full({5}, r + 1.0, DType::f32);
  comm->all_reduce(a).wait();
  CHECK(a.item({4}) == n * (n + 1) / 2.0);
  const Tensor g = Tensor::empty({2 * n}, DType::f64);
  comm->all_gather(Tensor::full({2}, 10.0 * r, DType::f64), g).wait();
  for (int k = 0; k < n; ++k) CHECK(g.item({2 * k + 1}) == 10.0 * k);
  const Tensor rs = Tensor::empty({3}, DType::f32);
  comm->reduce_scatter(Tensor::full({3 * n}, 2.0, DType::f32), rs, ReduceOp::avg).wait();
  CHECK(rs.item({0}) == 2.0);
  const Tensor b = Tensor::full({4}, r == n - 1 ? 7.0 : 0.0, DType::i32);
  comm->broadcast(b, n - 1).wait();
  CHECK(b.item({3}) == 7.0);
  const Tensor red = Tensor::empty({2}, DType::f32);
  comm->reduce(Tensor::full({2}, 1.0, DType::f32), red, ReduceOp::sum, 0).wait();
  if (r == 0) CHECK(red.item({1}) == n);
  // all_to_all_v: rank i sends i + j + 1 elements (valued i) to rank j.
  std::vector<std::int64_t> sc(n), rc(n);
  std::int64_t ns = 0, nr = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = r + j + 1;
    rc[j] = j + r + 1;
    ns += sc[j];
    nr += rc[j];
  }
  const Tensor out = Tensor::empty({nr}, DType::f32);
  comm->all_to_all_v(Tensor::full({ns}, r, DType::f32), sc, out, rc).wait();
  CHECK(out.item({nr - 1}) == n - 1.0);
  // A ring of batched point-to-point, then single sends and receives between ranks 0 and 1.
  const Tensor got = Tensor::empty({3}, DType::f32);
  comm->p2p({P2POp::send(Tensor::full({3}, r, DType::f32), (r + 1) % n),
             P2POp::recv(got, (r + n - 1) % n)})
      .wait();
  CHECK(got.item({2}) == (r + n - 1) % n);
  if (r == 0) comm->send(Tensor::full({6}, 3.0, DType::f32), 1).wait();
  if (r == 1) {
    const Tensor x = Tensor::empty({6}, DType::f32);
    comm->recv(x, 0).wait();
    CHECK(x.item({5}) == 3.0);
  }
  comm->barrier().wait();
  // Splits are checked too.
  auto half = comm->split(r % 2, r, "half");
  REQUIRE(half != nullptr);
  CHECK(checks_collectives(*half) == (half->size() > 1));
  const Tensor h = Tensor::full({2}, 1.0, DType::f32);
  half->all_reduce(h).wait();
  CHECK(h.item({0}) == half->size());
  // So are splits that name their members (the Mesh's), which reach the inner communicator.
  std::vector<int> same_parity;
  for (int i = r % 2; i < n; i += 2) same_parity.push_back(i);
  auto named = comm->split(r % 2, r, "named", same_parity);
  REQUIRE(named != nullptr);
  CHECK((named->rank() == r / 2 && named->size() == half->size()));
  CHECK(checks_collectives(*named) == (named->size() > 1));
  // Each operation was compared and counted once: 7 collectives before the split, the p2p's
  // receive, rank 1's recv, the two splits, and the half's all_reduce where it has two ranks or
  // more.
  CHECK(checked_operations() - checked_before ==
        7 + 1 + (r == 1 ? 1 : 0) + 2 + (half->size() > 1 ? 1 : 0));
}

TEST_CASE("check-collectives: mismatched collectives are errors naming both ranks",
          "[collectives][reliability]") {
  const auto [r, n] = rank_and_size();
  if (n < 2) return;
  auto comm = checked("dp");
  const int odd = n - 1;  // the rank that issues something else
  const std::string me = rank_s(r), other = rank_s(r == odd ? 0 : odd);
  const auto both = [&](const std::string& mine, const std::string& theirs) {
    return std::vector<std::string>{"communicator 'dp'", me + " issued " + mine,
                                    other + " issued " + theirs};
  };
  const bool odd_here = r == odd;
  // Different counts (not counted as checked: checked_operations() counts matches).
  {
    const Tensor t = Tensor::full({odd_here ? 5 : 4}, 1.0, DType::f32);
    const std::string four = "all_reduce(sum, 4 x f32)", five = "all_reduce(sum, 5 x f32)";
    const std::int64_t checked_before = checked_operations();
    expect_error([&] { comm->all_reduce(t); }, ErrorCode::InvalidArgument,
                 odd_here ? both(five, four) : both(four, five));
    CHECK(checked_operations() == checked_before);
  }
  // Different dtypes.
  {
    const Tensor t = Tensor::full({4}, 1.0, odd_here ? DType::f64 : DType::f32);
    const std::string f32 = "all_reduce(sum, 4 x f32)", f64 = "all_reduce(sum, 4 x f64)";
    expect_error([&] { comm->all_reduce(t); }, ErrorCode::InvalidArgument,
                 odd_here ? both(f64, f32) : both(f32, f64));
  }
  // Another op: all_reduce here, all_gather there.
  {
    const Tensor t = Tensor::full({4}, 1.0, DType::f32);
    const Tensor g = Tensor::empty({4 * n}, DType::f32);
    const std::string ar = "all_reduce(sum, 4 x f32)", ag = "all_gather(4 x f32 per rank)";
    expect_error([&] { odd_here ? comm->all_gather(t, g) : comm->all_reduce(t); },
                 ErrorCode::InvalidArgument, odd_here ? both(ag, ar) : both(ar, ag));
  }
  // Another root.
  {
    const Tensor t = Tensor::full({4}, 1.0, DType::f32);
    const std::string r0 = "broadcast(root 0, 4 x f32)", r1 = "broadcast(root 1, 4 x f32)";
    expect_error([&] { comm->broadcast(t, odd_here ? 1 : 0); }, ErrorCode::InvalidArgument,
                 odd_here ? both(r1, r0) : both(r0, r1));
  }
  // Another reduce op.
  {
    const Tensor t = Tensor::full({4}, 1.0, DType::f32);
    const std::string sum = "all_reduce(sum, 4 x f32)", max = "all_reduce(max, 4 x f32)";
    expect_error([&] { comm->all_reduce(t, odd_here ? ReduceOp::max : ReduceOp::sum); },
                 ErrorCode::InvalidArgument, odd_here ? both(max, sum) : both(sum, max));
  }
  // Nothing was sent: the communicator still works, and the sequence numbers go on (5 checks).
  const Tensor t = Tensor::full({4}, 1.0, DType::f32);
  comm->all_reduce(t).wait();
  CHECK(t.item({0}) == n);
  // all_to_all_v: rank 0 sends one element more to the last rank than the last rank expects;
  // every rank fails, the others too.
  {
    std::vector<std::int64_t> sc(n, 1), rc(n, 1);
    if (r == 0) sc[odd] = 2;
    const Tensor in = Tensor::full({r == 0 ? n + 1 : n}, 1.0, DType::f32);
    const Tensor out = Tensor::empty({n}, DType::f32);
    std::vector<std::string> parts = {"all_to_all_v", "at seq 6"};
    if (r == odd) {
      parts.push_back(rank_s(odd) + " issued all_to_all_v(receiving 1 x f32 from rank 0)");
      parts.push_back("rank 0 issued all_to_all_v(sending 2 x f32 to " + rank_s(odd) + ")");
    } else {
      parts.push_back(rank_s(odd) + " found that rank 0's does not match its own");
    }
    expect_error([&] { comm->all_to_all_v(in, sc, out, rc); }, ErrorCode::InvalidArgument, parts);
  }
  // A send and its receive of different counts: the receiver fails, naming both.
  if (r == 0) {
    comm->send(Tensor::full({4}, 1.0, DType::f32), 1);  // never received: MPI buffers it
  } else if (r == 1) {
    const Tensor x = Tensor::empty({5}, DType::f32);
    expect_error(
        [&] { comm->recv(x, 0); }, ErrorCode::InvalidArgument,
        {"rank 1 issued recv(5 x f32 from rank 0)", "rank 0 issued send(4 x f32 to rank 1)"});
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("check-collectives: a rank that skips an operation never reaches its seq",
          "[collectives][reliability]") {
  const auto [r, n] = rank_and_size();
  if (n < 2) return;
  {
    auto comm = checked("tp", 1.0);
    const int skipper = n - 1;
    const Tensor t = Tensor::full({4}, 1.0, DType::f32);
    comm->all_reduce(t).wait();  // seq 0
    if (r != skipper) {
      const auto t0 = Clock::now();
      expect_error(
          [&] { comm->all_reduce(t); }, ErrorCode::Timeout,
          {rank_s(skipper) + " never reached seq 1 on 'tp'", "issued all_reduce(sum, 4 x f32)"});
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      CHECK(waited >= 0.9);
      CHECK(waited < 10.0);
      // The check no longer pairs up: what comes next is refused at once.
      expect_error([&] { comm->barrier(); }, ErrorCode::Aborted, {"never reached seq 1"});
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  {
    auto comm = checked("pp", 1.0);
    if (r == 1) {  // rank 0 never sends
      const Tensor x = Tensor::empty({2}, DType::f32);
      expect_error([&] { comm->recv(x, 0); }, ErrorCode::Timeout,
                   {"rank 0 never reached send #0 to rank 1 on 'pp'", "recv(2 x f32 from rank 0)"});
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("check-collectives: off by default, on with the flag or the variable",
          "[collectives][reliability]") {
  CHECK_FALSE(RuntimeConfig{}.check_collectives);
  CHECK_FALSE(RuntimeConfig::from({}, {"prog"}).check_collectives);
  CHECK(RuntimeConfig::from({}, {"prog", "--check-collectives"}).check_collectives);
  CHECK(RuntimeConfig::from({{"QUINTET_CHECK_COLLECTIVES", "1"}}, {"prog"}).check_collectives);
  CHECK_FALSE(
      RuntimeConfig::from({{"QUINTET_CHECK_COLLECTIVES", "1"}}, {"prog", "--check-collectives=0"})
          .check_collectives);
  const int n = rank_and_size().second;
  {
    World world = init(RuntimeConfig::from({}, {"prog", "--device", "cpu"}));
    CHECK_FALSE(checks_collectives(world.comm()));
  }
  {
    World world = init(RuntimeConfig::from({}, {"prog", "--device", "cpu", "--check-collectives"}));
    CHECK(checks_collectives(world.comm()) == (n > 1));
    CHECK(&world.comm() == &world.cpu_comm());
    const Tensor t = Tensor::full({3}, 2.0, DType::f32);
    world.comm().all_reduce(t).wait();
    CHECK(t.item({0}) == 2.0 * n);
  }
}
