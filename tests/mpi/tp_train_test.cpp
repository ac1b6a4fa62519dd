// A transformer block trained for a few steps under tp = 2 x dp = 2 (4 ranks), with and without
// sequence parallelism, follows the same block trained on one rank over the whole batch: outputs
// at every step and the parameters after every AdamW update. The test does what data parallelism
// would: it sums the reduce_over_tp gradients over tp, then averages every gradient over dp.
// Clipping is off: the norm of one rank's shards is not the global norm. f32; outputs within
// tp_support.hpp's tolerance, parameters within kParamTol after each step.
#include "quintet/parallel/model/block.hpp"
#include "support/nn_adamw.hpp"
#include "support/nn_layers.hpp"
#include "tp_block_reference.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace tp_test;

namespace {
const Stream kCpu;
constexpr std::int64_t kB = 4, kS = 8, kD = 16, kHeads = 4, kHidden = 32;
constexpr int kSteps = 4;
constexpr double kParamTol = 2e-5;
}  // namespace

TEST_CASE("tp=2 x dp=2 transformer block training equals one rank", "[tp][dp]") {
  World world = cpu_world();
  REQUIRE(world.size() == 4);
  Mesh mesh(Layout(ParallelConfig{.tp = 2}, 4), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  Communicator& dp = mesh.comm(Axis::dp);
  REQUIRE(dp.size() == 2);
  const bool sp = GENERATE(false, true);
  const auto act = GENERATE(nn::Activation::gelu, nn::Activation::swiglu);
  INFO("sequence_parallel = " << sp << ", swiglu = " << (act == nn::Activation::swiglu));

  model::GptConfig pc{.hidden = kD,
                      .heads = kHeads,
                      .ffn_hidden = kHidden,
                      .seq_len = kS,
                      .activation = act,
                      .init_std = 0.2f,
                      .proj_init_std = 0.1f,
                      .sequence_parallel = sp};
  model::TransformerBlock mine(pc, {&tp});
  nn::TransformerBlock ref(reference_block_config(pc));
  nn::ParameterStore my_store(mine, DType::f32, kCpu, 42), ref_store(ref, DType::f32, kCpu, 42);
  nn::AdamWConfig oc;
  // eps well above the f32 noise of gradients that are zero in exact arithmetic (the key bias:
  // softmax ignores a shift of all keys), which Adam would otherwise blow up to +-lr.
  oc.hyper = nn::AdamWHyper{.lr = 1e-2f, .eps = 1e-4f, .weight_decay = 0.1f};
  oc.max_grad_norm = 0.0f;
  nn::AdamW my_opt(my_store, oc, kCpu), ref_opt(ref_store, oc, kCpu);
  require_params_match(mine, ref, tp, false);

  const std::int64_t local_b = kB / dp.size(), b0 = dp.rank() * local_b;
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    // loss = sum(y * g) / kB over the global batch; dp rank d holds rows [b0, b0 + local_b).
    const Tensor x = Tensor::randn({kB, kS, kD}, 100 + step);
    const Tensor g = Tensor::randn({kB, kS, kD}, 200 + step);
    const Tensor dy = nn::scale(g, 1.0f / kB, kCpu);

    ref_store.zero_grad(kCpu);
    nn::Context ref_ctx(kCpu);
    const Tensor y_ref = ref.forward(ref_ctx, x);
    ref.backward(ref_ctx, dy);
    ref_opt.step(kCpu);

    auto local = [&](const Tensor& t) {
      Tensor mine_part = t.narrow(0, b0, local_b);
      return sp ? chunk(mine_part, 1, tp.rank(), tp.size()) : mine_part.contiguous();
    };
    my_store.zero_grad(kCpu);
    nn::Context ctx(kCpu);
    const Tensor y = mine.forward(ctx, local(x));
    require_close(y, local(y_ref), "output");
    // Each dp rank's loss is its rows' part of the global mean: its dy is scaled by dp.size()
    // so that averaging over dp gives the global gradient.
    mine.backward(ctx, nn::scale(local(dy), static_cast<float>(dp.size()), kCpu));
    for (nn::Parameter* p : my_store.parameters()) {
      if (p->attributes().reduce_over_tp) tp.all_reduce(p->grad()).wait();
    }
    dp.all_reduce(my_store.grad_buffer(), ReduceOp::avg).wait();
    my_opt.step(kCpu);
    require_params_match(mine, ref, tp, false, kParamTol);
  }
}
