// The MoE traps a new user walks into, on one rank (quintet/parallel/expert/moe_layer.hpp): the
// default router balances (an aux loss is computed and reported), and an expert that receives no
// token for RouterConfig::idle_warning_steps consecutive steps is warned about, once per layer
// (read from stderr), in a run whose routing is forced onto two of four experts, and not in a
// balanced run nor with the warning turned off.
#include <memory>
#include <string>
#include <vector>

#include "quintet/collectives/mpi.hpp"
#include "quintet/nn/context.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "support/catch.hpp"
#include "support/stderr_capture.hpp"

using namespace quintet;
using namespace quintet::expert;

namespace {

const Stream kCpu;
constexpr std::int64_t kD = 8;

struct Run {
  std::vector<std::string> warnings;  // what each step's finish_step wrote to stderr
  std::vector<MoEStats> steps;
};

// `steps` steps of one microbatch [2, 8, kD] each (a fresh draw per step) through a layer of
// `options`; forced: a balancing bias that sends every token to experts 0 and 1.
Run run_steps(const MoEOptions& options, int steps, bool forced) {
  const auto self = make_self_communicator(Device::cpu(), "stage");
  MoELayer layer({self.get(), nullptr, nullptr, nullptr}, kD, options);
  nn::ParameterStore store(layer, DType::f32, kCpu, 3);
  if (forced) {
    std::vector<float> bias(static_cast<std::size_t>(options.router.experts), 0.0f);
    bias[0] = bias[1] = 100.0f;
    layer.set_balance_bias(bias);
  }
  Run run;
  for (int s = 0; s < steps; ++s) {
    nn::Context ctx(kCpu);
    layer.forward(ctx, Tensor::randn({2, 8, kD}, 100 + static_cast<std::uint64_t>(s)));
    layer.backward(ctx, Tensor::randn({2, 8, kD}, 200 + static_cast<std::uint64_t>(s)));
    StderrCapture capture;
    run.steps.push_back(layer.finish_step(*self));
    run.warnings.push_back(capture.take());
  }
  return run;
}

MoEOptions options(std::int64_t idle_warning_steps) {
  MoEOptions o;
  o.router.experts = 4;
  o.router.top_k = 2;
  o.router.idle_warning_steps = idle_warning_steps;
  o.expert_ffn = 8;
  return o;
}

}  // namespace

TEST_CASE("ep: the default router balances with the aux loss", "[ep]") {
  CHECK(RouterConfig{}.aux_loss_coeff == 0.01f);
  MoEOptions o;
  o.expert_ffn = 8;  // every router setting left at its default
  const Run run = run_steps(o, 1, false);
  CHECK(run.steps[0].aux_loss > 0.0);
}

TEST_CASE("ep: an expert idle for idle_warning_steps steps is warned about once", "[ep]") {
  MoEOptions forced = options(3);
  forced.router.bias_rate = 1e-6f;  // routes by the bias; too slow to undo it in 6 steps
  const Run run = run_steps(forced, 6, true);
  for (int s = 0; s < 6; ++s) {
    INFO("step " << s + 1 << " wrote: " << run.warnings[s]);
    CHECK(run.steps[s].load[2] == 0.0);
    CHECK(run.steps[s].load[3] == 0.0);
    if (s == 2) {
      CHECK(run.warnings[s].find("MoE layer: experts 2, 3 received no token in the last 3 steps") !=
            std::string::npos);
      CHECK(run.warnings[s].find("aux_loss_coeff (now 0.01") != std::string::npos);
    } else {
      CHECK(run.warnings[s].empty());  // before the threshold, and only once after it
    }
  }

  forced.router.idle_warning_steps = 0;  // never
  for (const std::string& w : run_steps(forced, 4, true).warnings) CHECK(w.empty());

  const Run balanced = run_steps(options(3), 6, false);
  for (int s = 0; s < 6; ++s) {
    INFO("balanced step " << s + 1 << " wrote: " << balanced.warnings[s]);
    CHECK(balanced.steps[s].min_load() > 0.0);  // every expert got tokens
    CHECK(balanced.warnings[s].empty());
  }
}

TEST_CASE("ep: a bad idle_warning_steps is refused", "[ep]") {
  const auto self = make_self_communicator(Device::cpu(), "tp");
  REQUIRE_THROWS_QUINTET(MoELayer({self.get(), nullptr, nullptr, nullptr}, kD, options(-1)),
                         InvalidArgument, "idle_warning_steps = -1 must be >= 0");
}
