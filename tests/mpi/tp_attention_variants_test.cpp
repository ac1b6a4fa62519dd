// ParallelAttention's variants under mpirun, tp = every rank of the job (1 to 4): grouped-query
// attention (q and fused kv projections; kv_heads 1 and 2 below tp replicate each key/value head
// over tp / kv_heads ranks), a head_dim apart from dim / heads, QK-norm and RoPE;
// with and without sequence parallelism and biases. On one rank, the layer's output equals the
// nn ops composed here (projections, RMSNorm, RoPE, grouped-query attention, projection) and its
// gradients equal finite differences (f64). Under tp, each rank's output, input gradient and
// every parameter gradient (QK-norm's summed over tp) equal those of the same layer built on one
// rank (a one-rank communicator) from the same seed. Bad head counts and GptConfig combinations are
// refused before any communication. f32, tolerance tp_support.hpp's kAbsTol/kRelTol.
#include <map>
#include <memory>

#include "quintet/parallel/model/block.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/tensor_parallel/attention.hpp"
#include "tp_support.hpp"
#include "unit/nn_gradcheck.hpp"

using namespace quintet;
using namespace tp_test;

namespace {

const Stream kCpu;
// Sizes dividing by 1, 2 and 3; kv heads too.
constexpr std::int64_t kB = 2, kS = 12, kD = 24, kHeads = 12, kKvHeads = 6;

Tensor seq_split(const Tensor& t, bool sp, Communicator& tp) {
  return sp ? chunk(t, 1, tp.rank(), tp.size()) : t;
}

struct Variant {
  const char* name;
  std::int64_t kv_heads, head_dim;
  bool qk_norm, rope;
};

}  // namespace

TEST_CASE("one-rank attention with GQA, QK-norm and RoPE: the ops composed, finite differences",
          "[tp][attention]") {
  World world = cpu_world();
  const std::unique_ptr<Communicator> one = world.comm().split(world.rank(), 0, "one_rank");
  const std::int64_t B = 1, S = 5, D = 8, H = 4, Hkv = 2, hd = 4;
  const tensor_parallel::ParallelAttentionOptions o{.bias = true,
                                                    .init_std = 0.5f,
                                                    .proj_init_std = 0.5f,
                                                    .kv_heads = Hkv,
                                                    .head_dim = hd,
                                                    .qk_norm = true,
                                                    .qk_norm_eps = 1e-6f,
                                                    .rope = true,
                                                    .rope_theta = 30.0};
  tensor_parallel::ParallelAttention layer(*one, D, H, S, o);
  nn::ParameterStore store(layer, DType::f64, kCpu, 77);
  std::map<std::string, Tensor> w;
  for (const auto& [name, p] : layer.named_parameters()) w[name] = p->data();
  REQUIRE(w.size() == 8);  // q, kv, proj (weight and bias), q_norm, k_norm
  // Norm gains away from 1, so that a mix-up of q's and k's would show.
  w["q_norm.weight"].copy_(nn_test::randn64({hd}, 5));
  w["k_norm.weight"].copy_(nn_test::randn64({hd}, 6));
  Tensor x = nn_test::randn64({B, S, D}, 78);

  // The same math from the ops: [B, S, heads, hd] heads, norms, rotations, attention.
  const Tensor q = nn::linear_forward(x, w["q.weight"], w["q.bias"], kCpu).view({B, S, H, hd});
  const Tensor kv = nn::linear_forward(x, w["kv.weight"].view({2 * Hkv * hd, D}),
                                       w["kv.bias"].view({2 * Hkv * hd}), kCpu)
                        .view({B, S, 2, Hkv, hd});
  const Tensor k = kv.narrow(2, 0, 1).contiguous().view({B, S, Hkv, hd});
  const Tensor v = kv.narrow(2, 1, 1).contiguous().view({B, S, Hkv, hd});
  nn::RopeOptions ro;
  ro.theta = 30.0;
  const Tensor qr = nn::rope_forward(nn::rmsnorm_forward(q, w["q_norm.weight"], 1e-6f, kCpu).y,
                                     Tensor(), ro, kCpu);
  const Tensor kr = nn::rope_forward(nn::rmsnorm_forward(k, w["k_norm.weight"], 1e-6f, kCpu).y,
                                     Tensor(), ro, kCpu);
  const nn::AttentionOutput a = nn::attention_forward(qr.transpose(1, 2), kr.transpose(1, 2),
                                                      v.transpose(1, 2).contiguous(), {}, kCpu);
  const Tensor want = nn::linear_forward(a.out.transpose(1, 2).contiguous().view({B, S, H * hd}),
                                         w["proj.weight"], w["proj.bias"], kCpu);
  nn::Context ctx(kCpu);
  const Tensor y = layer.forward(ctx, x);
  nn_test::require_close(y, want, 1e-12, "output against the ops");

  const Tensor r = nn_test::randn64(y.shape(), 79);
  const Tensor dx = layer.backward(ctx, r);
  REQUIRE(ctx.pending() == 0);
  auto loss = [&] {
    nn::Context c(kCpu);
    return nn_test::dot(layer.forward(c, x), r);
  };
  nn_test::require_close(dx, nn_test::numeric_grad(loss, x), 1e-6, "dx");
  for (const nn::Parameter* p : store.parameters()) {
    nn_test::require_close(p->grad(), nn_test::numeric_grad(loss, p->data()), 1e-6,
                           p->name().c_str());
  }
}

TEST_CASE("tp attention with GQA, head_dim, QK-norm and RoPE equals the one-rank layer",
          "[tp][attention]") {
  World world = cpu_world();
  Mesh mesh(Layout(ParallelConfig{.tp = world.size()}, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  const std::unique_ptr<Communicator> one = tp.split(tp.rank(), 0, "one_rank");
  const Variant variants[] = {
      {"grouped-query", kKvHeads, 0, false, false},
      {"grouped-query, head_dim 6, QK-norm, RoPE", kKvHeads, 6, true, true},
      {"multi-head, QK-norm, RoPE", 0, 0, true, true},
      {"grouped-query (group of 4), RoPE", 3, 0, false, true},
      {"multi-query (kv_heads 1), RoPE", 1, 0, false, true},
      {"grouped-query (kv_heads 2), QK-norm", 2, 0, true, false},
  };
  const bool sp = GENERATE(false, true);
  const bool bias = GENERATE(false, true);
  std::uint64_t seed = 300;
  for (const Variant& v : variants) {
    const int n = tp.size();
    // kv_heads < tp: each key/value head replicated over tp / kv_heads ranks.
    const int replicas = v.kv_heads > 0 && v.kv_heads < n ? n / static_cast<int>(v.kv_heads) : 1;
    if (v.kv_heads > 0 && v.kv_heads % n != 0 && n % v.kv_heads != 0) continue;  // refused below
    INFO("tp = " << tp.size() << ", " << v.name << ", sequence_parallel = " << sp
                 << ", bias = " << bias);
    auto options = [&](bool seq_par) {
      return tensor_parallel::ParallelAttentionOptions{.bias = bias,
                                                       .init_std = 0.3f,
                                                       .proj_init_std = 0.2f,
                                                       .sequence_parallel = seq_par,
                                                       .kv_heads = v.kv_heads,
                                                       .head_dim = v.head_dim,
                                                       .qk_norm = v.qk_norm,
                                                       .rope = v.rope,
                                                       .rope_theta = 50.0};
    };
    tensor_parallel::ParallelAttention mine(tp, kD, kHeads, kS, options(sp));
    tensor_parallel::ParallelAttention ref(*one, kD, kHeads, kS, options(false));
    ++seed;
    agreed(tp, [&] {
      nn::ParameterStore my_store(mine, DType::f32, kCpu, seed);
      nn::ParameterStore ref_store(ref, DType::f32, kCpu, seed);
      std::map<std::string, int> ready;
      my_store.add_grad_ready_hook([&](nn::Parameter& p) { ++ready[p.name()]; });
      require_params_match(mine, ref, tp, false);
      for (const nn::Parameter* p : mine.parameters()) {
        INFO(p->name());
        const bool norm = p->name().find("_norm.") != std::string::npos;
        CHECK(p->attributes().reduce_over_tp == norm);
        const bool kv = p->name().rfind("kv.", 0) == 0;
        CHECK(p->attributes().tp_replicas == (kv ? replicas : 1));
      }
      const Tensor x = Tensor::randn({kB, kS, kD}, seed + 1);
      nn::Context my_ctx(kCpu), ref_ctx(kCpu);
      const Tensor y_ref = ref.forward(ref_ctx, x);
      const Tensor y = mine.forward(my_ctx, seq_split(x, sp, tp));
      require_close(y, seq_split(y_ref, sp, tp), "output");
      const Tensor dy = Tensor::randn(y_ref.shape(), seed + 2);
      const Tensor dx_ref = ref.backward(ref_ctx, dy);
      const Tensor dx = mine.backward(my_ctx, seq_split(dy, sp, tp));
      REQUIRE(my_ctx.pending() == 0);
      require_close(dx, seq_split(dx_ref, sp, tp), "input gradient");
      require_params_match(mine, ref, tp, true);
      for (const nn::Parameter* p : my_store.parameters()) {
        INFO(p->name());
        REQUIRE(ready[p->name()] == 1);
      }
    });
  }
}

TEST_CASE("cp attention with GQA, QK-norm and RoPE: each rank's chunks at their true positions",
          "[tp][attention]") {
  World world = cpu_world();
  Communicator& cp = world.comm();  // cp = every rank, tp = 1
  const std::unique_ptr<Communicator> one = cp.split(cp.rank(), 0, "one_rank");
  const int n = cp.size(), r = cp.rank();
  const std::int64_t seq = 6 * n;  // 2 * cp chunks of 3 tokens
  // Key/value heads: as many as the query heads, 2 (all-to-all: split over cp 2, repeated over
  // cp 4, refused at cp 3) and 1.
  for (const std::int64_t kv : {kHeads, std::int64_t{2}, std::int64_t{1}})
    for (const auto kind :
         {context::ContextParallelKind::ring, context::ContextParallelKind::all_to_all}) {
      const bool ring = kind == context::ContextParallelKind::ring;
      INFO("cp = " << n << (ring ? ", ring" : ", all-to-all") << ", kv_heads " << kv);
      tensor_parallel::ParallelAttentionOptions o{.init_std = 0.3f,
                                                  .proj_init_std = 0.2f,
                                                  .cp_kind = kind,
                                                  .kv_heads = kv,
                                                  .qk_norm = true,
                                                  .rope = true,
                                                  .rope_theta = 20.0};
      tensor_parallel::ParallelAttention ref(*one, kD, kHeads, seq, o);
      o.cp = &cp;
      if (!ring && kv % n != 0 && n % kv != 0) {
        REQUIRE_THROWS_QUINTET(
            tensor_parallel::ParallelAttention(*one, kD, kHeads, seq, o), InvalidArgument,
            fmt::format("splits the {} local key/value heads (heads {}, kv_heads "
                        "{}, tp 1) over cp {}",
                        kv, kHeads, kv, n));
        continue;
      }
      tensor_parallel::ParallelAttention mine(*one, kD, kHeads, seq, o);
      agreed(cp, [&] {
        nn::ParameterStore my_store(mine, DType::f32, kCpu, 61);
        nn::ParameterStore ref_store(ref, DType::f32, kCpu, 61);
        const Tensor x = Tensor::randn({kB, seq, kD}, 62), dy = Tensor::randn({kB, seq, kD}, 63);
        nn::Context my_ctx(kCpu), ref_ctx(kCpu);
        const Tensor y_ref = ref.forward(ref_ctx, x);
        const Tensor dx_ref = ref.backward(ref_ctx, dy);
        const Tensor y = mine.forward(my_ctx, context::cp_split(x, 1, n, r));
        const Tensor dx = mine.backward(my_ctx, context::cp_split(dy, 1, n, r));
        require_close(y, context::cp_split(y_ref, 1, n, r), "output");
        require_close(dx, context::cp_split(dx_ref, 1, n, r), "input gradient");
        for (nn::Parameter* p : my_store.parameters()) cp.all_reduce(p->grad()).wait();  // as dp
        require_params_match(mine, ref, *one, true);
      });
    }
}

TEST_CASE("grouped-query attention refuses head counts before communicating", "[tp][attention]") {
  World world = cpu_world();
  Communicator& tp = world.comm();
  const int n = tp.size();
  if (tp.rank() == n - 1) {  // one rank alone: a check that communicated would hang
    REQUIRE_THROWS_QUINTET(tensor_parallel::ParallelAttention(tp, 24, 12, 16, {.kv_heads = 5}),
                           InvalidArgument, "kv_heads = 5 must divide heads = 12");
    REQUIRE_THROWS_QUINTET(
        tensor_parallel::ParallelAttention(tp, 24, 12, 16, {.head_dim = 3, .rope = true}),
        InvalidArgument, "RoPE needs an even head_dim (got 3)");
    for (const std::int64_t kv : {2, 3, 4, 6}) {  // one neither split nor replicated over tp
      if (kv % n == 0 || n % kv == 0) continue;
      REQUIRE_THROWS_QUINTET(tensor_parallel::ParallelAttention(tp, 24, 12, 16, {.kv_heads = kv}),
                             InvalidArgument,
                             fmt::format("kv_heads = {} and tp = {}: each tp rank holds", kv, n));
      break;
    }
    model::GptConfig c{.hidden = 24, .heads = 12, .kv_heads = 5};
    REQUIRE_THROWS_QUINTET(c.validate(1), InvalidArgument, "kv_heads = 5 does not divide heads");
    c.kv_heads = 4;
    c.rope = true;
    REQUIRE_THROWS_QUINTET(c.validate(1), InvalidArgument,
                           "learned_positions = true and rope = true");
    c.learned_positions = false;
    c.rope = false;
    REQUIRE_THROWS_QUINTET(c.validate(1), InvalidArgument,
                           "needs exactly one kind of position information");
    c.rope = true;
    c.head_dim = 5;
    REQUIRE_THROWS_QUINTET(c.validate(1), InvalidArgument, "which must be even (head dim = 5)");
    c.head_dim = 0;
    c.seq_len = 16;
    c.validate(1, 2);  // grouped-query attention with context parallelism (ring)
    REQUIRE_THROWS_QUINTET(c.validate(6), InvalidArgument, "kv_heads = 4 and tp = 6");
    c.validate(2);  // 12 heads, 4 kv heads, RoPE, no position table: a Llama-style attention
    c.validate(4);
    c.kv_heads = 2;
    c.validate(4);  // each key/value head replicated over 2 tp ranks
    c.kv_heads = 4;
    c.context_parallel = context::ContextParallelKind::all_to_all;
    c.seq_len = 24;
    c.validate(1, 2);  // 4 key/value heads split over cp 2
    c.validate(2, 2);  // 2 per tp rank, split over cp 2
    c.kv_heads = 2;
    c.validate(4, 3);  // one per tp rank (replicated over 2), repeated over cp 3
    c.kv_heads = 4;
    REQUIRE_THROWS_QUINTET(c.validate(1, 3), InvalidArgument,
                           "splits the 4 local key/value heads (heads 12, kv_heads 4, tp 1) over "
                           "cp 3");
  }
  tp.barrier().wait();
}
