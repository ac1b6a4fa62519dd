// 09_op_bench: GPU throughput of Quintet's nn ops, against the baseline a user would otherwise
// call, measured in the same run.
//
//   linear    - y = x·wᵀ + b, dx = dy·w, dw += dyᵀ·x in bf16 (f32 accumulation, dw f32) at
//               transformer shapes; ours (quintet::nn::linear_*) vs one cuBLASLt call set up by
//               hand (raw_cublaslt.hpp). FLOPs = 2·M·N·K per product. Target: ratio >= 0.9.
//               Each pair is timed --linear-reps times, alternating which runs first; medians
//               and the ratio's range are printed.
//   attention - causal self-attention forward and forward+backward in bf16, seq 1024..8192,
//               head_dim 64 and 128, batch·seq = 16384 tokens, heads = 2048 / head_dim.
//               FLOP convention (FlashAttention's): forward = 4·b·h·s²·d, halved for causal;
//               backward = 2.5 x forward, so forward+backward = 3.5 x forward.
//               scripts/bench/attention_torch.py prints the same fields for PyTorch's SDPA.
//               --attention-kernel picks the CUDA implementation(s) measured: gemm (tensor-core
//               GEMMs + fused softmax, the default), simt (the flash-style SIMT kernel), cudnn
//               (cuDNN's fused attention through its graph API), auto.
//   experts   - the expert GEMMs of a mixture-of-experts layer (fc and proj of E experts, forward,
//               backward input and backward weight) in bf16: a loop of quintet::nn::linear_* per
//               expert (what the MoE layer runs) vs one cublasGemmGroupedBatchedEx per product
//               (experts_bench.hpp, grouped_gemm.hpp) vs our grouped kernels
//               (nn::grouped_linear_*, offsets on the device: mma.sync, and wgmma on sm_90),
//               checked against each other first.
//               FLOPs = 2·rows·N·K summed over the experts; ms are medians.
//   elementwise - the memory-bound kernels of a Llama-style block (RoPE, RMSNorm with the
//               residual add, SwiGLU), forward and backward, bf16, at Llama-1B shapes by default
//               (4096 tokens, hidden 2048, 32 query and 8 key heads of 64, SwiGLU width
//               8192): GB/s = (inputs read + outputs written) / time, against a
//               device-to-device cudaMemcpy measured in the same run and the nominal bandwidth
//               (elementwise_bench.hpp).
//   fp8       - the Llama block's linear layers (query, key/value, output, gate, up, down; 8192
//               tokens, hidden 2048 by default) in FP8 against bf16: each product's GEMM
//               (forward, dgrad, wgrad) both ways, the casts and scales the FP8 layer makes for
//               it (GB/s against a device-to-device copy), and each layer's sum: whether the
//               casts eat the GEMMs' gain (fp8_bench.hpp).
//
//   09_op_bench [--json] [--iters N] [--linear-reps R] [--skip-linear] [--skip-attention]
//               [--skip-experts] [--experts-only] [--seq 1024 ...] [--head-dim 64 128]
//               [--attention-kernel gemm simt cudnn auto] [--tokens 8192] [--hidden 4096]
//               [--experts-count 8] [--expert-rows R ...] [--expert-tokens 16384]
//               [--expert-top-k 2] [--expert-hidden 1024] [--expert-ffn 2816] [--expert-skew 0]
//               [--expert-grouping shape|expert] [--skip-elementwise] [--elementwise-only]
//               [--ew-tokens 4096] [--ew-seq 2048] [--ew-hidden 2048] [--ew-heads 32]
//               [--ew-kv-heads 8] [--ew-head-dim 64] [--ew-ffn 8192] [--ew-copy-bytes N]
//               [--nominal-gbps 4800] [--skip-fp8] [--fp8-only] [--fp8-tokens 8192]
//               [--fp8-hidden 2048] [--fp8-heads 32] [--fp8-kv-heads 8] [--fp8-head-dim 64]
//               [--fp8-ffn 8192] [--fp8-scaling current|delayed] [--device 0]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "elementwise_bench.hpp"
#include "experts_bench.hpp"
#include "fp8_bench.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"
#include "raw_cublaslt.hpp"

using namespace quintet;

namespace {

constexpr const char* kAttentionFlops =
    "forward = 4*b*h*s^2*d, halved for causal; forward+backward = 3.5 x forward";

// Milliseconds per call of fn on stream: `warmup` untimed calls, then `iters` timed ones.
double time_ms(const Stream& stream, int warmup, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  Event start(stream.device(), true), stop(stream.device(), true);
  start.record(stream);
  for (int i = 0; i < iters; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return stop.elapsed_ms(start) / iters;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Ours against the raw call, measured `reps` times, the order alternating (ours first on even
// repetitions, raw first on odd ones) so neither always runs on a warmer GPU: the medians of
// each side's ms, and the median and range of the per-repetition ratios raw ms / ours ms (ours
// TF/s over theirs: > 1 is ours faster).
struct LinearTiming {
  double ours_ms = 0, raw_ms = 0, ratio = 0, ratio_min = 0, ratio_max = 0;
};
LinearTiming time_pair(const Stream& s, int reps, int iters, const std::function<void()>& ours,
                       const std::function<void()>& raw) {
  std::vector<double> o, r, ratio;
  for (int rep = 0; rep < reps; ++rep) {
    double t_ours = 0, t_raw = 0;
    if (rep % 2 == 0) {
      t_ours = time_ms(s, 3, iters, ours);
      t_raw = time_ms(s, 3, iters, raw);
    } else {
      t_raw = time_ms(s, 3, iters, raw);
      t_ours = time_ms(s, 3, iters, ours);
    }
    o.push_back(t_ours);
    r.push_back(t_raw);
    ratio.push_back(t_raw / t_ours);
  }
  LinearTiming t;
  t.ours_ms = median_of(o);
  t.raw_ms = median_of(r);
  t.ratio = median_of(ratio);
  t.ratio_min = *std::min_element(ratio.begin(), ratio.end());
  t.ratio_max = *std::max_element(ratio.begin(), ratio.end());
  return t;
}

struct Options {
  bool json = false;
  int iters = 20;
  int linear_reps = 7;  // linear: repetitions of each ours/raw pair, order alternating
  bool skip_linear = false, skip_attention = false, skip_experts = false, experts_only = false;
  bool skip_elementwise = false, elementwise_only = false;
  bool skip_fp8 = false, fp8_only = false;
  int cp_split = 0;  // > 0: also the context-parallel split cost at this cp
  std::vector<std::int64_t> seqs = {1024, 2048, 4096, 8192};
  std::vector<std::int64_t> head_dims = {64, 128};
  std::vector<std::string> attention_kernels = {"gemm"};
  std::int64_t tokens = 8192, hidden = 4096;
  int device = 0;
  ExpertBenchOptions experts;           // its json and iters are copied from the above
  ElementwiseBenchOptions elementwise;  // likewise
  Fp8BenchOptions fp8;                  // likewise
};

void bench_linear(const Options& opt, const Stream& s) {
  const Device gpu = s.device();
  const std::int64_t M = opt.tokens, H = opt.hidden;
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{H, H}, {H, 4 * H}, {4 * H, H}};
  if (!opt.json) {
    std::printf("linear, bf16 in/out, f32 accumulation (dw in f32), tokens %lld\n",
                static_cast<long long>(M));
    std::printf(
        "ms and TF/s: medians of %d repetitions of %d calls, ours and cuBLASLt "
        "alternating which runs first; ratio = median of the per-repetition ratios "
        "(ours TF/s / cuBLASLt TF/s), then its range\n",
        opt.linear_reps, opt.iters);
    std::printf("%-16s %6s %6s %10s %10s %10s %10s %7s %13s\n", "pass", "in", "out", "ours ms",
                "cuBLASLt", "ours TF/s", "cuBLASLt", "ratio", "range");
  }
  std::uint64_t seed = 1;
  for (const auto& [in, out] : shapes) {
    const Tensor x = Tensor::randn({M, in}, ++seed, DType::bf16, gpu);
    const Tensor w = Tensor::randn({out, in}, ++seed, DType::bf16, gpu);
    const Tensor b = Tensor::randn({out}, ++seed, DType::bf16, gpu);
    const Tensor dy = Tensor::randn({M, out}, ++seed, DType::bf16, gpu);
    const Tensor dw = Tensor::zeros({out, in}, DType::f32, gpu);
    const Tensor y_raw = Tensor::empty({M, out}, DType::bf16, gpu);
    const Tensor dx_raw = Tensor::empty({M, in}, DType::bf16, gpu);
    const Tensor dw_raw = Tensor::zeros({out, in}, DType::f32, gpu);
    // The same column-major products as lib/nn/cuda/linear.cu, called by hand.
    RawLtGemm fwd(true, false, out, M, in, w.data_ptr(), in, x.data_ptr(), in, y_raw.data_ptr(),
                  out, CUDA_R_16BF, 0.0f, b.data_ptr());
    RawLtGemm bwd_in(false, false, in, M, out, w.data_ptr(), in, dy.data_ptr(), out,
                     dx_raw.data_ptr(), in, CUDA_R_16BF, 0.0f, nullptr);
    RawLtGemm bwd_w(false, true, in, out, M, x.data_ptr(), in, dy.data_ptr(), out,
                    dw_raw.data_ptr(), in, CUDA_R_32F, 1.0f, nullptr);
    Stream::default_stream(gpu).synchronize();  // inputs were drawn on the default stream
    const cudaStream_t h = s.handle();
    struct Pass {
      const char* name;
      std::function<void()> ours, raw;
    };
    const Pass passes[] = {
        {"forward", [&] { nn::linear_forward(x, w, b, s); }, [&] { fwd.run(h); }},
        {"backward_input", [&] { nn::linear_backward_input(dy, w, s); }, [&] { bwd_in.run(h); }},
        {"backward_weight", [&] { nn::linear_backward_weight(dy, x, dw, Tensor(), s); },
         [&] { bwd_w.run(h); }},
    };
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(in) * out;
    for (const Pass& p : passes) {
      const LinearTiming t = time_pair(s, opt.linear_reps, opt.iters, p.ours, p.raw);
      const double tf_ours = flops / t.ours_ms * 1e-9, tf_raw = flops / t.raw_ms * 1e-9;
      if (opt.json) {
        nlohmann::json j{{"bench", "linear"},
                         {"pass", p.name},
                         {"dtype", "bf16"},
                         {"tokens", M},
                         {"in", in},
                         {"out", out},
                         {"reps", opt.linear_reps},
                         {"ours_ms", t.ours_ms},
                         {"cublaslt_ms", t.raw_ms},
                         {"ours_tflops", tf_ours},
                         {"cublaslt_tflops", tf_raw},
                         {"ratio", t.ratio},
                         {"ratio_min", t.ratio_min},
                         {"ratio_max", t.ratio_max}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%-16s %6lld %6lld %10.3f %10.3f %10.1f %10.1f %7.3f %7.3f-%.3f\n", p.name,
                    static_cast<long long>(in), static_cast<long long>(out), t.ours_ms, t.raw_ms,
                    tf_ours, tf_raw, t.ratio, t.ratio_min, t.ratio_max);
      }
    }
  }
}

void bench_attention(const Options& opt, const Stream& s) {
  const Device gpu = s.device();
  if (!opt.json) {
    std::printf("\nattention, bf16, causal; FLOPs: %s\n", kAttentionFlops);
    std::printf("%-6s %6s %6s %6s %6s %10s %10s %10s %10s\n", "kernel", "batch", "heads", "seq",
                "hdim", "fwd ms", "fwd TF/s", "f+b ms", "f+b TF/s");
  }
  std::uint64_t seed = 100;
  for (const std::string& kname : opt.attention_kernels) {
    const nn::AttentionKernel kernel = kname == "gemm"    ? nn::AttentionKernel::gemm
                                       : kname == "simt"  ? nn::AttentionKernel::simt
                                       : kname == "cudnn" ? nn::AttentionKernel::cudnn
                                                          : nn::AttentionKernel::automatic;
    for (const std::int64_t d : opt.head_dims) {
      for (const std::int64_t seq : opt.seqs) {
        const std::int64_t batch = std::max<std::int64_t>(1, 16384 / seq), heads = 2048 / d;
        const Shape shape = {batch, heads, seq, d};
        const Tensor q = Tensor::randn(shape, ++seed, DType::bf16, gpu);
        const Tensor k = Tensor::randn(shape, ++seed, DType::bf16, gpu);
        const Tensor v = Tensor::randn(shape, ++seed, DType::bf16, gpu);
        const Tensor dout = Tensor::randn(shape, ++seed, DType::bf16, gpu);
        Stream::default_stream(gpu).synchronize();  // inputs were drawn on the default stream
        nn::AttentionOptions o;
        o.causal = true;
        o.kernel = kernel;
        // Fewer iterations for the long sequences: each one is long already.
        const int iters = std::max(2, opt.iters * 1024 / static_cast<int>(seq) / 2);
        const double fwd = time_ms(s, 1, iters, [&] { nn::attention_forward(q, k, v, o, s); });
        const double fb = time_ms(s, 1, iters, [&] {
          const nn::AttentionOutput r = nn::attention_forward(q, k, v, o, s);
          nn::attention_backward(dout, q, k, v, r.out, r.lse, o, s);
        });
        const double fwd_flops = 4.0 * batch * heads * static_cast<double>(seq) * seq * d / 2.0;
        const double tf_fwd = fwd_flops / fwd * 1e-9, tf_fb = 3.5 * fwd_flops / fb * 1e-9;
        if (opt.json) {
          nlohmann::json j{{"bench", "attention"},    {"impl", "quintet"},
                           {"kernel", kname},         {"dtype", "bf16"},
                           {"causal", true},          {"batch", batch},
                           {"heads", heads},          {"seq", seq},
                           {"head_dim", d},           {"fwd_ms", fwd},
                           {"fwd_bwd_ms", fb},        {"fwd_tflops", tf_fwd},
                           {"fwd_bwd_tflops", tf_fb}, {"flops_convention", kAttentionFlops}};
          std::printf("%s\n", j.dump().c_str());
        } else {
          std::printf("%-6s %6lld %6lld %6lld %6lld %10.3f %10.2f %10.3f %10.2f\n", kname.c_str(),
                      static_cast<long long>(batch), static_cast<long long>(heads),
                      static_cast<long long>(seq), static_cast<long long>(d), fwd, tf_fwd, fb,
                      tf_fb);
        }
        std::fflush(stdout);
      }
    }
  }
}

// The cost of splitting attention for context parallelism, on one GPU: one causal attention over
// the whole sequence against the blocks ring attention computes over cp ranks (every rank's
// (query chunk, key chunk) pairs with their offsets, merged by log-sum-exp, and the backward of
// each block accumulated), all run here one after the other. The ratio is the extra work the
// split costs, before any communication.
void bench_cp_split(const Options& opt, const Stream& s) {
  const Device gpu = s.device();
  const int n = opt.cp_split;
  if (!opt.json) {
    std::printf("\ncontext-parallel split, bf16, causal, cp %d (2cp chunks), one GPU\n", n);
    std::printf("%6s %6s %6s %10s %10s %7s %10s %10s %7s\n", "heads", "seq", "hdim", "full fwd",
                "split fwd", "ratio", "full f+b", "split f+b", "ratio");
  }
  std::uint64_t seed = 500;
  for (const std::int64_t d : opt.head_dims) {
    for (const std::int64_t seq : opt.seqs) {
      if (seq % (2 * n) != 0) continue;
      const std::int64_t heads = 2048 / d, c = seq / (2 * n);
      const Shape shape = {1, heads, seq, d};
      const Tensor q = Tensor::randn(shape, ++seed, DType::bf16, gpu);
      const Tensor k = Tensor::randn(shape, ++seed, DType::bf16, gpu);
      const Tensor v = Tensor::randn(shape, ++seed, DType::bf16, gpu);
      const Tensor dout = Tensor::randn(shape, ++seed, DType::bf16, gpu);
      Stream::default_stream(gpu).synchronize();
      auto chunks = [&](const Tensor& t) {
        std::vector<Tensor> out;
        for (int j = 0; j < 2 * n; ++j) out.push_back(t.narrow(2, j * c, c).contiguous(s));
        return out;
      };
      const auto qc = chunks(q), kc = chunks(k), vc = chunks(v), dc = chunks(dout);
      nn::AttentionOptions whole;
      whole.causal = true;
      // Every rank's two query chunks against every key chunk they see (all ranks, in turn).
      std::vector<int> mine;
      for (int r = 0; r < n; ++r) mine.insert(mine.end(), {r, 2 * n - 1 - r});
      auto block = [&](int qi, int kj) {
        nn::AttentionOptions o;
        o.causal = kj == qi;
        o.q_offset = qi * c;
        o.k_offset = kj * c;
        return o;
      };
      std::vector<nn::AttentionOutput> merged(2 * n);
      auto split_forward = [&] {
        for (int qi : mine) {
          nn::AttentionOutput& m = merged[qi];
          for (int kj = 0; kj <= qi; ++kj) {
            nn::AttentionOutput b = nn::attention_forward(qc[qi], kc[kj], vc[kj], block(qi, kj), s);
            if (kj == 0) {
              m = std::move(b);
            } else {
              nn::attention_merge_(m.out, m.lse, b.out, b.lse, s);
            }
          }
        }
      };
      std::vector<Tensor> dq(2 * n), dk(2 * n), dv(2 * n);
      for (int j = 0; j < 2 * n; ++j) {
        dq[j] = Tensor::zeros({1, heads, c, d}, DType::f32, gpu);
        dk[j] = Tensor::zeros({1, heads, c, d}, DType::f32, gpu);
        dv[j] = Tensor::zeros({1, heads, c, d}, DType::f32, gpu);
      }
      Stream::default_stream(gpu).synchronize();
      auto split_backward = [&] {
        for (int qi : mine) {
          for (int kj = 0; kj <= qi; ++kj) {
            const nn::AttentionGrads g = nn::attention_backward(
                dc[qi], qc[qi], kc[kj], vc[kj], merged[qi].out, merged[qi].lse, block(qi, kj), s);
            nn::add_(dq[qi], g.dq, 1.0f, s);
            nn::add_(dk[kj], g.dk, 1.0f, s);
            nn::add_(dv[kj], g.dv, 1.0f, s);
          }
        }
      };
      const int iters = std::max(2, opt.iters * 1024 / static_cast<int>(seq));
      const double full_f = time_ms(s, 1, iters, [&] { nn::attention_forward(q, k, v, whole, s); });
      const double full_fb = time_ms(s, 1, iters, [&] {
        const nn::AttentionOutput r = nn::attention_forward(q, k, v, whole, s);
        nn::attention_backward(dout, q, k, v, r.out, r.lse, whole, s);
      });
      const double split_f = time_ms(s, 1, iters, split_forward);
      const double split_fb = time_ms(s, 1, iters, [&] {
        split_forward();
        split_backward();
      });
      if (opt.json) {
        nlohmann::json j{{"bench", "cp_split"},
                         {"cp", n},
                         {"heads", heads},
                         {"seq", seq},
                         {"head_dim", d},
                         {"full_fwd_ms", full_f},
                         {"split_fwd_ms", split_f},
                         {"full_fwd_bwd_ms", full_fb},
                         {"split_fwd_bwd_ms", split_fb}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%6lld %6lld %6lld %10.3f %10.3f %7.2f %10.3f %10.3f %7.2f\n",
                    static_cast<long long>(heads), static_cast<long long>(seq),
                    static_cast<long long>(d), full_f, split_f, split_f / full_f, full_fb, split_fb,
                    split_fb / full_fb);
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "GPU throughput of the nn ops: linear vs raw cuBLASLt, attention forward+backward, expert "
      "GEMMs vs cublasGemmGroupedBatchedEx"};
  app.add_flag("--json", opt.json, "print one JSON object per result line");
  app.add_option("--iters", opt.iters, "timed iterations per linear and experts measurement")
      ->check(CLI::PositiveNumber);
  app.add_option("--linear-reps", opt.linear_reps,
                 "linear: repetitions of each ours/cuBLASLt pair (order alternating); medians "
                 "and the ratio's range are reported")
      ->check(CLI::PositiveNumber);
  app.add_flag("--skip-linear", opt.skip_linear, "do not run the linear benchmark");
  app.add_flag("--skip-attention", opt.skip_attention, "do not run the attention benchmark");
  app.add_option("--cp-split", opt.cp_split,
                 "also measure the context-parallel split at this cp: the ring's blocks and "
                 "log-sum-exp merges against one full attention, on this GPU");
  app.add_option("--seq", opt.seqs, "attention sequence lengths");
  app.add_option("--head-dim", opt.head_dims, "attention head dimensions (simt: <= 256)");
  app.add_option("--attention-kernel", opt.attention_kernels,
                 "attention implementations to measure: gemm, simt, cudnn, auto")
      ->check(CLI::IsMember({"gemm", "simt", "cudnn", "auto"}));
  app.add_option("--tokens", opt.tokens, "linear: rows of x (batch x sequence)")
      ->check(CLI::PositiveNumber);
  app.add_option("--hidden", opt.hidden, "linear: model width; shapes h->h, h->4h, 4h->h")
      ->check(CLI::PositiveNumber);
  app.add_flag("--skip-experts", opt.skip_experts, "do not run the experts benchmark");
  app.add_flag("--experts-only", opt.experts_only,
               "run the experts benchmark alone (no linear, attention or cp split)");
  ExpertBenchOptions& ex = opt.experts;
  CLI::Option* experts_count =
      app.add_option("--experts-count", ex.experts, "experts: number of experts E")
          ->check(CLI::PositiveNumber);
  app.add_option("--expert-rows", ex.rows,
                 "experts: rows of each expert, one value per expert (0 allowed; sets E); "
                 "default: expert-tokens x expert-top-k split over E by --expert-skew")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--expert-tokens", ex.tokens, "experts: tokens routed (before top-k)")
      ->check(CLI::PositiveNumber);
  app.add_option("--expert-top-k", ex.top_k, "experts: experts per token")
      ->check(CLI::PositiveNumber);
  app.add_option("--expert-hidden", ex.hidden, "experts: model width d (fc: d -> F)")
      ->check(CLI::PositiveNumber);
  app.add_option("--expert-ffn", ex.ffn, "experts: expert width F (proj: F -> d)")
      ->check(CLI::PositiveNumber);
  app.add_option("--expert-skew", ex.skew,
                 "experts: uneven rows, total unchanged: expert e's share ~ max(0, 1 + s(2e - "
                 "(E-1))/(E-1)); 0 even, (E-1)/(E+1) ~ e+1, 1 ~ e (expert 0 empty), > 1 more "
                 "empty experts")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--expert-grouping", ex.grouping,
                 "experts: cuBLAS groups, one per distinct shape or one per expert")
      ->check(CLI::IsMember({"shape", "expert"}));
  app.add_flag("--skip-elementwise", opt.skip_elementwise,
               "do not run the elementwise (RoPE, RMSNorm, SwiGLU) benchmark");
  app.add_flag("--elementwise-only", opt.elementwise_only, "run the elementwise benchmark alone");
  ElementwiseBenchOptions& ew = opt.elementwise;
  app.add_option("--ew-tokens", ew.tokens, "elementwise: tokens (batch x sequence)");
  app.add_option("--ew-seq", ew.seq, "elementwise: RoPE's sequence length (divides tokens)");
  app.add_option("--ew-hidden", ew.hidden, "elementwise: RMSNorm's width");
  app.add_option("--ew-heads", ew.heads, "elementwise: RoPE's query heads");
  app.add_option("--ew-kv-heads", ew.kv_heads, "elementwise: RoPE's key heads");
  app.add_option("--ew-head-dim", ew.head_dim, "elementwise: RoPE's head width (even)");
  app.add_option("--ew-ffn", ew.ffn, "elementwise: SwiGLU's width");
  app.add_option("--ew-copy-bytes", ew.copy_bytes,
                 "elementwise: the bytes of the device-to-device copy that measures the bound");
  app.add_option("--nominal-gbps", ew.nominal_gbps,
                 "elementwise: the GPU's nominal memory bandwidth in GB/s (H200: 4800)");
  app.add_flag("--skip-fp8", opt.skip_fp8, "do not run the FP8 against bf16 benchmark");
  app.add_flag("--fp8-only", opt.fp8_only, "run the FP8 against bf16 benchmark alone");
  Fp8BenchOptions& f8 = opt.fp8;
  for (const auto& [flag, v, help] :
       {std::tuple{"--fp8-tokens", &f8.tokens, "fp8: tokens (micro-batch x sequence)"},
        {"--fp8-hidden", &f8.hidden, "fp8: the model width d"},
        {"--fp8-heads", &f8.heads, "fp8: query heads"},
        {"--fp8-kv-heads", &f8.kv_heads, "fp8: key/value heads"},
        {"--fp8-head-dim", &f8.head_dim, "fp8: each head's width"},
        {"--fp8-ffn", &f8.ffn, "fp8: SwiGLU's width"}}) {
    app.add_option(flag, *v, help);
  }
  std::string fp8_scaling = "current";
  app.add_option("--fp8-scaling", fp8_scaling, "fp8: current or delayed scaling")
      ->check(CLI::IsMember({"current", "delayed"}));
  app.add_option("--device", opt.device, "CUDA device index");
  CLI11_PARSE(app, argc, argv);
  ex.json = opt.json;
  ex.iters = opt.iters;
  ew.json = opt.json;
  ew.iters = opt.iters;
  f8.json = opt.json;
  f8.iters = opt.iters;
  f8.scaling = nn::parse_fp8_scaling(fp8_scaling);
  if (opt.fp8_only && (opt.skip_fp8 || opt.experts_only || opt.elementwise_only)) {
    std::fprintf(stderr,
                 "09_op_bench: --fp8-only contradicts --skip-fp8, --experts-only and "
                 "--elementwise-only\n");
    return 1;
  }
  if (opt.elementwise_only && (opt.skip_elementwise || opt.experts_only)) {
    std::fprintf(stderr,
                 "09_op_bench: --elementwise-only contradicts --skip-elementwise and "
                 "--experts-only\n");
    return 1;
  }
  try {
    check_elementwise_options(ew);
    check_fp8_options(f8);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "09_op_bench: %s\n", e.what());
    return 1;
  }
  if (!ex.rows.empty()) {
    if (experts_count->count() > 0 && static_cast<std::size_t>(ex.experts) != ex.rows.size()) {
      std::fprintf(stderr, "09_op_bench: --experts-count %d but --expert-rows has %zu values\n",
                   ex.experts, ex.rows.size());
      return 1;
    }
    if (ex.skew != 0.0) {
      std::fprintf(stderr,
                   "09_op_bench: --expert-skew splits the default rows; it does not "
                   "apply with --expert-rows\n");
      return 1;
    }
    ex.experts = static_cast<int>(ex.rows.size());
  }
  if (opt.experts_only && opt.skip_experts) {
    std::fprintf(stderr, "09_op_bench: --experts-only and --skip-experts contradict\n");
    return 1;
  }
  try {
    if (!cuda_available()) {
      std::fprintf(stderr,
                   "09_op_bench needs a CUDA GPU (every mode runs on one); none is visible\n");
      return 1;
    }
    const Device gpu = Device::cuda(opt.device);
    set_current_device(gpu);
    const Stream s = Stream::create(gpu);
    const bool all = !opt.experts_only && !opt.elementwise_only && !opt.fp8_only;
    if (!opt.skip_linear && all) bench_linear(opt, s);
    if (!opt.skip_attention && all) bench_attention(opt, s);
    if (!opt.skip_experts && !opt.elementwise_only && !opt.fp8_only) {
      bench_experts(opt.experts, s);
    }
    if (opt.cp_split > 0 && all) bench_cp_split(opt, s);
    if (!opt.skip_elementwise && !opt.experts_only && !opt.fp8_only) bench_elementwise(ew, s);
    if (!opt.skip_fp8 && !opt.experts_only && !opt.elementwise_only) bench_fp8(f8, s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "09_op_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
