// FP8 ("hybrid") tp linear layers under mpirun, tp = every rank of the job (1, 2, 3): output,
// input gradient and weight and bias gradients equal a direct f32 computation on the unsharded
// tensors rounded through FP8 (x and W in E4M3, dy in E5M2) at the scales of their whole
// tensors' amaxes, with and without sequence parallelism and bias; current scaling (amaxes
// reduced over tp in the call) and delayed scaling (the tensors' own amaxes at first, then the
// scales of the previous step's amaxes reduced over tp by fp8_end_step); and not equal to the
// f32 layer.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "quintet/nn/fp8.hpp"
#include "quintet/parallel/tensor_parallel/fp8.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"
#include "support/nn_layers.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace tp_test;

namespace {

const Stream kCpu;
constexpr std::int64_t kB = 2, kS = 6, kD = 12, kHidden = 24;

nn::Fp8TensorScale& scale_named(nn::Module& m, const std::string& name) {
  for (auto& [n, s] : m.named_fp8_scales())
    if (n == name) return *s;
  FAIL("no FP8 scale " << name);
  throw;
}

// One step of the layer (`column`: column-parallel, else row-parallel) against the reference on
// quantised inputs; returns how far the FP8 output is from the f32 layer's (max |difference|).
double check_step(nn::Module& mine, nn::ParameterStore& store, nn::Module& ref, bool column,
                  bool sp, Communicator& tp, const Tensor& x_ref, const Tensor& dy_ref, float sx,
                  float sw, float sdy) {
  const int r = tp.rank(), n = tp.size();
  const Tensor w_ref = ref.named_parameters().at(0).second->data();
  const Tensor b_ref =
      ref.named_parameters().size() > 1 ? ref.named_parameters().at(1).second->data() : Tensor();
  const Tensor xq = nn::fp8_round_trip(x_ref, sx, nn::Fp8Format::e4m3, kCpu);
  const Tensor wq = nn::fp8_round_trip(w_ref, sw, nn::Fp8Format::e4m3, kCpu);
  const Tensor dyq = nn::fp8_round_trip(dy_ref, sdy, nn::Fp8Format::e5m2, kCpu);
  const Tensor y_want = nn::linear_forward(xq, wq, b_ref, kCpu);
  const Tensor dx_want = nn::linear_backward_input(dyq, wq, kCpu);
  Tensor dw_want = Tensor::zeros(w_ref.shape());
  Tensor db_want = b_ref.defined() ? Tensor::zeros(b_ref.shape()) : Tensor();
  nn::linear_backward_weight(dyq, xq, dw_want, db_want, kCpu);

  // Column: x whole (or the rank's sequence chunk with SP), y and dy split along features. Row:
  // x split along features, y whole (or the sequence chunk with SP).
  const auto seq = [&](const Tensor& t) { return sp ? chunk(t, 1, r, n) : t; };
  const auto last = [&](const Tensor& t) { return chunk(t, t.dim() - 1, r, n); };
  store.zero_grad(kCpu);
  nn::Context ctx(kCpu);
  const Tensor y = mine.forward(ctx, column ? seq(x_ref) : last(x_ref));
  require_close(y, column ? last(y_want) : seq(y_want), "output");
  const Tensor dx = mine.backward(ctx, column ? last(dy_ref) : seq(dy_ref));
  require_close(dx, column ? seq(dx_want) : last(dx_want), "input gradient");
  for (auto& [name, p] : mine.named_parameters()) {
    const Tensor& want = name == "weight" ? dw_want : db_want;
    require_close(full_grad(*p, tp), shard_of(want, *p), name + " gradient");
  }
  const Tensor y_f32 = nn::linear_forward(x_ref, w_ref, b_ref, kCpu);
  const std::vector<float> a = y_want.to_vector<float>(), b = y_f32.to_vector<float>();
  double off = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) off = std::max(off, std::fabs(double(a[i]) - b[i]));
  return off;
}

}  // namespace

TEST_CASE("FP8 tp linear layers equal f32 GEMMs on FP8-rounded inputs", "[tp][fp8]") {
  World world = cpu_world();
  Mesh mesh(Layout(ParallelConfig{.tp = world.size()}, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  const bool sp = GENERATE(false, true);
  const bool bias = GENERATE(false, true);
  const bool column = GENERATE(true, false);
  const nn::Fp8Scaling scaling = GENERATE(nn::Fp8Scaling::current, nn::Fp8Scaling::delayed);
  INFO("tp = " << tp.size() << ", sp = " << sp << ", bias = " << bias << ", column = " << column
               << ", scaling = " << nn::fp8_scaling_name(scaling));
  const nn::Fp8Recipe recipe{nn::Fp8Mode::hybrid, scaling, 2, 0};
  const std::int64_t in = column ? kD : kHidden, out = column ? kHidden : kD;
  std::unique_ptr<nn::Module> mine;
  if (column) {
    mine = std::make_unique<tensor_parallel::ColumnParallelLinear>(
        tp, in, out,
        tensor_parallel::ColumnParallelOptions{
            .bias = bias, .init_std = 0.5f, .sequence_parallel = sp, .fp8 = recipe});
  } else {
    mine = std::make_unique<tensor_parallel::RowParallelLinear>(
        tp, in, out,
        tensor_parallel::RowParallelOptions{
            .bias = bias, .init_std = 0.5f, .sequence_parallel = sp, .fp8 = recipe});
  }
  nn::Linear ref(in, out, {.bias = bias, .init_std = 0.5f});
  nn::ParameterStore my_store(*mine, DType::f32, kCpu, 31), ref_store(ref, DType::f32, kCpu, 31);
  REQUIRE(mine->named_fp8_scales().size() == 3);

  const Tensor w_ref = ref.named_parameters().at(0).second->data();
  const float e4 = nn::fp8_max(nn::Fp8Format::e4m3), e5 = nn::fp8_max(nn::Fp8Format::e5m2);
  agreed(world.comm(), [&] {
    for (int step = 0; step < 2; ++step) {
      INFO("step " << step);
      // Inputs with a wide range, so FP8 rounding shows.
      const Tensor x = nn::scale(Tensor::randn({kB, kS, in}, 40 + step), 3.0f, kCpu);
      const Tensor dy = nn::scale(Tensor::randn({kB, kS, out}, 50 + step), 1e-3f, kCpu);
      const float ax = nn::fp8_amax(x, kCpu), aw = nn::fp8_amax(w_ref, kCpu),
                  ady = nn::fp8_amax(dy, kCpu);
      float sx = e4 / ax, sw = e4 / aw, sdy = e5 / ady;
      if (scaling == nn::Fp8Scaling::delayed) {
        // Step 0 has no history: the tensors' own amaxes, as current scaling.
        if (step == 1) {  // the previous step's amaxes (history of 2: the max of both)
          const Tensor x0 = nn::scale(Tensor::randn({kB, kS, in}, 40), 3.0f, kCpu);
          const Tensor dy0 = nn::scale(Tensor::randn({kB, kS, out}, 50), 1e-3f, kCpu);
          sx = e4 / nn::fp8_amax(x0, kCpu);
          sw = e4 / aw;
          sdy = e5 / nn::fp8_amax(dy0, kCpu);
        }
      }
      const double off = check_step(*mine, my_store, ref, column, sp, tp, x, dy, sx, sw, sdy);
      CHECK(off > 1e-3);  // FP8 is not f32
      if (scaling == nn::Fp8Scaling::current) {
        CHECK(scale_named(*mine, "fp8_x").step_amax() == ax);
        CHECK(scale_named(*mine, "fp8_dy").step_amax() == ady);
      }
      std::vector<nn::Fp8TensorScale*> scales;
      for (auto& [name, s] : mine->named_fp8_scales()) scales.push_back(s);
      tensor_parallel::fp8_end_step(scales, {&tp}, kCpu);
      if (scaling == nn::Fp8Scaling::delayed) {
        CHECK(scale_named(*mine, "fp8_w").history().front() == aw);  // reduced over tp
        CHECK(scale_named(*mine, "fp8_x").history().front() == ax);
        CHECK(scale_named(*mine, "fp8_dy").history().front() == ady);
      }
    }
  });
}
