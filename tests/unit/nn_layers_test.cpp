// nn layers, parameters, contexts and the AdamW optimizer on the CPU: every layer's backward
// (input and parameter gradients) against central finite differences in f64 (h = 1e-5,
// tolerance 1e-6 relative), the flat buffers and grad-ready hooks, sharded init, clipping.
#include <cmath>
#include <map>

#include "support/catch.hpp"
#include "support/nn_adamw.hpp"
#include "support/nn_layers.hpp"
#include "unit/nn_gradcheck.hpp"

using namespace quintet;
using namespace quintet::nn;
using nn_test::dot;
using nn_test::numeric_grad;
using nn_test::randn64;
using nn_test::require_close;

namespace {
const Stream kCpu;
constexpr double kFdTol = 1e-6;

// Checks dx and every parameter gradient of module at input x (f64) against finite differences
// of loss = <module(x), r>, and that backward marks every parameter ready exactly once.
void check_layer(Module& module, const Tensor& x, std::uint64_t seed, bool input_grad = true) {
  ParameterStore store(module, DType::f64, kCpu, seed);
  std::map<std::string, int> ready;
  store.add_grad_ready_hook([&](Parameter& p) { ++ready[p.name()]; });
  Context ctx(kCpu);
  const Tensor y = module.forward(ctx, x);
  const Tensor r = randn64(y.shape(), seed + 1);
  const Tensor dx = module.backward(ctx, r);
  REQUIRE(ctx.pending() == 0);
  for (const Parameter* p : store.parameters()) {
    INFO(p->name());
    REQUIRE(ready[p->name()] == 1);
  }
  auto loss = [&] {
    Context c(kCpu);
    return dot(module.forward(c, x), r);
  };
  if (input_grad) require_close(dx, numeric_grad(loss, x), kFdTol, "dx");
  for (const Parameter* p : store.parameters()) {
    require_close(p->grad(), numeric_grad(loss, p->data()), kFdTol, p->name().c_str());
  }
}

// A module with one parameter, to test stores and init.
class OneParameter : public Module {
 public:
  OneParameter(const Shape& shape, ParameterAttributes attrs) {
    p_ = &add_parameter("w", shape, ParameterInit::normal(1.0f), std::move(attrs));
  }
  Tensor forward(Context&, const Tensor& x) override { return x; }
  Tensor backward(Context&, const Tensor& dy) override { return dy; }
  Parameter& p() { return *p_; }

 private:
  Parameter* p_;
};
}  // namespace

TEST_CASE("layer backward against finite differences", "[nn][layers]") {
  SECTION("Linear") {
    Linear m(5, 3);
    check_layer(m, randn64({2, 4, 5}, 1), 100);
  }
  SECTION("Linear without bias") {
    Linear m(4, 6, {.bias = false});
    check_layer(m, randn64({3, 4}, 2), 101);
  }
  SECTION("LayerNorm") {
    LayerNorm m(6);
    check_layer(m, randn64({2, 3, 6}, 3), 102);
  }
  SECTION("RMSNorm") {
    RMSNorm m(6);
    check_layer(m, randn64({2, 3, 6}, 4), 103);
  }
  SECTION("MLP gelu") {
    MLP m(4, 7, Activation::gelu, 0.5f, 0.5f);
    check_layer(m, randn64({2, 3, 4}, 5), 104);
  }
  SECTION("MLP swiglu") {
    MLP m(4, 6, Activation::swiglu, 0.5f, 0.5f);
    check_layer(m, randn64({2, 3, 4}, 6), 105);
  }
  SECTION("CausalSelfAttention") {
    CausalSelfAttention m(6, 2, 8, {.init_std = 0.5f, .proj_init_std = 0.5f});
    check_layer(m, randn64({2, 5, 6}, 7), 106);
  }
  SECTION("TransformerBlock layernorm gelu") {
    TransformerBlockConfig c;
    c.dim = 6;
    c.heads = 3;
    c.hidden = 10;
    c.max_seq_len = 8;
    c.init_std = c.proj_init_std = 0.4f;
    TransformerBlock m(c);
    check_layer(m, randn64({1, 4, 6}, 8), 107);
  }
  SECTION("TransformerBlock rmsnorm swiglu") {
    TransformerBlockConfig c;
    c.dim = 4;
    c.heads = 2;
    c.hidden = 6;
    c.max_seq_len = 4;
    c.norm = NormKind::rmsnorm;
    c.activation = Activation::swiglu;
    c.bias = false;
    c.init_std = c.proj_init_std = 0.4f;
    TransformerBlock m(c);
    check_layer(m, randn64({2, 3, 4}, 9), 108);
  }
}

TEST_CASE("Embedding gathers rows and scatter-adds gradients", "[nn][layers]") {
  Embedding m(7, 3, 1.0f, 4);
  ParameterStore store(m, DType::f64, kCpu, 5);
  const Tensor ids = Tensor::from_vector<std::int32_t>({1, 6, 1, 0, 3, 3}, {2, 3});
  Context ctx(kCpu);
  const Tensor y = m.forward(ctx, ids);
  REQUIRE(y.at<double>({1, 2, 0}) == m.weight().data().at<double>({3, 0}));
  const Tensor r = randn64(y.shape(), 6);
  REQUIRE_FALSE(m.backward(ctx, r).defined());
  auto loss = [&] {
    Context c(kCpu);
    return dot(m.forward(c, ids), r);
  };
  require_close(m.weight().grad(), numeric_grad(loss, m.weight().data()), kFdTol, "dweight");
  REQUIRE_THROWS_QUINTET(m.forward(ctx, Tensor::zeros({1, 5}, DType::i64)), InvalidArgument,
                         "longer than the 4 positions");
}

TEST_CASE("ParameterStore lays parameters out in backward order in flat buffers",
          "[nn][parameters]") {
  TransformerBlockConfig c;
  c.dim = 8;
  c.heads = 2;
  c.hidden = 12;
  TransformerBlock block(c);
  ParameterStore store(block, DType::f32, kCpu, 42);
  const auto forward_order = block.named_parameters();
  const auto& params = store.parameters();
  REQUIRE(params.size() == forward_order.size());
  REQUIRE(params.front()->name() == "mlp.proj.bias");  // last registered comes first
  REQUIRE(params.back()->name() == "norm1.weight");
  std::int64_t end = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = *params[i];
    REQUIRE(p.name() == forward_order[forward_order.size() - 1 - i].first);
    REQUIRE(p.offset() >= end);
    REQUIRE(p.offset() % ParameterStore::kAlignElements == 0);
    REQUIRE(p.data().shares_storage(store.data_buffer()));
    REQUIRE(p.grad().shares_storage(store.grad_buffer()));
    REQUIRE(p.grad().dtype() == DType::f32);
    end = p.offset() + p.numel();
  }
  REQUIRE(end <= store.data_buffer().numel());
  REQUIRE(store.find("norm2.weight").data().item({3}) == 1.0);  // ones init
  REQUIRE(store.find("attn.qkv.bias").data().item({0}) == 0.0);
  // Same seed, same values; the init of one parameter does not depend on the others.
  TransformerBlock other(c);
  ParameterStore store2(other, DType::f32, kCpu, 42);
  require_close(store2.find("mlp.fc.weight").data(), store.find("mlp.fc.weight").data(), 0.0,
                "same seed");
  store.find("mlp.fc.weight").grad().fill_(3.0);
  store.zero_grad(kCpu);
  REQUIRE(global_norm({store.grad_buffer()}, kCpu) == 0.0);
  REQUIRE_THROWS_QUINTET(store.find("nope"), InvalidArgument, "no parameter named 'nope'");
  REQUIRE_THROWS_QUINTET(ParameterStore(block, DType::f32, kCpu, 1), InvalidArgument,
                         "already belongs to a store");
}

TEST_CASE("a shard's init is its slice of the unsharded init", "[nn][parameters]") {
  OneParameter full({6, 10}, {});
  ParameterStore fs(full, DType::f32, kCpu, 7);
  ParameterAttributes shard;
  shard.shard_dim = 1;
  shard.shard_axis = Axis::tp;
  shard.full_shape = {6, 10};
  shard.shard_start = {0, 5};
  OneParameter part({6, 5}, shard);
  ParameterStore ps(part, DType::f32, kCpu, 7);
  require_close(part.p().data(), full.p().data().narrow(1, 5, 5), 0.0, "column shard");
  REQUIRE(part.p().attributes().shard_axis == Axis::tp);
}

TEST_CASE("AdamW clips by the global norm and skips decay where asked", "[nn][optimizer]") {
  Linear m(3, 2);  // weight decays, bias does not
  ParameterStore store(m, DType::f32, kCpu, 3);
  const std::vector<double> w0 = m.weight().data().to_vector<double>();
  const std::vector<double> b0 = m.bias()->data().to_vector<double>();
  const std::vector<float> gw = {0.3f, -0.4f, 1.2f, 0.0f, 0.5f, -2.0f}, gb = {1.0f, -0.5f};
  m.weight().grad().copy_(Tensor::from_vector(gw, {2, 3}));
  m.bias()->grad().copy_(Tensor::from_vector(gb, {2}));
  AdamWConfig cfg;
  cfg.hyper.lr = 0.1f;
  cfg.hyper.weight_decay = 0.5f;
  cfg.max_grad_norm = 1.0f;
  AdamW opt(store, cfg, kCpu);
  const OptimizerStepInfo info = opt.step(kCpu);
  double sq = 0;
  for (float g : gw) sq += g * g;
  for (float g : gb) sq += g * g;
  REQUIRE(info.grad_norm() == Approx(std::sqrt(sq)).epsilon(1e-6));
  REQUIRE(info.grad_scale() == Approx(1.0 / std::sqrt(sq)).epsilon(1e-5));
  REQUIRE(info.step == 1);
  // Step 1 of AdamW: m̂ = g', v̂ = g'², so p -= lr * g' / (|g'| + eps) after the decay.
  auto expect = [&](double p, double g, bool decay) {
    const double gs = g * info.grad_scale();
    if (decay) p -= 0.1 * 0.5 * p;
    return p - 0.1 * gs / (std::abs(gs) + 1e-8);
  };
  const auto w1 = m.weight().data().to_vector<double>(), b1 = m.bias()->data().to_vector<double>();
  for (int i = 0; i < 6; ++i) REQUIRE(w1[i] == Approx(expect(w0[i], gw[i], true)).margin(1e-6));
  for (int i = 0; i < 2; ++i) REQUIRE(b1[i] == Approx(expect(b0[i], gb[i], false)).margin(1e-6));
}

namespace {
// One parameter with the given attributes (a stand-in for a sharded or partial layer weight).
class OneWeight : public Module {
 public:
  explicit OneWeight(ParameterAttributes a) {
    w_ = &add_parameter("w", {2, 3}, ParameterInit::normal(1.0f), std::move(a));
  }
  Tensor forward(Context&, const Tensor& x) override { return x; }
  Tensor backward(Context&, const Tensor& dy) override { return dy; }
  Parameter& w() { return *w_; }

 private:
  Parameter* w_;
};
}  // namespace

TEST_CASE("AdamW refuses to clip by one rank's norm of a weight spread over ranks",
          "[nn][optimizer]") {
  ParameterAttributes shard;  // rows 2..3 of a [4, 3] weight
  shard.shard_dim = 0;
  shard.shard_axis = Axis::tp;
  shard.full_shape = {4, 3};
  shard.shard_start = {2, 0};
  ParameterAttributes partial;
  partial.reduce_over_tp = true;
  ParameterAttributes expert;
  expert.is_expert = true;
  ParameterAttributes whole_shard = shard;  // "sharded" over a tp of 1: the whole weight
  whole_shard.full_shape = {2, 3};
  whole_shard.shard_start = {0, 0};
  const std::vector<std::pair<ParameterAttributes, std::string>> cases = {
      {shard, "is a shard of a [4, 3] weight"},
      {partial, "is a partial sum over tensor-parallel ranks"},
      {expert, "is an expert's weight"}};
  for (const auto& [attrs, why] : cases) {
    INFO(why);
    OneWeight m(attrs);
    ParameterStore store(m, DType::f32, kCpu, 1);
    AdamWConfig clip;  // max_grad_norm 1: clipping
    REQUIRE_THROWS_QUINTET(AdamW(store, clip, kCpu), InvalidArgument,
                           "parameter w " + why + ", so its gradient norm is spread");
    REQUIRE_THROWS_QUINTET(AdamW(store, clip, kCpu), InvalidArgument,
                           "Use quintet::data_parallel::DistributedOptimizer");
    // Without clipping each update is elementwise: it runs, and reports no norm.
    AdamWConfig no_clip;
    no_clip.max_grad_norm = 0.0f;
    AdamW opt(store, no_clip, kCpu);
    m.w().grad().fill_(0.5);
    CHECK(std::isnan(opt.step(kCpu).grad_norm()));
  }
  OneWeight whole(whole_shard);
  ParameterStore store(whole, DType::f32, kCpu, 1);
  AdamW opt(store, AdamWConfig{}, kCpu);  // a tp of 1 holds the whole weight: fine
  whole.w().grad().fill_(0.5);
  CHECK(opt.step(kCpu).grad_norm() == Approx(std::sqrt(6 * 0.25)));
}

TEST_CASE("layers and contexts reject bad use with a quintet::Error", "[nn][layers]") {
  CausalSelfAttention attn(8, 2, 4);
  Context ctx(kCpu);
  REQUIRE_THROWS_QUINTET(attn.forward(ctx, Tensor::randn({1, 3, 8}, 1)), InvalidArgument,
                         "has no memory yet");
  ParameterStore store(attn, DType::f32, kCpu, 1);
  REQUIRE_THROWS_QUINTET(attn.forward(ctx, Tensor::randn({1, 5, 8}, 1)), InvalidArgument,
                         "longer than the causal mask allows (max_seq_len = 4)");
  REQUIRE_THROWS_QUINTET(attn.forward(ctx, Tensor::randn({1, 3, 6}, 1)), InvalidArgument,
                         "expected [batch, seq, 8]");
  REQUIRE_THROWS_QUINTET(attn.forward(ctx, Tensor::randn({1, 3, 8}, 1, DType::f64)),
                         InvalidArgument, "the other inputs are f64");
  REQUIRE_THROWS_QUINTET(attn.backward(ctx, Tensor::randn({1, 3, 8}, 1)), InvalidArgument,
                         "nothing saved for this module");
  REQUIRE(ctx.pending() == 0);
  REQUIRE_THROWS_QUINTET(CausalSelfAttention(10, 3, 4), InvalidArgument, "multiple of heads");
  Linear lin(2, 2);
  REQUIRE_THROWS_QUINTET(ParameterStore(lin, DType::bf16, kCpu, 1), InvalidArgument,
                         "f32 (or f64)");
}

TEST_CASE("a context keeps typed handles on the module's stack of saves", "[nn][layers]") {
  struct Handle {
    Tensor a;
    std::int64_t n = 0;
  };
  Linear lin(2, 2);
  Context ctx(kCpu);
  const Tensor t = Tensor::randn({2}, 1);
  ctx.save(lin, {t});
  ctx.save_handle(lin, Handle{t, 7});
  REQUIRE(ctx.pending() == 2);
  const Handle h = ctx.take_handle<Handle>(lin);  // last in, first out
  CHECK(h.n == 7);
  CHECK(h.a.data<float>() == t.data<float>());
  // The tensors saved first, taken back as a handle of another type: refused, and gone.
  REQUIRE_THROWS_QUINTET(ctx.take_handle<Handle>(lin), InvalidArgument, "its backward takes a");
  REQUIRE(ctx.pending() == 0);
  ctx.save_handle(lin, Handle{t, 1});
  REQUIRE_THROWS_QUINTET(ctx.take(lin), InvalidArgument, "its backward takes a");
}
