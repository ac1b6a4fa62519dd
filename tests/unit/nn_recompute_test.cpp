// nn::Recompute on the CPU: a transformer block wrapped in it keeps the block's parameter names,
// saves only its input, and gives the same output, input gradient and parameter gradients as the
// block itself, bit for bit, with weight-gradient deferral (zero-bubble schedules) as without;
// every parameter is marked ready exactly once.
#include <map>
#include <memory>

#include "quintet/nn/recompute.hpp"
#include "support/catch.hpp"
#include "support/nn_layers.hpp"
#include "unit/nn_gradcheck.hpp"

using namespace quintet;
using namespace quintet::nn;

namespace {

const Stream kCpu;

TransformerBlockConfig block_config() {
  TransformerBlockConfig c;
  c.dim = 16;
  c.heads = 2;
  c.hidden = 32;
  c.max_seq_len = 8;
  return c;
}

struct Result {
  Tensor y, dx;
  std::map<std::string, Tensor> grads;
  std::size_t saved_after_forward = 0;
};

// Forward and backward of module (its store drawn from seed) at x with output gradient dy.
Result run(Module& module, const Tensor& x, const Tensor& dy, bool defer) {
  ParameterStore store(module, DType::f32, kCpu, 7);
  std::map<std::string, int> ready;
  store.add_grad_ready_hook([&](Parameter& p) { ++ready[p.name()]; });
  Context ctx(kCpu);
  Result r;
  r.y = module.forward(ctx, x);
  r.saved_after_forward = ctx.pending();
  ctx.set_defer_weight_gradients(defer);
  r.dx = module.backward(ctx, dy);
  if (defer) {
    REQUIRE(ctx.deferred_count() > 0);
    ctx.run_deferred_gradients();
  }
  REQUIRE(ctx.pending() == 0);
  for (Parameter* p : store.parameters()) {
    INFO(p->name());
    CHECK(ready[p->name()] == 1);
    r.grads[p->name()] = p->grad().clone();
  }
  return r;
}

}  // namespace

TEST_CASE("Recompute gives the block's results bit for bit and keeps only the input") {
  const Tensor x = nn_test::randn64({2, 8, 16}, 3).to(DType::f32);
  const Tensor dy = nn_test::randn64({2, 8, 16}, 4).to(DType::f32);
  for (bool defer : {false, true}) {
    INFO("deferred weight gradients: " << defer);
    TransformerBlock plain(block_config());
    Recompute wrapped(std::make_unique<TransformerBlock>(block_config()));
    // The same parameters under the same names (so the same init draws).
    const auto names = plain.named_parameters();
    const auto wrapped_names = wrapped.named_parameters();
    REQUIRE(names.size() == wrapped_names.size());
    for (std::size_t i = 0; i < names.size(); ++i) CHECK(names[i].first == wrapped_names[i].first);

    const Result want = run(plain, x, dy, defer);
    const Result got = run(wrapped, x, dy, defer);
    CHECK(got.saved_after_forward == 1);  // the input alone
    CHECK(want.saved_after_forward > 1);
    CHECK(got.y.to_vector<float>() == want.y.to_vector<float>());
    CHECK(got.dx.to_vector<float>() == want.dx.to_vector<float>());
    for (const auto& [name, g] : want.grads) {
      INFO(name);
      CHECK(got.grads.at(name).to_vector<float>() == g.to_vector<float>());
    }
  }
}

TEST_CASE("Recompute refuses no module, and a backward without a forward") {
  REQUIRE_THROWS_QUINTET(Recompute(nullptr), InvalidArgument, "no module to wrap");
  Recompute wrapped(std::make_unique<TransformerBlock>(block_config()));
  ParameterStore store(wrapped, DType::f32, kCpu, 7);
  Context ctx(kCpu);
  REQUIRE_THROWS_QUINTET(wrapped.backward(ctx, Tensor::zeros({2, 8, 16}, DType::f32)),
                         InvalidArgument, "nothing saved for this module");
}
