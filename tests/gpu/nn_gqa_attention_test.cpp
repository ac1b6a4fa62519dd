// Grouped-query attention on the GPU (k, v with Hkv < H heads, MQA at Hkv = 1) against the CPU
// op: forward (out, log-sum-exp) and backward (dq, and dk, dv summed over each group) on every
// CUDA path — the tensor-core GEMM path, the SIMT kernel, and cuDNN (bf16, head_dim 64/128; an
// explicit `cudnn` must run these calls where the build has cuDNN) — causal with offsets, odd
// lengths, long enough for the GEMM path to split causal queries into blocks; and the q, k, v of
// a fused [B, S, H + 2 Hkv, D] projection read in place.
#include <vector>

#include "gpu/nn_gpu_compare.hpp"
#include "quintet/core/config.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {

struct Case {
  std::int64_t b, h, hkv, sq, sk, d;
  bool causal;
  std::int64_t q_offset, k_offset;
};

const char* kernel_name(nn::AttentionKernel k) {
  switch (k) {
    case nn::AttentionKernel::gemm:
      return "gemm";
    case nn::AttentionKernel::simt:
      return "simt";
    case nn::AttentionKernel::cudnn:
      return "cudnn";
    case nn::AttentionKernel::automatic:
      break;
  }
  return "automatic";
}

// q [B, H, Sq, D], k, v [B, Hkv, Sk, D] given as views (any strides) or contiguous tensors.
struct Operands {
  Tensor q, k, v;
};

void check_case(const Case& c, DType t, nn::AttentionKernel kernel, const Operands& gpu,
                const Operands& cpu_in, std::uint64_t& seed, const Stream& s) {
  const Stream cpu;
  INFO("kernel " << kernel_name(kernel) << " dtype " << dtype_name(t) << " B " << c.b << " H "
                 << c.h << " Hkv " << c.hkv << " Sq " << c.sq << " Sk " << c.sk << " D " << c.d
                 << " causal " << c.causal << " offsets " << c.q_offset << "/" << c.k_offset);
  const Input dout = random_input({c.b, c.h, c.sq, c.d}, ++seed, t, s);
  nn::AttentionOptions o;
  o.causal = c.causal;
  o.q_offset = c.q_offset;
  o.k_offset = c.k_offset;
  o.kernel = kernel;
  const nn::AttentionOutput r = nn::attention_forward(gpu.q, gpu.k, gpu.v, o, s);
  const nn::AttentionOutput r_ref = nn::attention_forward(cpu_in.q, cpu_in.k, cpu_in.v, o, cpu);
  CHECK_CLOSE(r.out, r_ref.out, s, t);
  const double lerr = lse_err(r.lse, r_ref.lse, s);
  INFO("lse relative error " << lerr);
  CHECK(lerr < tolerance(t));
  const nn::AttentionGrads g =
      nn::attention_backward(dout.gpu, gpu.q, gpu.k, gpu.v, r.out, r.lse, o, s);
  const nn::AttentionGrads g_ref =
      nn::attention_backward(dout.cpu, cpu_in.q, cpu_in.k, cpu_in.v, r_ref.out, r_ref.lse, o, cpu);
  CHECK(g.dk.shape() == Shape{c.b, c.hkv, c.sk, c.d});
  CHECK_CLOSE(g.dq, g_ref.dq, s, t);
  CHECK_CLOSE(g.dk, g_ref.dk, s, t);
  CHECK_CLOSE(g.dv, g_ref.dv, s, t);
}

void check_contiguous(const Case& c, DType t, nn::AttentionKernel kernel, std::uint64_t& seed,
                      const Stream& s) {
  const Input q = random_input({c.b, c.h, c.sq, c.d}, ++seed, t, s);
  const Input k = random_input({c.b, c.hkv, c.sk, c.d}, ++seed, t, s);
  const Input v = random_input({c.b, c.hkv, c.sk, c.d}, ++seed, t, s);
  check_case(c, t, kernel, {q.gpu, k.gpu, v.gpu}, {q.cpu, k.cpu, v.cpu}, seed, s);
}

}  // namespace

TEST_CASE("grouped-query attention on the GEMM and SIMT paths equals the CPU's") {
  const Stream s = Stream::create(Device::cuda(0));
  const Case cases[] = {
      {2, 4, 2, 37, 37, 16, true, 0, 0},    {1, 6, 1, 45, 70, 40, true, 25, 0},  // MQA
      {2, 8, 2, 33, 33, 64, false, 0, 0},   {1, 4, 2, 40, 50, 24, true, 0, 10},
      {1, 6, 3, 70, 20, 8, true, 100, 130},  // no key seen
      {1, 4, 1, 600, 600, 64, true, 0, 0},  {2, 4, 2, 600, 300, 32, true, 0, 300},
  };
  std::uint64_t seed = 100;
  for (const nn::AttentionKernel kernel : {nn::AttentionKernel::gemm, nn::AttentionKernel::simt})
    for (const DType t : {DType::f32, DType::bf16})
      for (const Case& c : cases) check_contiguous(c, t, kernel, seed, s);
}

TEST_CASE("grouped-query attention through cuDNN or automatic equals the CPU's") {
  const Stream s = Stream::create(Device::cuda(0));
  const Case cases[] = {
      {2, 8, 2, 128, 128, 64, true, 0, 0},
      {1, 4, 1, 77, 77, 128, true, 0, 0},
      {1, 6, 2, 130, 77, 64, false, 5, 3},
      {2, 4, 2, 60, 100, 128, true, 40, 0},
  };
  std::uint64_t seed = 300;
#if QUINTET_HAS_CUDNN
  const nn::AttentionKernel kernel = nn::AttentionKernel::cudnn;  // must not fall back
#else
  const nn::AttentionKernel kernel = nn::AttentionKernel::automatic;
#endif
  for (const Case& c : cases) check_contiguous(c, DType::bf16, kernel, seed, s);
}

TEST_CASE("grouped-query attention reads q, k, v of a fused projection in place") {
  const Stream s = Stream::create(Device::cuda(0));
  const Stream cpu;
  const std::int64_t B = 2, S = 77, H = 8, Hkv = 2, D = 64;
  const DType t = DType::bf16;
  const Input qkv = random_input({B, S, H + 2 * Hkv, D}, 900, t, s);
  // [B, S, heads, D] -> [B, heads, S, D] views of the q, k and v head ranges.
  auto heads = [&](const Tensor& x, std::int64_t first, std::int64_t n) {
    return x.narrow(2, first, n).transpose(1, 2);
  };
  const Operands gpu{heads(qkv.gpu, 0, H), heads(qkv.gpu, H, Hkv), heads(qkv.gpu, H + Hkv, Hkv)};
  const Operands cpu_in{heads(qkv.cpu, 0, H).contiguous(), heads(qkv.cpu, H, Hkv).contiguous(),
                        heads(qkv.cpu, H + Hkv, Hkv).contiguous()};
  std::uint64_t seed = 950;
  for (const nn::AttentionKernel kernel :
       {nn::AttentionKernel::automatic, nn::AttentionKernel::gemm}) {
    check_case({B, H, Hkv, S, S, D, true, 0, 0}, t, kernel, gpu, cpu_in, seed, s);
  }
}
