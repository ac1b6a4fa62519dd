// The elementwise mode of 09_op_bench: see elementwise_bench.hpp.
#include "elementwise_bench.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"
#include "timing.hpp"

using namespace quintet;

namespace {

constexpr int kWarmup = 3;

struct Pass {
  const char* op;
  const char* pass;
  std::string shape;
  double bytes;       // the least the kernel moves (inputs read + outputs written)
  const char* moved;  // what those bytes are
  std::function<void()> fn;
};

}  // namespace

void check_elementwise_options(const ElementwiseBenchOptions& o) {
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"--ew-tokens", o.tokens},     {"--ew-seq", o.seq},
      {"--ew-hidden", o.hidden},     {"--ew-heads", o.heads},
      {"--ew-head-dim", o.head_dim}, {"--ew-ffn", o.ffn},
      {"--ew-kv-heads", o.kv_heads}, {"--ew-copy-bytes", o.copy_bytes}};
  for (const auto& [name, v] : sizes) {
    if (v <= 0) throw std::invalid_argument(std::string(name) + " must be > 0");
  }
  if (o.tokens % o.seq != 0) {
    throw std::invalid_argument("--ew-tokens " + std::to_string(o.tokens) +
                                " is not a multiple of --ew-seq " + std::to_string(o.seq));
  }
  if (o.head_dim % 2 != 0) throw std::invalid_argument("--ew-head-dim must be even (RoPE)");
  if (o.nominal_gbps <= 0) throw std::invalid_argument("--nominal-gbps must be > 0");
}

void bench_elementwise(const ElementwiseBenchOptions& opt, const Stream& s) {
  check_elementwise_options(opt);
  const Device gpu = s.device();
  // The bound: one device-to-device copy of copy_bytes, which reads and writes each byte once.
  const CopyBound copy = copy_bound(s, opt.copy_bytes, kWarmup, opt.iters);
  const double copy_ms = copy.ms, copy_gbps = copy.gbps;

  const std::int64_t T = opt.tokens, d = opt.hidden, F = opt.ffn, H = opt.heads, D = opt.head_dim,
                     B = opt.tokens / opt.seq;
  const double e16 = 2.0, e32 = 4.0;  // bytes per bf16 and f32 element
  std::uint64_t seed = 900;
  // RoPE in place, positions 0..S-1 (no positions tensor, as at cp 1), on the query heads
  // [B, S, H, D] and on the key heads: the strided [B, S, KV, D] view of the fused key/value
  // projection's output [B, S, 2, KV, D] (ParallelAttention's part(kv, 0)). Forward and backward
  // each read and write the heads: 2 * numel bf16.
  const Tensor q = Tensor::randn({B, opt.seq, H, D}, ++seed, DType::bf16, gpu);
  const Tensor kv = Tensor::randn({B, opt.seq, 2, opt.kv_heads, D}, ++seed, DType::bf16, gpu);
  const Tensor k = kv.transpose(0, 2).select(0).transpose(0, 1);
  nn::RopeOptions rope;
  rope.theta = opt.rope_theta;
  // RMSNorm with the residual add, as the block runs it (ParallelRMSNorm::forward_add).
  const Tensor x = Tensor::randn({T, d}, ++seed, DType::bf16, gpu);
  const Tensor res = Tensor::randn({T, d}, ++seed, DType::bf16, gpu);
  const Tensor gamma = Tensor::randn({d}, ++seed, DType::bf16, gpu);
  const Tensor dy_norm = Tensor::randn({T, d}, ++seed, DType::bf16, gpu);
  const Tensor dres = Tensor::randn({T, d}, ++seed, DType::bf16, gpu);
  const Tensor dgamma = Tensor::zeros({d}, DType::f32, gpu);
  // SwiGLU on the gate and up projections [T, F].
  const Tensor gate = Tensor::randn({T, F}, ++seed, DType::bf16, gpu);
  const Tensor up = Tensor::randn({T, F}, ++seed, DType::bf16, gpu);
  const Tensor dy_mlp = Tensor::randn({T, F}, ++seed, DType::bf16, gpu);
  Stream::default_stream(gpu).synchronize();  // inputs were drawn on the default stream
  const nn::NormOutput norm = nn::rmsnorm_forward(x, gamma, 1e-5f, s, res);
  s.synchronize();

  const double td = static_cast<double>(T) * d, tf = static_cast<double>(T) * F;
  const double qn = static_cast<double>(q.numel()), kn = static_cast<double>(k.numel());
  const std::string bs = std::to_string(B) + "x" + std::to_string(opt.seq) + "x";
  const std::string rope_shape = bs + std::to_string(H) + "x" + std::to_string(D);
  const std::string rope_k_shape = bs + std::to_string(opt.kv_heads) + "x" + std::to_string(D) +
                                   " of " + bs + "2x" + std::to_string(opt.kv_heads) + "x" +
                                   std::to_string(D);
  const std::string norm_shape = std::to_string(T) + "x" + std::to_string(d);
  const std::string mlp_shape = std::to_string(T) + "x" + std::to_string(F);
  const std::vector<Pass> passes = {
      {"rope_q", "forward", rope_shape, 2 * qn * e16, "x read, x written (in place)",
       [&] { nn::rope_forward_(q, Tensor(), rope, s); }},
      {"rope_q", "backward", rope_shape, 2 * qn * e16, "dy read, dy written (in place)",
       [&] { nn::rope_backward_(q, Tensor(), rope, s); }},
      {"rope_k", "forward", rope_k_shape, 2 * kn * e16, "x read, x written (in place, strided)",
       [&] { nn::rope_forward_(k, Tensor(), rope, s); }},
      {"rope_k", "backward", rope_k_shape, 2 * kn * e16, "dy read, dy written (in place, strided)",
       [&] { nn::rope_backward_(k, Tensor(), rope, s); }},
      {"rmsnorm", "forward", norm_shape, 4 * td * e16 + d * e16 + T * e32,
       "x, residual, gamma read; y, x + residual written (bf16); rstd written (f32)",
       [&] { nn::rmsnorm_forward(x, gamma, 1e-5f, s, res); }},
      {"rmsnorm", "backward", norm_shape, 4 * td * e16 + d * e16 + T * e32 + 2 * d * e32,
       "dy, x + residual, dresidual, gamma, rstd read; dx written; dgamma (f32) read and written",
       [&] { nn::rmsnorm_backward(dy_norm, norm.sum, gamma, norm.rstd, dgamma, s, dres); }},
      {"swiglu", "forward", mlp_shape, 3 * tf * e16, "gate, up read; y written",
       [&] { nn::swiglu_forward(gate, up, s); }},
      {"swiglu", "backward", mlp_shape, 5 * tf * e16, "dy, gate, up read; dgate, dup written",
       [&] { nn::swiglu_backward(dy_mlp, gate, up, s); }},
  };

  if (opt.json) {
    nlohmann::json j{{"bench", "elementwise"},
                     {"op", "copy"},
                     {"gpu", copy.gpu},
                     {"bytes", 2.0 * static_cast<double>(opt.copy_bytes)},
                     {"moved", "cudaMemcpyAsync device to device: each byte read and written"},
                     {"ms", copy_ms},
                     {"gbps", copy_gbps},
                     {"nominal_gbps", opt.nominal_gbps},
                     {"fraction_of_nominal", copy_gbps / opt.nominal_gbps}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\nelementwise ops, bf16, on %s; GB/s = (inputs read + outputs written) / time\n",
                copy.gpu.c_str());
    std::printf(
        "copy bound: %.1f GB/s (cudaMemcpyAsync of %lld bytes, read + write), nominal "
        "%.0f GB/s: %.3f of it\n",
        copy_gbps, static_cast<long long>(opt.copy_bytes), opt.nominal_gbps,
        copy_gbps / opt.nominal_gbps);
    std::printf("%-8s %-9s %-24s %10s %10s %9s %9s\n", "op", "pass", "shape", "ms", "GB/s",
                "of copy", "of nom.");
  }
  for (const Pass& p : passes) {
    const double ms = median_ms(s, kWarmup, opt.iters, p.fn);
    const double gbps = p.bytes / ms * 1e-6;
    if (opt.json) {
      nlohmann::json j{{"bench", "elementwise"},
                       {"op", p.op},
                       {"pass", p.pass},
                       {"dtype", "bf16"},
                       {"shape", p.shape},
                       {"bytes", p.bytes},
                       {"moved", p.moved},
                       {"ms", ms},
                       {"gbps", gbps},
                       {"copy_gbps", copy_gbps},
                       {"fraction_of_copy", gbps / copy_gbps},
                       {"nominal_gbps", opt.nominal_gbps},
                       {"fraction_of_nominal", gbps / opt.nominal_gbps}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-8s %-9s %-24s %10.4f %10.1f %9.3f %9.3f\n", p.op, p.pass, p.shape.c_str(), ms,
                  gbps, gbps / copy_gbps, gbps / opt.nominal_gbps);
    }
    std::fflush(stdout);
  }
}
