// Context-parallel attention under mpirun (quintet/parallel/context/ring_attention.hpp): ring and
// all-to-all attention over every rank of the world as one cp group give the output, lse and
// dQ/dK/dV of one attention over the whole sequence (every rank computes it from the same draws)
// within 1e-5 relative in f32, causal and full; the load-balanced layout round-trips; bad shapes
// are refused before any communication.
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/core/random.hpp"
#include "quintet/parallel/context/ring_attention.hpp"
#include "tp_support.hpp"  // cpu_world, require_close

using namespace quintet;
using tp_test::agreed;
using tp_test::cpu_world;
using tp_test::require_close;

namespace {

constexpr double kTol = 1e-5;

struct Full {
  Tensor q, k, v, dout;
};

Full draws(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  return {Tensor::randn({b, h, s, d}, 1), Tensor::randn({b, h, s, d}, 2),
          Tensor::randn({b, h, s, d}, 3), Tensor::randn({b, h, s, d}, 4)};
}

}  // namespace

TEST_CASE("cp: the load-balanced split round-trips and gives each rank its positions", "[cp]") {
  World world = cpu_world();
  Communicator& cp = world.comm();
  const int n = cp.size(), r = cp.rank();
  const Tensor full = Tensor::randn({2, 3, 4 * n, 5}, 9);
  const Tensor local = context::cp_split(full, 2, n, r);
  CHECK(local.size(2) == 4);
  agreed(world.comm(),
         [&] { require_close(context::cp_gather(cp, local, 2), full, "gathered", 0.0, 0.0); });
  const std::vector<std::int64_t> pos = context::cp_positions(4 * n, n, r);
  const std::vector<std::int64_t> want = {2 * r, 2 * r + 1, 2 * (2 * n - 1 - r),
                                          2 * (2 * n - 1 - r) + 1};
  CHECK(pos == want);
  REQUIRE_THROWS_QUINTET(context::check_cp_sequence(4 * n + 1, n), InvalidArgument,
                         "must split into 2 * cp");
}

TEST_CASE("cp: ring and all-to-all attention equal one attention over the whole sequence", "[cp]") {
  World world = cpu_world();
  Communicator& cp = world.comm();
  const int n = cp.size(), r = cp.rank();
  const std::int64_t heads = 4 * n;  // divisible by cp for the all-to-all
  for (bool causal : {true, false}) {
    for (std::int64_t chunk : {3, 8}) {
      INFO((causal ? "causal" : "full") << ", chunk " << chunk << ", cp " << n);
      const std::int64_t seq = 2 * n * chunk;
      const Full f = draws(2, heads, seq, 16);
      nn::AttentionOptions whole;
      whole.causal = causal;
      const nn::AttentionOutput want = nn::attention_forward(f.q, f.k, f.v, whole, Stream());
      const nn::AttentionGrads want_g =
          nn::attention_backward(f.dout, f.q, f.k, f.v, want.out, want.lse, whole, Stream());
      const Tensor q = context::cp_split(f.q, 2, n, r), k = context::cp_split(f.k, 2, n, r);
      const Tensor v = context::cp_split(f.v, 2, n, r), dout = context::cp_split(f.dout, 2, n, r);
      context::CpAttentionOptions o;
      o.causal = causal;

      // Ring.
      const nn::AttentionOutput ring = context::ring_attention_forward(cp, q, k, v, o);
      const nn::AttentionGrads ring_g =
          context::ring_attention_backward(cp, dout, q, k, v, ring.out, ring.lse, o);
      const Tensor out = context::cp_gather(cp, ring.out, 2);
      const Tensor lse = context::cp_gather(cp, ring.lse, 2);
      const Tensor dq = context::cp_gather(cp, ring_g.dq, 2);
      const Tensor dk = context::cp_gather(cp, ring_g.dk, 2);
      const Tensor dv = context::cp_gather(cp, ring_g.dv, 2);
      agreed(world.comm(), [&] {
        require_close(out, want.out, "ring out", kTol, kTol);
        require_close(lse, want.lse, "ring lse", kTol, kTol);
        require_close(dq, want_g.dq, "ring dq", kTol, kTol);
        require_close(dk, want_g.dk, "ring dk", kTol, kTol);
        require_close(dv, want_g.dv, "ring dv", kTol, kTol);
      });

      // All-to-all.
      const context::UlyssesOutput u = context::ulysses_attention_forward(cp, q, k, v, o);
      const nn::AttentionGrads u_g = context::ulysses_attention_backward(cp, dout, u.saved, o);
      const Tensor u_out = context::cp_gather(cp, u.out, 2);
      const Tensor u_dq = context::cp_gather(cp, u_g.dq, 2);
      const Tensor u_dk = context::cp_gather(cp, u_g.dk, 2);
      const Tensor u_dv = context::cp_gather(cp, u_g.dv, 2);
      agreed(world.comm(), [&] {
        require_close(u_out, want.out, "ulysses out", kTol, kTol);
        require_close(u_dq, want_g.dq, "ulysses dq", kTol, kTol);
        require_close(u_dk, want_g.dk, "ulysses dk", kTol, kTol);
        require_close(u_dv, want_g.dv, "ulysses dv", kTol, kTol);
      });
    }
  }
}

TEST_CASE("cp: bad shapes are refused before any communication", "[cp]") {
  World world = cpu_world();
  Communicator& cp = world.comm();
  const int n = cp.size();
  const Tensor odd = Tensor::randn({1, 2, 5, 8}, 1);
  const context::CpAttentionOptions o;
  REQUIRE_THROWS_QUINTET(context::ring_attention_forward(cp, odd, odd, odd, o), InvalidArgument,
                         "is not two chunks");
  const Tensor q = Tensor::randn({1, 2, 4, 8}, 1), k = Tensor::randn({1, 2, 6, 8}, 2);
  REQUIRE_THROWS_QUINTET(context::ring_attention_forward(cp, q, k, k, o), InvalidArgument,
                         "must have q's shape");
  if (n > 1) {
    const Tensor heads = Tensor::randn({1, 2 * n + 1, 4, 8}, 3);
    REQUIRE_THROWS_QUINTET(context::ulysses_attention_forward(cp, heads, heads, heads, o),
                           InvalidArgument, "does not divide them");
  }
  world.comm().barrier().wait();  // every rank got here without a collective in between
}
