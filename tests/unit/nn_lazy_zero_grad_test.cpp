// Lazy zeroing of the gradients (quintet/nn/parameter.hpp): ParameterStore::zero_grad marks the
// gradients stale instead of filling them, and a linear layer's weight-gradient GEMM overwrites a
// stale gradient instead of adding to zeros. A few training steps of the library model on the
// CPU (nn::AdamW) give bit for bit the gradients and values of the same steps with lazy zeroing
// off (ParameterStore::set_lazy_zero_grad(false): zero_grad fills the buffer): a dense model with
// tied embeddings, gradient accumulation over 3 microbatches (with a split I / deferred W
// backward and full recompute), an MoE model where an expert receives no token in a step after
// one where it did (its experts' gradients overwritten too; SwiGLU and GELU, FP8, microbatches),
// and FP8 (the CPU emulation). And a gradient nothing wrote reads exactly zero through every
// accessor, while one the GEMM overwrote never went through a fill; the linear and grouped
// weight-gradient ops without accumulation overwrite dw (an empty group's with zeros).
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "quintet/collectives/mpi.hpp"
#include "quintet/nn/context.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/nn/grouped_linear.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/model/gpt.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"
#include "support/catch.hpp"
#include "support/gpt_small.hpp"
#include "support/nn_adamw.hpp"

using namespace quintet;

namespace {

const Stream kCpu;

using gpt_small::Batch;
using gpt_small::make_batch;

// Two blocks of gpt_small's model.
model::GptConfig small_config() {
  model::GptConfig c = gpt_small::config();
  c.layers = 2;
  return c;
}

// The bits of a tensor's f32 values.
std::vector<std::uint32_t> bits(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector<float>();
  std::vector<std::uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

struct Run {
  std::vector<std::vector<std::uint32_t>> grads;   // per step, the whole gradient buffer
  std::vector<std::vector<std::uint32_t>> values;  // per step, after the update
  std::vector<std::vector<std::uint32_t>> fc;      // per step, block0's experts' fc gradient
};

struct Options {
  int steps = 3;
  int micro = 1;
  bool split = false;  // backward as I, then the deferred W (zero-bubble pipelines)
};

Run train(const model::GptConfig& c, const Options& o, bool lazy) {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  auto chunk = model::build_gpt_chunk(c, model::ModelGroups{.tp = solo.get(), .stage = solo.get()},
                                      model::ChunkSpec::whole(c));
  nn::ParameterStore store(*chunk, DType::f32, kCpu, 21);
  store.set_lazy_zero_grad(lazy);
  nn::AdamWConfig ac;
  ac.hyper.lr = 0.05f;
  ac.max_grad_norm = 0.0f;  // experts' norms are not one store's to clip by
  nn::AdamW opt(store, ac, kCpu);
  Run r;
  for (int step = 0; step < o.steps; ++step) {
    store.zero_grad(kCpu);
    if (lazy) {
      for (const nn::Parameter* p : store.parameters()) REQUIRE(p->grad_stale());
    }
    for (int m = 0; m < o.micro; ++m) {
      const Batch b = make_batch(c, static_cast<std::uint64_t>(step * o.micro + m));
      nn::Context ctx(kCpu);
      ctx.set_targets(b.targets, 1.0f / static_cast<float>(o.micro));
      chunk->forward(ctx, b.ids);
      ctx.set_defer_weight_gradients(o.split);
      chunk->backward(ctx, Tensor());
      ctx.set_defer_weight_gradients(false);
      ctx.run_deferred_gradients();
    }
    if (c.mlp == model::MlpKind::moe) {
      r.fc.push_back(bits(store.find("block0.mlp.experts.fc.weight").grad()));
    }
    r.grads.push_back(bits(store.grad_buffer()));
    opt.step(kCpu);
    r.values.push_back(bits(store.data_buffer()));
  }
  return r;
}

void require_same(const model::GptConfig& c, const Options& o) {
  const Run lazy = train(c, o, true);
  const Run eager = train(c, o, false);
  REQUIRE(lazy.grads.size() == static_cast<std::size_t>(o.steps));
  for (int s = 0; s < o.steps; ++s) {
    INFO("step " << s);
    CHECK(lazy.grads[s] == eager.grads[s]);
    CHECK(lazy.values[s] == eager.values[s]);
  }
  CHECK(lazy.fc == eager.fc);
}

// A module of two linear layers, for the accessors.
class TwoLinears : public nn::Module {
 public:
  explicit TwoLinears(Communicator& tp)
      : a(add_module("a", std::make_unique<tensor_parallel::ColumnParallelLinear>(
                              tp, 4, 6, tensor_parallel::ColumnParallelOptions{}))),
        b(add_module("b", std::make_unique<tensor_parallel::RowParallelLinear>(
                              tp, 6, 4, tensor_parallel::RowParallelOptions{}))) {}
  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    return b.forward(ctx, a.forward(ctx, x));
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    return a.backward(ctx, b.backward(ctx, dy));
  }
  tensor_parallel::ColumnParallelLinear& a;
  tensor_parallel::RowParallelLinear& b;
};

}  // namespace

TEST_CASE("lazy zero_grad: a dense model with tied embeddings, bit for bit", "[nn][lazy_zero]") {
  model::GptConfig c = small_config();
  c.tied_embeddings = true;
  c.activation = GENERATE(nn::Activation::gelu, nn::Activation::swiglu);
  require_same(c, Options{});
}

TEST_CASE("lazy zero_grad: 3 microbatches, split backward, recompute, bit for bit",
          "[nn][lazy_zero]") {
  model::GptConfig c = small_config();
  c.recompute = GENERATE(model::RecomputeKind::none, model::RecomputeKind::full);
  const bool split = GENERATE(false, true);
  INFO("split " << split);
  require_same(c, Options{.steps = 2, .micro = 3, .split = split});
}

// The experts' weight gradients are overwritten when stale (Experts::backward's grouped
// weight-gradient ops with accumulate = false, the FP8 ones with FP8): SwiGLU (fc, up, proj) and
// GELU (no up), in FP8 too, one microbatch and two (the second adds to what the first wrote). On
// the CPU the grouped ops have one implementation, a per-expert loop of the CPU linear kernels,
// whatever QUINTET_GROUPED_GEMM says (that picks among the GPU paths only).
TEST_CASE("lazy zero_grad: an MoE expert that gets no token, bit for bit", "[nn][lazy_zero]") {
  model::GptConfig c = small_config();
  c.activation = GENERATE(nn::Activation::swiglu, nn::Activation::gelu);
  c.mlp = model::MlpKind::moe;
  c.moe.router.experts = 8;
  c.moe.router.top_k = 1;
  c.moe.expert_ffn = 8;
  const bool fp8 = GENERATE(false, true);
  if (fp8) c.fp8.mode = nn::Fp8Mode::hybrid;
  const int micro = GENERATE(1, 2);
  INFO("fp8 " << fp8 << ", " << micro << " microbatches");
  c.validate(1);
  c.validate_experts(1, 1);
  const Options o{.steps = 4, .micro = micro};
  require_same(c, o);
  // An expert's gradient slice that was written in a step and is exactly zero in the next: one
  // that received no token there (its stale values must not survive).
  const Run r = train(c, o, true);
  const std::size_t per_expert = r.fc[0].size() / 8;
  bool found = false;
  for (int s = 1; s < o.steps; ++s) {
    for (std::size_t e = 0; e < 8; ++e) {
      bool zero_now = true, nonzero_before = false;
      for (std::size_t i = e * per_expert; i < (e + 1) * per_expert; ++i) {
        zero_now = zero_now && r.fc[s][i] == 0u;
        nonzero_before = nonzero_before || r.fc[s - 1][i] != 0u;
      }
      found = found || (zero_now && nonzero_before);
    }
  }
  CHECK(found);
}

TEST_CASE("lazy zero_grad: FP8 (the CPU emulation), bit for bit", "[nn][lazy_zero][fp8]") {
  model::GptConfig c = small_config();
  c.fp8.mode = nn::Fp8Mode::hybrid;
  c.fp8_lm_head = GENERATE(false, true);
  require_same(c, Options{.steps = 2, .micro = 2});
}

TEST_CASE("lazy zero_grad: a gradient nothing wrote reads zero, an overwritten one is exact",
          "[nn][lazy_zero]") {
  auto solo = make_self_communicator(Device::cpu(), "tp");
  TwoLinears m(*solo);
  nn::ParameterStore store(m, DType::f32, kCpu, 3);
  const Tensor x = Tensor::randn({5, 4}, 1);
  const Tensor dy = Tensor::randn({5, 4}, 2);
  const auto all_bits = [&] {
    std::vector<std::vector<std::uint32_t>> out;
    for (const nn::Parameter* p : store.parameters()) out.push_back(bits(p->grad()));
    return out;
  };
  const auto zeros = [](const nn::Parameter& p) {
    return std::vector<std::uint32_t>(static_cast<std::size_t>(p.numel()), 0u);
  };
  {
    nn::Context ctx(kCpu);
    m.forward(ctx, x);
    m.backward(ctx, dy);
  }
  const auto want = all_bits();  // a fresh store: accumulated into the constructor's zeros
  nn::Parameter& aw = store.find("a.weight");
  nn::Parameter& bw = store.find("b.weight");
  REQUIRE(bits(aw.grad()) != zeros(aw));

  // Nothing runs backward: every accessor reads zeros, a range zeroes only what it covers.
  store.zero_grad(kCpu);
  REQUIRE(aw.grad_stale());
  CHECK(bits(store.grad_range(bw.offset(), bw.numel(), kCpu)) == zeros(bw));
  CHECK(!bw.grad_stale());
  CHECK(aw.grad_stale());
  CHECK(bits(aw.grad()) == zeros(aw));
  CHECK(!aw.grad_stale());
  store.zero_grad(kCpu);
  CHECK(bits(store.grad_buffer()) ==
        std::vector<std::uint32_t>(static_cast<std::size_t>(store.total_elements()), 0u));
  for (const nn::Parameter* p : store.parameters()) CHECK(!p->grad_stale());
  REQUIRE_THROWS_QUINTET(store.grad_range(0, store.total_elements() + 1, kCpu), InvalidArgument,
                         "ParameterStore::grad_range");

  // Garbage in stale gradients (what a lazy zero_grad leaves), then only b's backward: b's
  // weight overwritten by its GEMM, its bias zeroed and accumulated, a's gradients zero.
  Tensor(store.grad_buffer()).fill_(1.0e30, kCpu);
  store.zero_grad(kCpu);
  {
    nn::Context ctx(kCpu);
    m.forward(ctx, x);
    m.b.backward(ctx, dy);
    ctx.take(m.a);
  }
  CHECK(!bw.grad_stale());
  CHECK(aw.grad_stale());
  const auto got = all_bits();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const nn::Parameter& p = *store.parameters()[i];
    INFO(p.name());
    CHECK(got[i] == (p.name()[0] == 'b' ? want[i] : zeros(p)));
  }

  // grad_for_write hands a stale gradient over unfilled (its writer overwrites it), once.
  Tensor(store.grad_buffer()).fill_(1.0e30, kCpu);
  store.zero_grad(kCpu);
  const nn::Parameter::GradForWrite first = bw.grad_for_write(kCpu);
  CHECK(first.overwrite);
  CHECK(bits(first.grad) == bits(Tensor::full({4, 6}, 1.0e30)));
  CHECK(!bw.grad_stale());
  CHECK(!bw.grad_for_write(kCpu).overwrite);

  // The same garbage, then the whole backward: the first step's gradients, bit for bit.
  Tensor(store.grad_buffer()).fill_(1.0e30, kCpu);
  store.zero_grad(kCpu);
  {
    nn::Context ctx(kCpu);
    m.forward(ctx, x);
    m.backward(ctx, dy);
  }
  CHECK(all_bits() == want);
}

TEST_CASE("linear_backward_weight without accumulation overwrites dw", "[nn][lazy_zero]") {
  for (const std::int64_t rows : {0, 3, 40}) {
    INFO(rows << " rows");
    const Tensor dy = Tensor::randn({rows, 5}, 4), x = Tensor::randn({rows, 7}, 5);
    Tensor want = Tensor::zeros({5, 7}), want_db = Tensor::full({5}, 0.5);
    nn::linear_backward_weight(dy, x, want, want_db, kCpu);
    Tensor dw = Tensor::full({5, 7}, 1.0e30), db = Tensor::full({5}, 0.5);
    nn::linear_backward_weight(dy, x, dw, db, false, kCpu);
    CHECK(bits(dw) == bits(want));
    CHECK(bits(db) == bits(want_db));  // the bias gradient still accumulates
  }
}

TEST_CASE("the grouped weight-gradient ops without accumulation overwrite dw, empty groups zero",
          "[nn][lazy_zero]") {
  // 3 groups: 4 rows, none, 3 rows, then 2 padding rows (zero, as the token permutation's).
  const std::vector<std::int64_t> offsets = {0, 4, 4, 7};
  const Tensor o = Tensor::from_vector(offsets, {4});
  Tensor dy = Tensor::randn({9, 5}, 6), x = Tensor::randn({9, 7}, 7);
  dy.narrow(0, 7, 2).zero_();
  x.narrow(0, 7, 2).zero_();
  // FP8: whole-tensor casts at one scale each (the experts' operands), their transposes.
  const auto cast = [](const Tensor& t, nn::Fp8Format f) {
    const float scale = nn::fp8_scale_from_amax(nn::fp8_amax(t, kCpu), f, 0, 1.0f, "t");
    const nn::Fp8Tensor q =
        nn::fp8_cast(t, nn::fp8_scale_tensor(scale, Device::cpu(), kCpu), f, true, Tensor(), kCpu);
    return nn::Fp8Tensor{Tensor(), q.transposed, q.scale, q.format};
  };
  const nn::Fp8Tensor qdy = cast(dy, nn::Fp8Format::e5m2), qx = cast(x, nn::Fp8Format::e4m3);
  for (const bool fp8 : {false, true}) {
    for (const bool host : {false, true}) {
      INFO("fp8 " << fp8 << ", host offsets " << host);
      const std::span<const std::int64_t> ho =
          host ? std::span<const std::int64_t>(offsets) : std::span<const std::int64_t>();
      const auto wgrad = [&](const Tensor& dw, bool accumulate) {
        if (fp8) {
          nn::grouped_fp8_linear_backward_weight(qdy, qx, o, dw, ho, accumulate, kCpu);
        } else {
          nn::grouped_linear_backward_weight(dy, x, o, dw, ho, accumulate, kCpu);
        }
      };
      const Tensor want = Tensor::zeros({3, 5, 7});
      wgrad(want, true);
      const Tensor dw = Tensor::full({3, 5, 7}, 1.0e30);
      wgrad(dw, false);
      CHECK(bits(dw) == bits(want));
      CHECK(bits(dw.select(1)) == bits(Tensor::zeros({5, 7})));
      // accumulate = true still adds, and is what the form without the flag does.
      wgrad(dw, true);
      if (fp8) {
        nn::grouped_fp8_linear_backward_weight(qdy, qx, o, want, ho, kCpu);
      } else {
        nn::grouped_linear_backward_weight(dy, x, o, want, ho, kCpu);
      }
      CHECK(bits(dw) == bits(want));
    }
  }
}
