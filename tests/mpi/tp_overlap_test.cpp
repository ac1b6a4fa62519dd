// Tensor-parallel layers with their communication cut into overlap chunks, under mpirun (tp = every
// rank: 1, 2, 3, 4), against the same layers unchunked: with and without sequence parallelism, at
// 1, 2 and 4 chunks, outputs, input gradients and parameter gradients. The chunking changes which
// rows each GEMM covers, not the arithmetic of a row, so GEMM results are compared bit for bit.
// A reduction (all-reduce, reduce-scatter) sums tp values per element; MPI may pick another
// algorithm, and so another association of that sum, for the smaller messages of a chunk, so the
// values a reduction produces are compared bit for bit at tp <= 2 (a sum of two terms has one
// order) and within f32 rounding above. Chunk counts that do not divide the sequence are refused
// in forward before any communication.
#include <fmt/format.h>

#include <vector>

#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace tp_test;

namespace {

const Stream kCpu;
// seq / tp divisible by 4 at tp = 1, 2, 3, 4.
constexpr std::int64_t kB = 2, kS = 48, kD = 24, kHidden = 36;

// Exact equality where the arithmetic is the same, else f32 rounding of a tp-term sum.
void require_same(const Tensor& got, const Tensor& want, const std::string& what, bool exact) {
  if (exact) {
    INFO(what);
    REQUIRE(got.shape() == want.shape());
    REQUIRE(got.to_vector<float>() == want.to_vector<float>());
  } else {
    require_close(got, want, what, 1e-6, 1e-6);
  }
}

struct Result {
  Tensor y, dx;
  std::vector<Tensor> grads;
};

// Forward and backward of `layer` on x and dy (the same on every call), its gradients.
Result run(nn::Module& layer, const Tensor& x, const Tensor& dy, std::uint64_t seed) {
  nn::ParameterStore store(layer, DType::f32, kCpu, seed);
  nn::Context ctx(kCpu);
  Result r;
  r.y = layer.forward(ctx, x).contiguous();
  r.dx = layer.backward(ctx, dy).contiguous();
  REQUIRE(ctx.pending() == 0);
  for (const nn::Parameter* p : store.parameters()) r.grads.push_back(p->grad().clone());
  return r;
}

void compare(const Result& got, const Result& want, bool reduced_y, bool reduced_dx, int tp) {
  const bool exact_sum = tp <= 2;
  require_same(got.y, want.y, "output", !reduced_y || exact_sum);
  require_same(got.dx, want.dx, "input gradient", !reduced_dx || exact_sum);
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t i = 0; i < got.grads.size(); ++i) {
    // Weight gradients come from full-sequence inputs and dy: no reduction inside a layer.
    require_same(got.grads[i], want.grads[i], fmt::format("gradient {}", i), true);
  }
}

}  // namespace

TEST_CASE("chunked tp linear layers equal the unchunked ones", "[tp][overlap]") {
  World world = cpu_world();
  Mesh mesh(Layout(ParallelConfig{.tp = world.size()}, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  const int n = tp.size();
  const bool sp = GENERATE(false, true);
  const int chunks = GENERATE(1, 2, 4);
  INFO("tp = " << n << ", sequence_parallel = " << sp << ", overlap_chunks = " << chunks);
  const std::int64_t seq_in = sp ? kS / n : kS;
  agreed(tp, [&] {
    SECTION("column-parallel (and a fused QKV)") {
      for (const std::int64_t parts : {1, 3}) {
        INFO("fused_parts = " << parts);
        const std::int64_t out = parts * kD;
        const Tensor x = Tensor::randn({kB, seq_in, kD}, 21 + tp.rank());
        const Tensor dy = Tensor::randn({kB, kS, out / n}, 22 + tp.rank());
        tensor_parallel::ColumnParallelOptions o{
            .init_std = 0.5f, .sequence_parallel = sp, .fused_parts = parts};
        tensor_parallel::ColumnParallelLinear plain(tp, kD, out, o);
        o.overlap_chunks = chunks;
        tensor_parallel::ColumnParallelLinear chunked(tp, kD, out, o);
        // forward: gather then GEMM (no reduction); backward: dx is reduced over tp
        compare(run(chunked, x, dy, 7), run(plain, x, dy, 7), false, n > 1, n);
      }
    }
    SECTION("row-parallel") {
      const Tensor x = Tensor::randn({kB, kS, kHidden / n}, 31 + tp.rank());
      const Tensor dy = Tensor::randn({kB, seq_in, kD}, 32 + tp.rank());
      tensor_parallel::RowParallelOptions o{.init_std = 0.5f, .sequence_parallel = sp};
      tensor_parallel::RowParallelLinear plain(tp, kHidden, kD, o);
      o.overlap_chunks = chunks;
      tensor_parallel::RowParallelLinear chunked(tp, kHidden, kD, o);
      // forward: GEMM then reduction; backward: gather (SP) then GEMM, no reduction
      compare(run(chunked, x, dy, 8), run(plain, x, dy, 8), n > 1, false, n);
    }
  });
}

TEST_CASE("tp overlap chunks that do not divide the sequence are refused before communicating",
          "[tp][overlap]") {
  World world = cpu_world();
  Communicator& tp = world.comm();
  const int n = tp.size();
  REQUIRE_THROWS_QUINTET(tensor_parallel::ColumnParallelLinear(tp, 8, 4 * n, {.overlap_chunks = 0}),
                         InvalidArgument, "overlap_chunks = 0 must be >= 1");
  REQUIRE_THROWS_QUINTET(tensor_parallel::RowParallelLinear(tp, 4 * n, 8, {.overlap_chunks = -2}),
                         InvalidArgument, "overlap_chunks = -2 must be >= 1");
  if (n == 1) return;  // one rank never chunks: there is no communication to overlap
  // Only the last rank runs forward: a check that communicated first would hang the test.
  if (tp.rank() == n - 1) {
    for (const bool sp : {false, true}) {
      INFO("sequence_parallel = " << sp);
      tensor_parallel::ColumnParallelLinear col(tp, 8, 4 * n,
                                                {.sequence_parallel = sp, .overlap_chunks = 5});
      tensor_parallel::RowParallelLinear row(tp, 4 * n, 8,
                                             {.sequence_parallel = sp, .overlap_chunks = 5});
      nn::ParameterStore s1(col, DType::f32, kCpu, 1), s2(row, DType::f32, kCpu, 2);
      nn::Context ctx(kCpu);
      const std::int64_t seq = 6 * n;  // seq / tp = 6 and seq = 6 tp: neither divides by 5
      if (sp) {
        REQUIRE_THROWS_QUINTET(col.forward(ctx, Tensor::zeros({1, seq / n, 8})), InvalidArgument,
                               "not divisible by the tp overlap chunk count 5");
        REQUIRE_THROWS_QUINTET(row.forward(ctx, Tensor::zeros({1, seq, 4})), InvalidArgument,
                               fmt::format("seq = {} is not divisible by tp * overlap chunks = "
                                           "{} * 5",
                                           seq, n));
      } else {
        REQUIRE_THROWS_QUINTET(col.forward(ctx, Tensor::zeros({1, seq, 8})), InvalidArgument,
                               "not divisible by the tp overlap chunk count 5");
        REQUIRE_THROWS_QUINTET(row.forward(ctx, Tensor::zeros({1, seq, 4})), InvalidArgument,
                               "not divisible by the tp overlap chunk count 5");
      }
    }
  }
  tp.barrier().wait();
}
