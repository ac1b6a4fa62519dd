// The fp8 mode of 09_op_bench: see fp8_bench.hpp.
#include "fp8_bench.hpp"

#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quintet/collectives/mpi.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/tensor_parallel/fp8.hpp"
#include "timing.hpp"

using namespace quintet;
using nn::Fp8Format;
using nn::Fp8Tensor;
using tensor_parallel::Fp8Linear;

namespace {

constexpr int kWarmup = 3;

struct Layer {
  const char* name;
  std::int64_t in, out;
};

// One cast of the FP8 layer, timed.
struct Cast {
  const char* op;
  double bytes;  // the least it moves
  double ms = 0;
};

// One product of a layer: its FP8 GEMM, its bf16 GEMM and the casts the FP8 layer makes for it.
struct Product {
  const char* name;
  std::function<void()> fp8, bf16;
  std::vector<Cast> casts;
  std::vector<std::function<void()>> cast_fns;
  double fp8_ms = 0, bf16_ms = 0, casts_ms = 0;
};

struct Sum {
  double bf16_ms = 0, gemm_ms = 0, casts_ms = 0;
  void add(const Sum& o) {
    bf16_ms += o.bf16_ms;
    gemm_ms += o.gemm_ms;
    casts_ms += o.casts_ms;
  }
};

double tflops(double flops, double ms) { return flops / ms * 1e-9; }

void print_sum(const char* layer, const Sum& t, const Fp8BenchOptions& opt) {
  const double fp8 = t.gemm_ms + t.casts_ms;
  if (opt.json) {
    nlohmann::json j{{"bench", "fp8"},
                     {"layer", layer},
                     {"product", "sum"},
                     {"scaling", nn::fp8_scaling_name(opt.scaling)},
                     {"bf16_ms", t.bf16_ms},
                     {"fp8_gemm_ms", t.gemm_ms},
                     {"fp8_casts_ms", t.casts_ms},
                     {"fp8_ms", fp8},
                     {"gemm_speedup", t.bf16_ms / t.gemm_ms},
                     {"speedup", t.bf16_ms / fp8}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-10s %-8s %10.3f %10.3f %10.3f %10.3f %8.3f %8.3f\n", layer, "sum", t.bf16_ms,
                t.gemm_ms, t.casts_ms, fp8, t.bf16_ms / t.gemm_ms, t.bf16_ms / fp8);
  }
}

Sum bench_layer(const Fp8BenchOptions& opt, const Layer& l, const Stream& s, Communicator& tp,
                double copy_gbps, std::uint64_t seed) {
  const Device gpu = s.device();
  const std::int64_t T = opt.tokens, in = l.in, out = l.out;
  const Tensor x = Tensor::randn({T, in}, seed, DType::bf16, gpu);
  const Tensor w = Tensor::randn({out, in}, seed + 1, DType::bf16, gpu);
  const Tensor dy = Tensor::randn({T, out}, seed + 2, DType::bf16, gpu);
  const Tensor dw = Tensor::zeros({out, in}, DType::f32, gpu);
  Stream::default_stream(gpu).synchronize();  // inputs were drawn on the default stream
  nn::Fp8Recipe recipe;
  recipe.mode = nn::Fp8Mode::hybrid;
  recipe.scaling = opt.scaling;
  const std::string name = l.name;
  nn::Fp8TensorScale sx(Fp8Format::e4m3, recipe, name + ".fp8_x");
  nn::Fp8TensorScale sw(Fp8Format::e4m3, recipe, name + ".fp8_w");
  nn::Fp8TensorScale sdy(Fp8Format::e5m2, recipe, name + ".fp8_dy");
  Fp8Linear fp8(sx, sw, sdy);
  // One step first: the operands the GEMMs read and, under delayed scaling, an amax history (the
  // later calls then take the delayed path: no amax pass, the casts record the amaxes).
  Fp8Linear::Scales sc = fp8.forward_scales(x, w, tp, true, s);
  Fp8Linear::Scale sg = fp8.output_grad_scale(dy, tp, s);
  const Fp8Tensor qx = nn::fp8_cast(x, sc.x.scale, Fp8Format::e4m3, true, sc.x.amax, s);
  const Fp8Tensor qw = nn::fp8_cast(w, sc.w.scale, Fp8Format::e4m3, true, sc.w.amax, s);
  const Fp8Tensor qdy = nn::fp8_cast(dy, sg.scale, Fp8Format::e5m2, true, sg.amax, s);
  tensor_parallel::fp8_end_step({&sx, &sw, &sdy}, {}, s);
  sc = fp8.forward_scales(x, w, tp, true, s);
  sg = fp8.output_grad_scale(dy, tp, s);
  // What backward reads (linear.cpp's saved tensors and Fp8Backward).
  const Fp8Tensor xt{qx.transposed, Tensor(), qx.scale, Fp8Format::e4m3};
  const Fp8Tensor wt{qw.transposed, Tensor(), qw.scale, Fp8Format::e4m3};
  const Fp8Tensor dyt{qdy.transposed, Tensor(), qdy.scale, Fp8Format::e5m2};

  const double nx = static_cast<double>(T) * in, nw = static_cast<double>(out) * in,
               ny = static_cast<double>(T) * out;
  // A cast with its transpose reads bf16 and writes the FP8 data twice: 4 bytes per element. The
  // scales read the tensors whose amax they take (none under delayed scaling with a history).
  const double scales_xw = 2 * ((sx.uses_amax() ? nx : 0) + (sw.uses_amax() ? nw : 0));
  std::vector<Product> products = {
      {"forward",
       [&] {
         const Tensor y = Tensor::empty({T, out}, DType::bf16, gpu, s);
         nn::fp8_gemm(qx, qw, Tensor(), y, false, true, s);
       },
       [&] { nn::linear_forward(x, w, Tensor(), s); },
       {{"scales_xw", scales_xw}, {"cast_xw", 4 * (nx + nw)}},
       {[&] { fp8.forward_scales(x, w, tp, true, s); },
        [&] {
          nn::fp8_casts({{x, sc.x.scale, Fp8Format::e4m3, true, sc.x.amax},
                         {w, sc.w.scale, Fp8Format::e4m3, true, sc.w.amax}},
                        s);
        }}},
      {"dgrad",
       [&] {
         const Tensor dx = Tensor::empty({T, in}, DType::bf16, gpu, s);
         nn::fp8_gemm(qdy, wt, Tensor(), dx, false, false, s);
       },
       [&] { nn::linear_backward_input(dy, w, s); },
       {{"scale_dy", sdy.uses_amax() ? 2 * ny : 0}, {"cast_dy", 4 * ny}},
       {[&] { fp8.output_grad_scale(dy, tp, s); },
        [&] { nn::fp8_cast(dy, sg.scale, Fp8Format::e5m2, true, sg.amax, s); }}},
      {"wgrad",
       [&] { nn::fp8_gemm(dyt, xt, Tensor(), dw, true, false, s); },
       [&] { nn::linear_backward_weight(dy, x, dw, Tensor(), s); },
       {},  // no cast: it reads the transposes the forward and dgrad casts made
       {}},
  };
  const double flops = 2.0 * static_cast<double>(T) * in * out;
  Sum sum;
  for (Product& p : products) {
    p.fp8_ms = median_ms(s, kWarmup, opt.iters, p.fp8);
    p.bf16_ms = median_ms(s, kWarmup, opt.iters, p.bf16);
    nlohmann::json casts = nlohmann::json::array();
    for (std::size_t i = 0; i < p.casts.size(); ++i) {
      Cast& c = p.casts[i];
      c.ms = median_ms(s, kWarmup, opt.iters, p.cast_fns[i]);
      p.casts_ms += c.ms;
      const double gbps = c.bytes / c.ms * 1e-6;  // 0: it reads no tensor
      casts.push_back({{"op", c.op},
                       {"bytes", c.bytes},
                       {"ms", c.ms},
                       {"gbps", gbps},
                       {"fraction_of_copy", gbps / copy_gbps}});
    }
    sum.add({p.bf16_ms, p.fp8_ms, p.casts_ms});
    const double fp8_all = p.fp8_ms + p.casts_ms;
    if (opt.json) {
      nlohmann::json j{{"bench", "fp8"},
                       {"layer", l.name},
                       {"product", p.name},
                       {"tokens", T},
                       {"in", in},
                       {"out", out},
                       {"scaling", nn::fp8_scaling_name(opt.scaling)},
                       {"fp8_ms", p.fp8_ms},
                       {"fp8_tflops", tflops(flops, p.fp8_ms)},
                       {"bf16_ms", p.bf16_ms},
                       {"bf16_tflops", tflops(flops, p.bf16_ms)},
                       {"speedup", p.bf16_ms / p.fp8_ms},
                       {"casts", casts},
                       {"casts_ms", p.casts_ms},
                       {"speedup_with_casts", p.bf16_ms / fp8_all}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-10s %-8s %6lld %6lld %9.3f %8.1f %9.3f %8.1f %7.3f %9.3f %7.3f\n", l.name,
                  p.name, static_cast<long long>(in), static_cast<long long>(out), p.bf16_ms,
                  tflops(flops, p.bf16_ms), p.fp8_ms, tflops(flops, p.fp8_ms), p.bf16_ms / p.fp8_ms,
                  p.casts_ms, p.bf16_ms / fp8_all);
      for (const Cast& c : p.casts) {
        const double gbps = c.bytes / c.ms * 1e-6;
        std::printf("%19s %-10s %9.3f ms %8.1f GB/s %6.3f of copy\n", "", c.op, c.ms, gbps,
                    gbps / copy_gbps);
      }
    }
    std::fflush(stdout);
  }
  return sum;
}

// The forward casts of two layers reading one x (attention's key/value and query, SwiGLU's gate
// and up), as ColumnParallelLinear::forward_shared_input makes them (one amax launch over x and
// both weights, one scale launch, x cast once) against each layer's own (bench_layer's forward
// casts, twice). Returns the time the shared form saves (ms).
double bench_shared_x(const Fp8BenchOptions& opt, const char* name, std::int64_t in,
                      std::int64_t out_a, std::int64_t out_b, const Stream& s, Communicator& tp,
                      std::uint64_t seed) {
  const Device gpu = s.device();
  const Tensor x = Tensor::randn({opt.tokens, in}, seed, DType::bf16, gpu);
  const Tensor wa = Tensor::randn({out_a, in}, seed + 1, DType::bf16, gpu);
  const Tensor wb = Tensor::randn({out_b, in}, seed + 2, DType::bf16, gpu);
  Stream::default_stream(gpu).synchronize();
  nn::Fp8Recipe recipe;
  recipe.mode = nn::Fp8Mode::hybrid;
  recipe.scaling = opt.scaling;
  std::vector<nn::Fp8TensorScale> sc;
  for (const char* role : {"a.fp8_x", "a.fp8_w", "a.fp8_dy", "b.fp8_x", "b.fp8_w", "b.fp8_dy"}) {
    const bool dy = std::string(role).ends_with("dy");
    sc.emplace_back(dy ? Fp8Format::e5m2 : Fp8Format::e4m3, recipe, role);
  }
  Fp8Linear la(sc[0], sc[1], sc[2]), lb(sc[3], sc[4], sc[5]);
  const auto cast = [&](const Tensor& t, const Fp8Linear::Scale& scale) {
    return nn::Fp8CastArgs{t, scale.scale, Fp8Format::e4m3, true, scale.amax};
  };
  const auto apart = [&] {
    const Fp8Linear::Scales a = la.forward_scales(x, wa, tp, true, s);
    nn::fp8_casts({cast(x, a.x), cast(wa, a.w)}, s);
    const Fp8Linear::Scales b = lb.forward_scales(x, wb, tp, true, s);
    nn::fp8_casts({cast(x, b.x), cast(wb, b.w)}, s);
  };
  const auto shared = [&] {
    const Fp8Linear::SharedScales f =
        Fp8Linear::shared_forward_scales(la, lb, x, wa, wb, tp, true, s);
    nn::fp8_casts({cast(x, f.x), cast(wa, f.wa), cast(wb, f.wb)}, s);
    if (f.x_also.defined()) nn::fp8_amaxes_into({f.x.amax}, f.x_also, s);
  };
  // One step first, as bench_layer: under delayed scaling, the histories.
  apart();
  std::vector<nn::Fp8TensorScale*> all;
  for (nn::Fp8TensorScale& t : sc) all.push_back(&t);
  tensor_parallel::fp8_end_step(all, {}, s);
  const double apart_ms = median_ms(s, kWarmup, opt.iters, apart);
  const double shared_ms = median_ms(s, kWarmup, opt.iters, shared);
  if (opt.json) {
    nlohmann::json j{{"bench", "fp8"},
                     {"layer", name},
                     {"product", "forward_casts_shared_x"},
                     {"scaling", nn::fp8_scaling_name(opt.scaling)},
                     {"apart_ms", apart_ms},
                     {"shared_ms", shared_ms},
                     {"saved_ms", apart_ms - shared_ms}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-16s %10.3f %10.3f %10.3f\n", name, apart_ms, shared_ms, apart_ms - shared_ms);
  }
  return apart_ms - shared_ms;
}

}  // namespace

void check_fp8_options(const Fp8BenchOptions& o) {
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"--fp8-tokens", o.tokens},     {"--fp8-hidden", o.hidden},     {"--fp8-heads", o.heads},
      {"--fp8-kv-heads", o.kv_heads}, {"--fp8-head-dim", o.head_dim}, {"--fp8-ffn", o.ffn}};
  for (const auto& [name, v] : sizes) {
    if (v <= 0) throw std::invalid_argument(std::string(name) + " must be > 0");
  }
}

void bench_fp8(const Fp8BenchOptions& opt, const Stream& s) {
  check_fp8_options(opt);
  const Device gpu = s.device();
  const CopyBound copy = copy_bound(s, opt.copy_bytes, kWarmup, opt.iters);
  const std::unique_ptr<Communicator> tp = make_self_communicator(gpu, "fp8_bench");
  const std::int64_t d = opt.hidden, attn = opt.heads * opt.head_dim;
  const Layer layers[] = {{"attn.q", d, attn},    {"attn.kv", d, 2 * opt.kv_heads * opt.head_dim},
                          {"attn.proj", attn, d}, {"mlp.gate", d, opt.ffn},
                          {"mlp.up", d, opt.ffn}, {"mlp.down", opt.ffn, d}};
  if (opt.json) {
    nlohmann::json j{{"bench", "fp8"},  {"op", "copy"},
                     {"gpu", copy.gpu}, {"bytes", 2.0 * static_cast<double>(opt.copy_bytes)},
                     {"ms", copy.ms},   {"gbps", copy.gbps}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "\nFP8 (hybrid, %s scaling) against bf16, the Llama block's linear layers, tokens %lld, "
        "on %s; x = bf16 ms / fp8 ms; copy bound %.1f GB/s\n",
        nn::fp8_scaling_name(opt.scaling), static_cast<long long>(opt.tokens), copy.gpu.c_str(),
        copy.gbps);
    std::printf("%-10s %-8s %6s %6s %9s %8s %9s %8s %7s %9s %7s\n", "layer", "product", "in", "out",
                "bf16 ms", "TF/s", "fp8 ms", "TF/s", "x", "casts ms", "x+casts");
  }
  Sum block;
  std::uint64_t seed = 4500;
  std::vector<std::pair<const char*, Sum>> sums;
  for (const Layer& l : layers) {
    sums.emplace_back(l.name, bench_layer(opt, l, s, *tp, copy.gbps, seed));
    block.add(sums.back().second);
    seed += 3;
  }
  if (!opt.json) {
    std::printf("\nper layer, the three GEMMs and the FP8 casts summed (ms)\n");
    std::printf("%-10s %-8s %10s %10s %10s %10s %8s %8s\n", "layer", "", "bf16", "fp8 gemms",
                "fp8 casts", "fp8 all", "x gemms", "x all");
  }
  for (const auto& [name, sum] : sums) print_sum(name, sum, opt);
  print_sum("block", block, opt);
  // The trainer casts attn.kv's and attn.q's x once, and mlp.gate's and mlp.up's: the block's
  // casts less what that saves.
  if (!opt.json) {
    std::printf("\nforward casts of two layers reading one x (ms): each its own, x cast once\n");
    std::printf("%-16s %10s %10s %10s\n", "layers", "apart", "shared", "saved");
  }
  const double saved =
      bench_shared_x(opt, "attn.kv+attn.q", d, 2 * opt.kv_heads * opt.head_dim, attn, s, *tp,
                     seed) +
      bench_shared_x(opt, "mlp.gate+mlp.up", d, opt.ffn, opt.ffn, s, *tp, seed + 3);
  Sum trainer = block;
  trainer.casts_ms -= saved;
  print_sum("block x once", trainer, opt);
}
