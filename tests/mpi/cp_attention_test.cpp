// Context-parallel attention under mpirun (quintet/parallel/context/ring_attention.hpp): ring and
// all-to-all attention over every rank of the world as one cp group give the output, lse and
// dQ/dK/dV of one attention over the whole sequence (every rank computes it from the same draws)
// within 1e-5 relative in f32, causal and full, with as many key/value heads as query heads and
// with fewer (grouped-query: 2, and 1); the load-balanced layout round-trips; bad shapes and head
// counts all-to-all cannot split are refused before any communication.
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

// q and dout with h heads, k and v with kv heads (grouped-query attention when kv < h).
Full draws(std::int64_t b, std::int64_t h, std::int64_t kv, std::int64_t s, std::int64_t d) {
  return {Tensor::randn({b, h, s, d}, 1), Tensor::randn({b, kv, s, d}, 2),
          Tensor::randn({b, kv, s, d}, 3), Tensor::randn({b, h, s, d}, 4)};
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
  // Key/value heads: as many as the query heads, 2 (split over cp 2, repeated over cp 4; cp 3
  // cannot take them all-to-all) and 1 (MQA: repeated to every rank).
  for (const std::int64_t kv : {heads, std::int64_t{2}, std::int64_t{1}})
    for (bool causal : {true, false}) {
      for (std::int64_t chunk : {3, 8}) {
        if (kv < heads && chunk == 8) continue;  // the chunk sizes are covered without GQA
        INFO((causal ? "causal" : "full")
             << ", chunk " << chunk << ", cp " << n << ", kv heads " << kv << " of " << heads);
        const std::int64_t seq = 2 * n * chunk;
        const Full f = draws(2, heads, kv, seq, 16);
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
        if (kv % n != 0 && n % kv != 0) {
          REQUIRE_THROWS_QUINTET(
              context::ulysses_attention_forward(cp, q, k, v, o), InvalidArgument,
              fmt::format("splits the {} local key/value heads over cp {}", kv, n));
          continue;
        }
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
                         "with q's sizes [1, 2, 4, 8] but kv heads dividing its heads");
  const Tensor q3 = Tensor::randn({1, 3, 4, 8}, 4), k2 = Tensor::randn({1, 2, 4, 8}, 5);
  REQUIRE_THROWS_QUINTET(context::ring_attention_backward(cp, q3, q3, k2, k2, q3, q3, o),
                         InvalidArgument, "found k [1, 2, 4, 8], v [1, 2, 4, 8]");
  if (n > 1) {
    const Tensor heads = Tensor::randn({1, 2 * n + 1, 4, 8}, 3);
    REQUIRE_THROWS_QUINTET(context::ulysses_attention_forward(cp, heads, heads, heads, o),
                           InvalidArgument, "does not divide them");
  }
  if (n == 3) {  // 6 query heads split over cp 3, but 2 key/value heads neither split nor repeat
    const Tensor q6 = Tensor::randn({1, 6, 6, 8}, 6), kv2 = Tensor::randn({1, 2, 6, 8}, 7);
    REQUIRE_THROWS_QUINTET(context::ulysses_attention_forward(cp, q6, kv2, kv2, o), InvalidArgument,
                           "splits the 2 local key/value heads over cp 3 with their query heads");
  }
  world.comm().barrier().wait();  // every rank got here without a collective in between
}
