// Attention through cuDNN (AttentionKernel::cudnn, lib/nn/cudnn/attention_cudnn.cpp) against the
// CPU op: forward (out, log-sum-exp) and backward (dq, dk, dv) in bf16, causal and full, head_dim
// 64 and 128, odd lengths and diagonal offsets, and a GPT-sized block; the block form ring
// attention uses (query block x key block with offsets, merged with the log-sum-exp); and calls
// cuDNN does not take (head_dim 40, f32, a causal block whose first queries see no key), which
// `automatic` runs on our own kernels and an explicit `cudnn` rejects; the heads of a fused qkv
// projection read and written in place. Without cuDNN in the build, `cudnn` must be rejected.
#include <cmath>
#include <limits>
#include <vector>

#include "gpu/nn_gpu_compare.hpp"
#include "quintet/core/config.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {

struct Case {
  std::int64_t b, h, sq, sk, d;
  bool causal;
  std::int64_t q_offset, k_offset;
};

nn::AttentionOptions options_of(const Case& c, nn::AttentionKernel kernel) {
  nn::AttentionOptions o;
  o.causal = c.causal;
  o.q_offset = c.q_offset;
  o.k_offset = c.k_offset;
  o.kernel = kernel;
  return o;
}

// Forward and backward of one case with `kernel` on the GPU against the CPU op.
void check_against_cpu(const Case& c, DType t, nn::AttentionKernel kernel, std::uint64_t& seed,
                       const Stream& s) {
  const Stream cpu;
  INFO("dtype " << dtype_name(t) << " B " << c.b << " H " << c.h << " Sq " << c.sq << " Sk " << c.sk
                << " D " << c.d << " causal " << c.causal << " offsets " << c.q_offset << "/"
                << c.k_offset);
  const Input q = random_input({c.b, c.h, c.sq, c.d}, ++seed, t, s);
  const Input k = random_input({c.b, c.h, c.sk, c.d}, ++seed, t, s);
  const Input v = random_input({c.b, c.h, c.sk, c.d}, ++seed, t, s);
  const Input dout = random_input({c.b, c.h, c.sq, c.d}, ++seed, t, s);
  const nn::AttentionOptions o = options_of(c, kernel);
  const nn::AttentionOutput r = nn::attention_forward(q.gpu, k.gpu, v.gpu, o, s);
  const nn::AttentionOutput r_ref = nn::attention_forward(q.cpu, k.cpu, v.cpu, o, cpu);
  CHECK_CLOSE(r.out, r_ref.out, s, t);
  const double lerr = lse_err(r.lse, r_ref.lse, s);
  INFO("lse relative error " << lerr);
  CHECK(lerr < tolerance(t));
  const nn::AttentionGrads g =
      nn::attention_backward(dout.gpu, q.gpu, k.gpu, v.gpu, r.out, r.lse, o, s);
  const nn::AttentionGrads g_ref =
      nn::attention_backward(dout.cpu, q.cpu, k.cpu, v.cpu, r_ref.out, r_ref.lse, o, cpu);
  CHECK_CLOSE(g.dq, g_ref.dq, s, t);
  CHECK_CLOSE(g.dk, g_ref.dk, s, t);
  CHECK_CLOSE(g.dv, g_ref.dv, s, t);
}

}  // namespace

#if QUINTET_HAS_CUDNN

TEST_CASE("attention through cuDNN equals the CPU's: masks, head dims, odd lengths, offsets") {
  const Stream s = Stream::create(Device::cuda(0));
  const Case cases[] = {
      {2, 3, 128, 128, 64, true, 0, 0},
      {1, 2, 77, 77, 64, true, 0, 0},
      {1, 2, 130, 130, 128, true, 0, 0},
      {2, 2, 77, 77, 128, false, 0, 0},
      {1, 3, 130, 77, 64, false, 5, 3},
      {1, 2, 512, 512, 128, true, 0, 0},
      // Causal blocks off the diagonal: key j visible to query i iff j <= i + q_offset - k_offset.
      {1, 2, 60, 100, 64, true, 40, 0},
      {2, 1, 96, 160, 128, true, 160, 100},
      {1, 2, 77, 130, 64, true, 300, 250},
      // Every query sees every key: the causal block is a full one.
      {1, 2, 100, 60, 128, true, 70, 0},
      // GPT size (a 1024-token causal block of 4 heads of 64), against the CPU op computing in
      // f32 there too, not only against our own GPU kernels.
      {2, 4, 1024, 1024, 64, true, 0, 0},
  };
  std::uint64_t seed = 5000;
  for (const Case& c : cases)
    check_against_cpu(c, DType::bf16, nn::AttentionKernel::cudnn, seed, s);
}

TEST_CASE("ring-style attention blocks through cuDNN merge to slices of the full attention") {
  const Stream s = Stream::create(Device::cuda(0));
  const std::int64_t B = 1, H = 2, S = 130, D = 64;
  struct Block {
    std::int64_t start, len;
  };
  const Block blocks[] = {{0, 64}, {64, 66}};
  const DType t = DType::bf16;
  std::uint64_t seed = 6000;
  for (const bool causal : {true, false}) {
    INFO("causal " << causal);
    const Input q = random_input({B, H, S, D}, ++seed, t, s);
    const Input k = random_input({B, H, S, D}, ++seed, t, s);
    const Input v = random_input({B, H, S, D}, ++seed, t, s);
    const Input dout = random_input({B, H, S, D}, ++seed, t, s);
    nn::AttentionOptions full;
    full.causal = causal;
    full.kernel = nn::AttentionKernel::gemm;  // the reference: our own kernels on the whole
    const nn::AttentionOutput f = nn::attention_forward(q.gpu, k.gpu, v.gpu, full, s);
    const nn::AttentionGrads fg =
        nn::attention_backward(dout.gpu, q.gpu, k.gpu, v.gpu, f.out, f.lse, full, s);
    std::vector<Tensor> dk_sum(2), dv_sum(2);
    for (const Block& qb : blocks) {
      Tensor lse_acc, out_acc, dq_sum;  // merged on the GPU in f32 by the log-sum-exp
      std::vector<double> m_out, m_lse;
      for (int kbi = 0; kbi < 2; ++kbi) {
        const Block& kb = blocks[kbi];
        if (causal && kb.start > qb.start + qb.len - 1) continue;  // no query sees these keys
        nn::AttentionOptions o = full;
        o.q_offset = qb.start;
        o.k_offset = kb.start;
        o.kernel = nn::AttentionKernel::cudnn;
        const Tensor qs = q.gpu.narrow(2, qb.start, qb.len);
        const Tensor ks = k.gpu.narrow(2, kb.start, kb.len);
        const Tensor vs = v.gpu.narrow(2, kb.start, kb.len);
        const nn::AttentionOutput r = nn::attention_forward(qs, ks, vs, o, s);
        const std::vector<double> out_b = values(r.out, s), lse_b = values(r.lse, s);
        if (m_lse.empty()) {
          m_out = out_b;
          m_lse = lse_b;
        } else {
          for (std::size_t row = 0; row < m_lse.size(); ++row) {
            const double a = m_lse[row], bl = lse_b[row], mx = std::max(a, bl);
            const double l = mx + std::log(std::exp(a - mx) + std::exp(bl - mx));
            for (std::int64_t col = 0; col < D; ++col) {
              double& x = m_out[row * D + col];
              x = std::exp(a - l) * x + std::exp(bl - l) * out_b[row * D + col];
            }
            m_lse[row] = l;
          }
        }
        const nn::AttentionGrads g = nn::attention_backward(
            dout.gpu.narrow(2, qb.start, qb.len), qs, ks, vs, f.out.narrow(2, qb.start, qb.len),
            f.lse.narrow(2, qb.start, qb.len), o, s);
        const Tensor dq32 = nn::cast(g.dq, DType::f32, s);
        const Tensor dk32 = nn::cast(g.dk, DType::f32, s);
        const Tensor dv32 = nn::cast(g.dv, DType::f32, s);
        dq_sum = dq_sum.defined() ? nn::add(dq_sum, dq32, s) : dq32.clone(s);
        dk_sum[kbi] = dk_sum[kbi].defined() ? nn::add(dk_sum[kbi], dk32, s) : dk32.clone(s);
        dv_sum[kbi] = dv_sum[kbi].defined() ? nn::add(dv_sum[kbi], dv32, s) : dv32.clone(s);
      }
      check_close(m_out, values(f.out.narrow(2, qb.start, qb.len).contiguous(s), s), t);
      check_close(m_lse, values(f.lse.narrow(2, qb.start, qb.len).contiguous(s), s), t);
      check_close(values(dq_sum, s), values(fg.dq.narrow(2, qb.start, qb.len).contiguous(s), s), t);
    }
    for (int kbi = 0; kbi < 2; ++kbi) {
      const Block& kb = blocks[kbi];
      check_close(values(dk_sum[kbi], s),
                  values(fg.dk.narrow(2, kb.start, kb.len).contiguous(s), s), t);
      check_close(values(dv_sum[kbi], s),
                  values(fg.dv.narrow(2, kb.start, kb.len).contiguous(s), s), t);
    }
  }
}

TEST_CASE("attention over a fused qkv reads and writes the heads in place through cuDNN") {
  // q, k, v as [B, H, S, D] views of one [B, S, 3, H, D] projection, the output and the gradients
  // written as views too: kernel = cudnn proves cuDNN took the strides (it would throw, not fall
  // back); against the CPU op on contiguous heads. A fallback kernel (gemm) on the same views
  // goes through copies and agrees too.
  const Stream s = Stream::create(Device::cuda(0));
  const Stream cpu;
  std::uint64_t seed = 9500;
  for (const std::int64_t d : {64, 128}) {
    for (const std::int64_t seq : {77, 256}) {
      for (const nn::AttentionKernel kernel :
           {nn::AttentionKernel::cudnn, nn::AttentionKernel::gemm}) {
        const std::int64_t b = 2, h = 3;
        INFO("head_dim " << d << " seq " << seq << " kernel " << static_cast<int>(kernel));
        const Input qkv = random_input({b, seq, 3, h, d}, ++seed, DType::bf16, s);
        const Input dout = random_input({b, seq, h, d}, ++seed, DType::bf16, s);
        nn::AttentionOptions o;
        o.kernel = kernel;
        const nn::FusedQkvAttention r = nn::fused_qkv_attention_forward(qkv.gpu, o, s);
        const nn::FusedQkvAttention r_ref = nn::fused_qkv_attention_forward(qkv.cpu, o, cpu);
        CHECK_CLOSE(r.out, r_ref.out, s, DType::bf16);
        CHECK(lse_err(r.lse, r_ref.lse, s) < tolerance(DType::bf16));
        const Tensor g = nn::fused_qkv_attention_backward(dout.gpu, qkv.gpu, r.out, r.lse, o, s);
        const Tensor g_ref =
            nn::fused_qkv_attention_backward(dout.cpu, qkv.cpu, r_ref.out, r_ref.lse, o, cpu);
        for (int i = 0; i < 3; ++i) {
          INFO("gradient of head group " << i);
          CHECK_CLOSE(nn::fused_qkv_heads(g, i).contiguous(s),
                      nn::fused_qkv_heads(g_ref, i).contiguous(), s, DType::bf16);
        }
        // The CPU's fused form is the split-head op on copies: the same numbers.
        const nn::AttentionOutput split =
            nn::attention_forward(nn::fused_qkv_heads(qkv.cpu, 0).contiguous(),
                                  nn::fused_qkv_heads(qkv.cpu, 1).contiguous(),
                                  nn::fused_qkv_heads(qkv.cpu, 2).contiguous(), o, cpu);
        CHECK(split.out.to_vector<double>() ==
              r_ref.out.transpose(1, 2).contiguous().to_vector<double>());
      }
    }
  }
}

TEST_CASE("attention calls cuDNN does not take fall back under automatic and stay right") {
  const Stream s = Stream::create(Device::cuda(0));
  struct Unsupported {
    Case c;
    DType t;
    const char* why;
  };
  const Unsupported cases[] = {
      {{1, 2, 77, 77, 40, true, 0, 0}, DType::bf16, "head_dim 40"},
      {{1, 2, 77, 77, 64, true, 0, 0}, DType::f32, "dtype f32"},
      // The first 30 queries see no key: their lse is -inf, which cuDNN's softmax cannot give.
      {{1, 2, 60, 90, 64, true, 0, 30}, DType::bf16, "q_offset 0 < k_offset 30"},
  };
  std::uint64_t seed = 7000;
  for (const Unsupported& u : cases) {
    INFO(u.why);
    check_against_cpu(u.c, u.t, nn::AttentionKernel::automatic, seed, s);
    const Tensor q = Tensor::randn({u.c.b, u.c.h, u.c.sq, u.c.d}, ++seed, u.t, s.device());
    const Tensor k = Tensor::randn({u.c.b, u.c.h, u.c.sk, u.c.d}, ++seed, u.t, s.device());
    Stream::default_stream(s.device()).synchronize();  // drawn on the default stream
    REQUIRE_THROWS_QUINTET(
        nn::attention_forward(q, k, k, options_of(u.c, nn::AttentionKernel::cudnn), s),
        InvalidArgument, u.why);
  }
}

TEST_CASE("automatic attention takes cuDNN for bf16 head_dim 64 and 128") {
  const Stream s = Stream::create(Device::cuda(0));
  std::uint64_t seed = 8000;
  for (const std::int64_t d : {64, 128}) {
    const Shape shape{2, 2, 200, d};
    const Tensor q = Tensor::randn(shape, ++seed, DType::bf16, s.device());
    const Tensor k = Tensor::randn(shape, ++seed, DType::bf16, s.device());
    const Tensor v = Tensor::randn(shape, ++seed, DType::bf16, s.device());
    Stream::default_stream(s.device()).synchronize();  // drawn on the default stream
    nn::AttentionOptions oc;
    oc.kernel = nn::AttentionKernel::cudnn;
    const nn::AttentionOutput ra = nn::attention_forward(q, k, v, {}, s);
    const nn::AttentionOutput rc = nn::attention_forward(q, k, v, oc, s);
    CHECK(values(ra.out, s) == values(rc.out, s));
    CHECK(values(ra.lse, s) == values(rc.lse, s));
  }
}

#else  // !QUINTET_HAS_CUDNN

TEST_CASE("without cuDNN, kernel = cudnn is rejected and automatic still runs") {
  const Stream s = Stream::create(Device::cuda(0));
  std::uint64_t seed = 9000;
  const Case c{1, 2, 77, 77, 64, true, 0, 0};
  check_against_cpu(c, DType::bf16, nn::AttentionKernel::automatic, seed, s);
  const Tensor q = Tensor::randn({1, 2, 77, 64}, ++seed, DType::bf16, s.device());
  Stream::default_stream(s.device()).synchronize();  // drawn on the default stream
  REQUIRE_THROWS_QUINTET(
      nn::attention_forward(q, q, q, options_of(c, nn::AttentionKernel::cudnn), s), InvalidArgument,
      "no cuDNN");
}

#endif
