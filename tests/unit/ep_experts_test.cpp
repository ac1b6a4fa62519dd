// The MoE experts (quintet/parallel/expert/experts.hpp) on the CPU: the form taking the row
// offsets on the device only equals the form taking host counts, bit for bit, outputs and every
// gradient (GELU and SwiGLU, empty experts); rows past the last expert are padding (zero output,
// zero gradient, no weight-gradient term); bad offsets rejected.
#include <cstdint>
#include <memory>
#include <vector>

#include "quintet/nn/context.hpp"
#include "quintet/nn/grouped_linear.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/expert/experts.hpp"
#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::expert;

namespace {
const Stream kCpu;

// A module owning one Experts (its parameters need a module and a store).
class ExpertsHolder : public nn::Module {
 public:
  explicit ExpertsHolder(const ExpertsConfig& c) : experts(parameter_adder(), c) {}
  Tensor forward(nn::Context&, const Tensor& x) override { return x; }
  Tensor backward(nn::Context&, const Tensor& dy) override { return dy; }
  Experts experts;
};

std::vector<Tensor> grads_of(const Experts& e) {
  return {e.fc()->grad(), e.up() != nullptr ? e.up()->grad() : Tensor(), e.proj()->grad()};
}

void require_equal(const Tensor& a, const Tensor& b, const char* what) {
  INFO(what);
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.to_vector<double>() == b.to_vector<double>());
}
}  // namespace

TEST_CASE("experts with device offsets equal experts with host counts", "[ep][experts]") {
  for (const nn::Activation act : {nn::Activation::gelu, nn::Activation::swiglu}) {
    DYNAMIC_SECTION((act == nn::Activation::gelu ? "gelu" : "swiglu")) {
      ExpertsConfig c;
      c.experts = 4;
      c.dim = 6;
      c.ffn = 5;
      c.activation = act;
      ExpertsHolder m(c);
      nn::ParameterStore store(m, DType::f32, kCpu, 7);
      Experts& e = m.experts;
      const std::vector<std::int64_t> counts = {3, 0, 4, 2};
      const std::int64_t n = 9, pad = 3;
      const Tensor rows = Tensor::randn({n + pad, c.dim}, 1);
      const Tensor dy = Tensor::randn({n + pad, c.dim}, 2);

      // The counts form over the first n rows.
      ExpertsActivations sa;
      const Tensor y = e.forward(e.data(), rows.narrow(0, 0, n), counts, sa, true, kCpu);
      const Tensor dx = e.backward(e.data(), dy.narrow(0, 0, n), sa, grads_of(e),
                                   std::vector<bool>(3, false), kCpu);
      std::vector<Tensor> g1;
      for (const Tensor& g : grads_of(e)) g1.push_back(g.defined() ? g.clone() : Tensor());
      store.zero_grad(kCpu);

      // The offsets form over all n + pad rows: the padding adds nothing. Its weight gradients
      // overwrite garbage (a stale gradient's first contribution): expert 1, without rows, reads
      // zero.
      const std::vector<std::int64_t> o = nn::group_offsets(counts);
      ExpertsActivations sb;
      const Tensor yb = e.forward(e.data(), rows, Tensor::from_vector(o, {5}), sb, true, kCpu);
      REQUIRE(sb.host_offsets.empty());
      for (const Tensor& g : grads_of(e)) {
        if (g.defined()) Tensor(g).fill_(1.0e30, kCpu);
      }
      const Tensor dxb =
          e.backward(e.data(), dy, sb, grads_of(e), std::vector<bool>(3, true), kCpu);
      require_equal(yb.narrow(0, 0, n), y, "y");
      require_equal(dxb.narrow(0, 0, n), dx, "dx");
      for (const double v : yb.narrow(0, n, pad).to_vector<double>()) REQUIRE(v == 0.0);
      for (const double v : dxb.narrow(0, n, pad).to_vector<double>()) REQUIRE(v == 0.0);
      const std::vector<Tensor> g2 = grads_of(e);
      for (std::size_t i = 0; i < g2.size(); ++i) {
        if (g2[i].defined()) require_equal(g2[i], g1[i], "weight gradient");
      }

      REQUIRE_THROWS_QUINTET(
          e.forward(e.data(), rows, Tensor::from_vector<std::int64_t>({0, 3, 9}, {3}), sb, true,
                    kCpu),
          InvalidArgument, "expected [5]");
      REQUIRE_THROWS_QUINTET(
          e.forward(e.data(), rows, Tensor::from_vector<std::int64_t>({0, 3, 2, 9, 9}, {5}), sb,
                    true, kCpu),
          InvalidArgument, "decrease");
    }
  }
}
