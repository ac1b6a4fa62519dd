// The whole MoE layer (quintet/parallel/expert/moe_layer.hpp) on one rank against an independent
// reference (support/moe_reference.hpp: a per-token loop in f64 that shares no code with the
// layer): the output, the step statistics (load, drops, aux and z losses), and the input gradient
// and every parameter gradient (router, experts' fc / up / proj, the shared MLP's weights and
// biases) against central finite differences of the reference's loss
//   J = <dy, y> + loss_scale * (aux loss + z loss),
// which is what the layer's backward differentiates. Softmax and sigmoid scores, GELU and SwiGLU
// experts, top-1 to top-3, with and without renormalisation, dropless and with the capacity
// dropping, with a balancing bias that changes the selection, and with dy = 0 (the router's
// gradient from the losses alone); the layer at f64 and at f32. A forward-only evaluation before
// the step gives the same output and counts nothing in the step's statistics.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "quintet/collectives/mpi.hpp"
#include "quintet/nn/context.hpp"
#include "support/moe_reference_check.hpp"

using namespace quintet;
using namespace quintet::expert;
using moe_ref::draw;
using moe_ref::options_of;
using moe_ref::require_close;

namespace {

const Stream kCpu;
constexpr std::int64_t kB = 2, kS = 6, kD = 6, kF = 4, kExperts = 5;

struct Case {
  std::string name;
  moe_ref::Config config;
  std::vector<double> bias;  // the balancing bias (empty: none)
  bool zero_dy = false;      // the loss is the aux and z losses alone
};

moe_ref::Config base(bool sigmoid, bool swiglu, std::int64_t k) {
  moe_ref::Config c;
  c.experts = kExperts;
  c.top_k = k;
  c.dim = kD;
  c.ffn = kF;
  c.sigmoid = sigmoid;
  c.swiglu = swiglu;
  // Large enough that a wrong aux or z gradient shows beside the output's.
  c.aux_coeff = 0.3;
  c.z_coeff = 0.05;
  return c;
}

void run_case(const Case& c, DType dtype, double tol) {
  INFO("case " << c.name << " at " << dtype_name(dtype));
  const moe_ref::Config& rc = c.config;
  const auto self = make_self_communicator(Device::cpu(), "tp");
  MoEOptions options = options_of(rc);
  // The layer routes with its bias only when it balances by it (the update comes at finish_step).
  if (!c.bias.empty()) options.router.bias_rate = 1e-3f;
  MoELayer layer({self.get(), nullptr, nullptr, nullptr}, kD, options);
  nn::ParameterStore store(layer, dtype, kCpu, 5);
  if (!c.bias.empty()) layer.set_balance_bias(std::vector<float>(c.bias.begin(), c.bias.end()));

  // Every parameter a fresh draw (biases included, which start at zero), shared with the reference.
  moe_ref::Params p;
  p.bias = c.bias;
  const std::map<std::string, std::vector<double>*> slots = {
      {"router.weight", &p.router},          {"experts.fc.weight", &p.fc},
      {"experts.up.weight", &p.up},          {"experts.proj.weight", &p.proj},
      {"shared.fc.weight", &p.shared_fc},    {"shared.fc.bias", &p.shared_fc_b},
      {"shared.up.weight", &p.shared_up},    {"shared.proj.weight", &p.shared_proj},
      {"shared.proj.bias", &p.shared_proj_b}};
  std::uint64_t seed = 1000;
  std::vector<std::pair<nn::Parameter*, std::vector<double>*>> params;
  for (const auto& [name, param] : layer.named_parameters()) {
    INFO("parameter " << name);
    REQUIRE(slots.count(name) == 1);
    param->data().copy_(draw(param->shape(), seed++, dtype, 0.5));
    *slots.at(name) = param->data().to_vector<double>();
    params.emplace_back(param, slots.at(name));
  }
  const Tensor x = draw({kB, kS, kD}, seed++, dtype, 1.0);
  const Tensor dy = c.zero_dy ? nn::cast(Tensor::zeros({kB, kS, kD}, DType::f64), dtype, kCpu)
                              : draw({kB, kS, kD}, seed++, dtype, 1.0);
  constexpr float kLossScale = 0.5f;

  // An evaluation first (a forward-only context): the same output, nothing saved and nothing
  // counted, so the step's statistics below are the training forward's alone.
  nn::Context eval(kCpu);
  eval.set_forward_only(true);
  const Tensor y_eval = layer.forward(eval, x);
  CHECK(eval.pending() == 0);

  nn::Context ctx(kCpu);
  ctx.set_loss_scale(kLossScale);
  const Tensor y = layer.forward(ctx, x);
  const Tensor dx = layer.backward(ctx, dy);
  const MoEStats stats = layer.finish_step(*self);

  std::vector<double> xv = x.to_vector<double>();
  const std::vector<double> dyv = dy.to_vector<double>();
  const moe_ref::Result want = moe_ref::forward(rc, p, xv, kB);
  require_close(y, want.y, tol, "output");
  require_close(y_eval, want.y, tol, "output of the evaluation");
  if (rc.capacity_factor > 0.0) {
    REQUIRE(want.dropped > 0);  // the case exercises the capacity
  } else {
    REQUIRE(want.dropped == 0);
  }
  CHECK(stats.load == std::vector<double>(want.load.begin(), want.load.end()));
  CHECK(stats.assignments == static_cast<double>(kB * kS * rc.top_k));
  CHECK(stats.dropped == static_cast<double>(want.dropped));
  CHECK(stats.aux_loss == Approx(want.aux).epsilon(tol));
  CHECK(stats.z_loss == Approx(want.z).epsilon(tol));

  const moe_ref::Loss loss{rc, p, xv, dyv, kB, kLossScale};
  require_close(dx, loss.grad(xv), tol, "input gradient");
  for (auto& [param, values] : params) {
    require_close(param->grad(), loss.grad(*values), tol, "gradient of " + param->name());
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"softmax, GELU, top-2, dropless", base(false, false, 2), {}});
  {
    moe_ref::Config c = base(true, true, 2);
    c.shared_width = kF;
    out.push_back({"sigmoid, SwiGLU, top-2, shared expert, dropless", c, {}});
  }
  {
    moe_ref::Config c = base(false, false, 1);
    c.renormalize = false;
    c.capacity_factor = 0.5;
    c.shared_width = 2 * kF;
    out.push_back({"softmax, GELU, top-1 unnormalised, shared experts, capacity 0.5", c, {}});
  }
  {
    moe_ref::Config c = base(true, false, 3);
    c.capacity_factor = 1.0;
    // Favours experts 0 and 3 in the selection (not in the weights): the capacity drops some.
    out.push_back(
        {"sigmoid, GELU, top-3, balancing bias, capacity 1.0", c, {0.3, 0.0, 0.0, 0.25, 0.0}});
  }
  {
    moe_ref::Config c = base(false, true, 2);
    c.renormalize = false;
    c.capacity_factor = 0.75;
    out.push_back({"softmax, SwiGLU, top-2 unnormalised, capacity 0.75", c, {}});
  }
  {
    moe_ref::Config c = base(false, true, 2);
    c.capacity_factor = 0.6;
    out.push_back({"softmax, SwiGLU, capacity 0.6, dy = 0 (aux and z losses alone)", c, {}, true});
  }
  return out;
}

}  // namespace

TEST_CASE("ep: the MoE layer equals a per-token reference and its finite differences (f64)",
          "[ep]") {
  for (const Case& c : cases()) run_case(c, DType::f64, 1e-5);
}

TEST_CASE("ep: the MoE layer equals a per-token reference and its finite differences (f32)",
          "[ep]") {
  for (const Case& c : cases()) run_case(c, DType::f32, 1e-4);
}
