// Tensor- and sequence-parallel layers under mpirun, tp = every rank of the job (1, 2, 3, 4):
// each layer's output, input gradient and every parameter gradient equal the unsharded nn
// layer's (built from the same seed, compared by parameter name, the sharded ones against their
// slice of the unsharded tensor), with and without sequence parallelism; sizes that do not divide
// are rejected before any communication. f32, tolerance tp_support.hpp's kAbsTol/kRelTol.
#include <map>

#include "quintet/parallel/model/block.hpp"
#include "quintet/parallel/tensor_parallel/attention.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"
#include "quintet/parallel/tensor_parallel/mlp.hpp"
#include "quintet/parallel/tensor_parallel/norm.hpp"
#include "quintet/parallel/tensor_parallel/regions.hpp"
#include "quintet/parallel/tensor_parallel/vocab.hpp"
#include "support/nn_layers.hpp"
#include "tp_block_reference.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace tp_test;

namespace {

const Stream kCpu;
// Sizes dividing by 1, 2, 3 and 4.
constexpr std::int64_t kB = 2, kS = 12, kD = 24, kHeads = 12, kHidden = 48, kVocab = 36;

enum class Split { none, seq, last };

Tensor split(const Tensor& t, Split s, Communicator& tp) {
  if (s == Split::none) return t;
  return chunk(t, s == Split::seq ? 1 : t.dim() - 1, tp.rank(), tp.size());
}

// Runs `mine` (sharded) and `ref` (unsharded) on x_ref / its split and compares everything.
void compare(nn::Module& mine, nn::Module& ref, Communicator& tp, const Tensor& x_ref,
             Split in_split, Split out_split, std::uint64_t seed) {
  nn::ParameterStore my_store(mine, DType::f32, kCpu, seed);
  nn::ParameterStore ref_store(ref, DType::f32, kCpu, seed);
  std::map<std::string, int> ready;
  my_store.add_grad_ready_hook([&](nn::Parameter& p) { ++ready[p.name()]; });
  require_params_match(mine, ref, tp, false);

  nn::Context my_ctx(kCpu), ref_ctx(kCpu);
  const Tensor y_ref = ref.forward(ref_ctx, x_ref);
  const Tensor y = mine.forward(my_ctx, split(x_ref, in_split, tp));
  require_close(y, split(y_ref, out_split, tp), "output");

  const Tensor dy_ref = Tensor::randn(y_ref.shape(), seed + 7);
  const Tensor dx_ref = ref.backward(ref_ctx, dy_ref);
  const Tensor dx = mine.backward(my_ctx, split(dy_ref, out_split, tp));
  REQUIRE(my_ctx.pending() == 0);
  REQUIRE(dx.defined() == dx_ref.defined());
  if (dx_ref.defined()) require_close(dx, split(dx_ref, in_split, tp), "input gradient");
  require_params_match(mine, ref, tp, true);
  for (const nn::Parameter* p : my_store.parameters()) {
    INFO(p->name());
    REQUIRE(ready[p->name()] == 1);
  }
}

Tensor input(std::uint64_t seed, std::int64_t features = kD) {
  return Tensor::randn({kB, kS, features}, seed);
}

}  // namespace

TEST_CASE("tp linear layers equal nn::Linear", "[tp]") {
  World world = cpu_world();
  Mesh mesh(Layout(ParallelConfig{.tp = world.size()}, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  const bool sp = GENERATE(false, true);
  const bool bias = GENERATE(false, true);
  INFO("tp = " << tp.size() << ", sequence_parallel = " << sp << ", bias = " << bias);
  SECTION("column-parallel") {
    tensor_parallel::ColumnParallelLinear mine(
        tp, kD, kHidden, {.bias = bias, .init_std = 0.5f, .sequence_parallel = sp});
    nn::Linear ref(kD, kHidden, {.bias = bias, .init_std = 0.5f});
    compare(mine, ref, tp, input(11), sp ? Split::seq : Split::none, Split::last, 101);
  }
  SECTION("column-parallel with fused parts (QKV)") {
    tensor_parallel::ColumnParallelLinear mine(
        tp, kD, 3 * kD,
        {.bias = bias, .init_std = 0.5f, .sequence_parallel = sp, .fused_parts = 3});
    nn::Linear ref(kD, 3 * kD, {.bias = bias, .init_std = 0.5f});
    nn::ParameterStore my_store(mine, DType::f32, kCpu, 5), ref_store(ref, DType::f32, kCpu, 5);
    require_params_match(mine, ref, tp, false);
    const Tensor x = input(12);
    nn::Context c1(kCpu), c2(kCpu);
    const Tensor y_ref = ref.forward(c2, x).view({kB, kS, 3, kD});
    const Tensor y = mine.forward(c1, split(x, sp ? Split::seq : Split::none, tp));
    require_close(y, chunk(y_ref, 3, tp.rank(), tp.size()), "fused output");
    const Tensor dy_ref = Tensor::randn({kB, kS, 3, kD}, 13);
    const Tensor dx_ref = ref.backward(c2, dy_ref.view({kB, kS, 3 * kD}));
    const Tensor dx = mine.backward(c1, chunk(dy_ref, 3, tp.rank(), tp.size()).view({kB, kS, -1}));
    require_close(dx, split(dx_ref, sp ? Split::seq : Split::none, tp), "input gradient");
    require_params_match(mine, ref, tp, true);
  }
  SECTION("row-parallel") {
    tensor_parallel::RowParallelLinear mine(
        tp, kHidden, kD, {.bias = bias, .init_std = 0.5f, .sequence_parallel = sp});
    nn::Linear ref(kHidden, kD, {.bias = bias, .init_std = 0.5f});
    compare(mine, ref, tp, input(14, kHidden), Split::last, sp ? Split::seq : Split::none, 102);
  }
}

TEST_CASE("tp attention, MLP, norms and block equal their nn layers", "[tp]") {
  World world = cpu_world();
  Mesh mesh(Layout(ParallelConfig{.tp = world.size()}, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  const bool sp = GENERATE(false, true);
  const Split act = sp ? Split::seq : Split::none;
  INFO("tp = " << tp.size() << ", sequence_parallel = " << sp);
  SECTION("attention") {
    tensor_parallel::ParallelAttention mine(
        tp, kD, kHeads, kS, {.init_std = 0.3f, .proj_init_std = 0.2f, .sequence_parallel = sp});
    nn::CausalSelfAttention ref(kD, kHeads, kS, {.init_std = 0.3f, .proj_init_std = 0.2f});
    compare(mine, ref, tp, input(21), act, act, 201);
  }
  // The MLP of activation a on input(input_seed), parameters drawn from seed.
  const auto mlp = [&](nn::Activation a, std::uint64_t input_seed, std::uint64_t seed) {
    tensor_parallel::ParallelMLP mine(
        tp, kD, kHidden,
        {.activation = a, .init_std = 0.3f, .proj_init_std = 0.2f, .sequence_parallel = sp});
    nn::MLP ref(kD, kHidden, a, 0.3f, 0.2f);
    compare(mine, ref, tp, input(input_seed), act, act, seed);
  };
  SECTION("MLP gelu") { mlp(nn::Activation::gelu, 22, 202); }
  SECTION("MLP swiglu") { mlp(nn::Activation::swiglu, 23, 203); }
  SECTION("layernorm") {
    tensor_parallel::ParallelLayerNorm mine(kD, {.eps = 1e-5f, .sequence_parallel = sp});
    nn::LayerNorm ref(kD, 1e-5f);
    compare(mine, ref, tp, input(24), act, act, 204);
    for (const nn::Parameter* p : mine.parameters()) CHECK(p->attributes().reduce_over_tp == sp);
  }
  SECTION("rmsnorm") {
    tensor_parallel::ParallelRMSNorm mine(kD, {.eps = 1e-5f, .sequence_parallel = sp});
    nn::RMSNorm ref(kD, 1e-5f);
    compare(mine, ref, tp, input(25), act, act, 205);
  }
  // The block of c on input(input_seed) against the single-rank block of c's settings.
  const auto block = [&](const model::GptConfig& c, std::uint64_t input_seed, std::uint64_t seed) {
    model::TransformerBlock mine(c, {&tp});
    nn::TransformerBlock ref(reference_block_config(c));
    compare(mine, ref, tp, input(input_seed), act, act, seed);
  };
  SECTION("transformer block, layernorm + gelu") {
    block({.hidden = kD,
           .heads = kHeads,
           .ffn_hidden = kHidden,
           .seq_len = kS,
           .init_std = 0.3f,
           .proj_init_std = 0.2f,
           .sequence_parallel = sp},
          26, 206);
  }
  SECTION("transformer block, rmsnorm + swiglu, no bias") {
    block({.hidden = kD,
           .heads = kHeads,
           .ffn_hidden = kHidden,
           .seq_len = 2 * kS,
           .norm = nn::NormKind::rmsnorm,
           .activation = nn::Activation::swiglu,
           .bias = false,
           .init_std = 0.3f,
           .proj_init_std = 0.2f,
           .sequence_parallel = sp},
          27, 207);
  }
}

TEST_CASE("tp vocabulary-parallel embedding, position embedding and cross-entropy", "[tp]") {
  World world = cpu_world();
  Mesh mesh(Layout(ParallelConfig{.tp = world.size()}, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  const bool sp = GENERATE(false, true);
  const Split act = sp ? Split::seq : Split::none;
  INFO("tp = " << tp.size() << ", sequence_parallel = " << sp);
  SECTION("embedding") {
    std::vector<std::int64_t> ids(kB * kS);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = (7 * i + 3) % kVocab;
    ids[1] = ids[5];  // a repeated id: its gradient rows add up
    tensor_parallel::VocabParallelEmbedding mine(tp, kVocab, kD,
                                                 {.init_std = 0.5f, .sequence_parallel = sp});
    nn::Embedding ref(kVocab, kD, 0.5f);
    compare(mine, ref, tp, Tensor::from_vector(ids, {kB, kS}), Split::none, act, 301);
    CHECK(mine.vocab_start() == tp.rank() * kVocab / tp.size());
  }
  SECTION("position embedding") {
    // The reference: x + nn::Embedding(positions), positions 0..S-1 of every row.
    class Reference : public nn::Module {
     public:
      Reference() { emb_ = &add_module("pos", std::make_unique<nn::Embedding>(kS, kD, 0.5f)); }
      Tensor forward(nn::Context& ctx, const Tensor& x) override {
        std::vector<std::int64_t> pos(kB * kS);
        for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int64_t>(i) % kS;
        return nn::add(x, emb_->forward(ctx, Tensor::from_vector(pos, {kB, kS})), ctx.stream());
      }
      Tensor backward(nn::Context& ctx, const Tensor& dy) override {
        emb_->backward(ctx, dy);
        return dy;
      }
      nn::Embedding* emb_;
    } ref;
    class Mine : public nn::Module {
     public:
      Mine(Communicator& tp, bool sp) {
        pe_ = &add_module("pos", std::make_unique<tensor_parallel::PositionEmbedding>(
                                     tp, kS, kD,
                                     tensor_parallel::EmbeddingOptions{.init_std = 0.5f,
                                                                       .sequence_parallel = sp}));
      }
      Tensor forward(nn::Context& ctx, const Tensor& x) override { return pe_->forward(ctx, x); }
      Tensor backward(nn::Context& ctx, const Tensor& dy) override {
        return pe_->backward(ctx, dy);
      }
      tensor_parallel::PositionEmbedding* pe_;
    } mine(tp, sp);
    compare(mine, ref, tp, input(31), act, act, 302);
  }
  SECTION("cross-entropy") {
    const std::int64_t ignore = GENERATE(-100, 5);
    const Tensor logits = Tensor::randn({kB, kS, kVocab}, 33);
    std::vector<std::int32_t> t(kB * kS);
    for (std::size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<std::int32_t>((11 * i + 2) % kVocab);
    t[0] = -100;  // ignored by the default ignore index, a bad target otherwise
    if (ignore != -100) t[0] = static_cast<std::int32_t>(ignore);
    t[3] = static_cast<std::int32_t>(ignore);
    const Tensor targets = Tensor::from_vector(t, {kB, kS});
    const auto want = nn::cross_entropy_forward(logits, targets, ignore, kCpu);
    tensor_parallel::VocabParallelCrossEntropy ce(tp, kVocab, ignore);
    const Tensor shard = chunk(logits, 2, tp.rank(), tp.size());
    const auto got = ce.forward(shard, targets, kCpu);
    require_close(got.loss, want.loss, "loss");
    require_close(got.lse, want.lse, "lse");
    require_close(got.valid_count, want.valid_count, "valid_count", 0.0, 0.0);
    CHECK(got.valid_count.item() == kB * kS - 2);
    const float dloss = 0.75f;
    const Tensor dl_want = nn::cross_entropy_backward(logits, targets, want.lse, want.valid_count,
                                                      dloss, ignore, kCpu);
    require_close(ce.backward(shard, targets, got, dloss, kCpu),
                  chunk(dl_want, 2, tp.rank(), tp.size()), "dlogits");
  }
}

TEST_CASE("tp rejects sizes that do not divide, before communicating", "[tp]") {
  World world = cpu_world();
  Communicator& tp = world.comm();
  const int n = tp.size();
  if (n == 1) return;              // everything divides by 1
  const std::int64_t odd = n + 1;  // not a multiple of n >= 2
  // Only some ranks construct: a check that communicated first would hang the test.
  if (tp.rank() == n - 1) {
    REQUIRE_THROWS_QUINTET(tensor_parallel::ColumnParallelLinear(tp, 8, odd), InvalidArgument,
                           fmt::format("out = {} is not divisible by the tensor-parallel size "
                                       "tp = {}",
                                       odd, n));
    REQUIRE_THROWS_QUINTET(tensor_parallel::RowParallelLinear(tp, odd, 8), InvalidArgument,
                           fmt::format("in = {} is not divisible", odd));
    REQUIRE_THROWS_QUINTET(
        tensor_parallel::VocabParallelEmbedding(tp, odd, 8, {.sequence_parallel = true}),
        InvalidArgument, fmt::format("vocab = {} is not divisible", odd));
    REQUIRE_THROWS_QUINTET(tensor_parallel::VocabParallelCrossEntropy(tp, odd), InvalidArgument,
                           fmt::format("vocab = {} is not divisible", odd));
    REQUIRE_THROWS_QUINTET(tensor_parallel::ParallelAttention(tp, 4 * odd, odd, 16),
                           InvalidArgument, fmt::format("heads = {} is not divisible", odd));
    REQUIRE_THROWS_QUINTET(tensor_parallel::ParallelMLP(tp, 8, odd), InvalidArgument,
                           fmt::format("hidden = {} is not divisible", odd));
    model::GptConfig c{.hidden = 4 * odd, .heads = odd, .ffn_hidden = 4 * n};
    REQUIRE_THROWS_QUINTET(model::TransformerBlock(c, {&tp}), InvalidArgument,
                           fmt::format("heads = {} is not divisible by the tensor-parallel size "
                                       "tp = {}",
                                       odd, n));
    // A sequence that does not split evenly, at forward, before the all-gather/reduce-scatter.
    tensor_parallel::VocabParallelEmbedding emb(tp, 4 * n, 8, {.sequence_parallel = true});
    nn::ParameterStore store(emb, DType::f32, kCpu, 1);
    nn::Context ctx(kCpu);
    const Tensor ids = Tensor::full({1, odd}, 0, DType::i64);
    REQUIRE_THROWS_QUINTET(emb.forward(ctx, ids), InvalidArgument,
                           fmt::format("seq = {} is not divisible by the tensor-parallel size "
                                       "tp = {}",
                                       odd, n));
    REQUIRE_THROWS_QUINTET(
        tensor_parallel::reduce_scatter_sequence(Tensor::zeros({2, odd, 3}), tp, kCpu),
        InvalidArgument, fmt::format("seq = {} is not divisible", odd));
    // A target outside the vocabulary: rejected before the all-gather.
    tensor_parallel::VocabParallelCrossEntropy ce(tp, 4 * n);
    const Tensor bad = Tensor::full({1, 2}, 4 * n, DType::i64);
    REQUIRE_THROWS_QUINTET(ce.forward(Tensor::zeros({1, 2, 4}), bad, kCpu), InvalidArgument,
                           "outside the vocabulary");
  }
  tp.barrier().wait();
}
