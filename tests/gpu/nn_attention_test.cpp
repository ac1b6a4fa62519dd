// Attention on the GPU: forward (out, log-sum-exp) and backward against the CPU op on odd shapes,
// offsets and both masks; the block/offset form (one query block x one key block at a time,
// merged with the log-sum-exp) against slicing the full attention; a GPT-sized causal block (the
// GEMM path against the CPU, the SIMT path against the GEMM path); bad inputs. Every comparison
// runs both CUDA implementations: the tensor-core GEMM path and the SIMT flash-style kernel.
#include <cmath>
#include <limits>
#include <vector>

#include "gpu/nn_gpu_compare.hpp"
#include "quintet/core/config.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {
const DType kDTypes[] = {DType::f32, DType::bf16};
const nn::AttentionKernel kKernels[] = {nn::AttentionKernel::gemm, nn::AttentionKernel::simt};
const char* kernel_name(nn::AttentionKernel k) {
  return k == nn::AttentionKernel::gemm ? "gemm" : "simt";
}
}  // namespace

TEST_CASE("attention forward and backward on the GPU equal the CPU's") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  struct Case {
    std::int64_t b, h, sq, sk, d;
    bool causal;
    std::int64_t q_offset, k_offset;
    float scale;
  };
  const Case cases[] = {
      {1, 1, 1, 1, 1, true, 0, 0, 0.0f},
      {2, 3, 37, 37, 17, true, 0, 0, 0.0f},
      {1, 2, 100, 100, 64, true, 0, 0, 0.0f},
      {1, 1, 65, 65, 128, false, 0, 0, 0.0f},
      {1, 2, 33, 33, 256, true, 0, 0, 0.0f},
      {2, 1, 45, 70, 40, true, 25, 0, 0.0f},
      {1, 2, 40, 50, 24, true, 0, 10, 0.3f},
      {1, 1, 31, 47, 96, false, 5, 3, 0.0f},
      {1, 1, 70, 20, 8, true, 100, 130, 0.0f},
      // Long enough for the GEMM path to split the causal queries into blocks (one of which,
      // with k_offset 300, sees no key at all).
      {1, 2, 600, 600, 64, true, 0, 0, 0.0f},
      {2, 1, 600, 300, 32, true, 0, 300, 0.0f},
      {1, 1, 520, 700, 48, true, 180, 0, 0.0f},
  };
  std::uint64_t seed = 1000;
  for (const nn::AttentionKernel kernel : kKernels) {
    for (const DType t : kDTypes) {
      for (const Case& c : cases) {
        INFO("kernel " << kernel_name(kernel) << " dtype " << dtype_name(t) << " B " << c.b << " H "
                       << c.h << " Sq " << c.sq << " Sk " << c.sk << " D " << c.d << " causal "
                       << c.causal << " offsets " << c.q_offset << "/" << c.k_offset);
        const Input q = random_input({c.b, c.h, c.sq, c.d}, ++seed, t, s);
        const Input k = random_input({c.b, c.h, c.sk, c.d}, ++seed, t, s);
        const Input v = random_input({c.b, c.h, c.sk, c.d}, ++seed, t, s);
        const Input dout = random_input({c.b, c.h, c.sq, c.d}, ++seed, t, s);
        nn::AttentionOptions o;
        o.causal = c.causal;
        o.q_offset = c.q_offset;
        o.k_offset = c.k_offset;
        o.scale = c.scale;
        o.kernel = kernel;
        const nn::AttentionOutput r = nn::attention_forward(q.gpu, k.gpu, v.gpu, o, s);
        const nn::AttentionOutput r_ref = nn::attention_forward(q.cpu, k.cpu, v.cpu, o, cpu);
        CHECK(r.out.shape() == q.gpu.shape());
        CHECK(r.lse.shape() == Shape{c.b, c.h, c.sq});
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
    }
  }
}

namespace {

// out/lse of one (query block) merged over key blocks, on the host: lse = log sum_b exp(lse_b),
// out = sum_b exp(lse_b - lse) out_b. Rows that see no key in any block stay -inf / 0.
struct Merged {
  std::vector<double> out, lse;
};
void merge_into(Merged& m, const std::vector<double>& out_b, const std::vector<double>& lse_b,
                std::int64_t d) {
  if (m.lse.empty()) {
    m.out = out_b;
    m.lse = lse_b;
    return;
  }
  const double ninf = -std::numeric_limits<double>::infinity();
  for (std::size_t row = 0; row < m.lse.size(); ++row) {
    const double a = m.lse[row], b = lse_b[row];
    if (b == ninf) continue;
    const double mx = std::max(a, b);
    const double l = mx + std::log(std::exp(a - mx) + std::exp(b - mx));
    const double wa = a == ninf ? 0.0 : std::exp(a - l), wb = std::exp(b - l);
    for (std::int64_t c = 0; c < d; ++c) {
      double& o = m.out[row * d + c];
      o = wa * o + wb * out_b[row * d + c];
    }
    m.lse[row] = l;
  }
}

}  // namespace

TEST_CASE("attention computed block by block with offsets equals slices of the full attention") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const std::int64_t B = 1, H = 2, S = 77, D = 24;
  struct Block {
    std::int64_t start, len;
  };
  const Block qblocks[] = {{0, 40}, {40, 37}};
  const Block kblocks[] = {{0, 30}, {30, 47}};
  std::uint64_t seed = 2000;
  for (const nn::AttentionKernel kernel : kKernels) {
    for (const DType t : kDTypes) {
      for (const bool causal : {true, false}) {
        INFO("kernel " << kernel_name(kernel) << " dtype " << dtype_name(t) << " causal "
                       << causal);
        const Input q = random_input({B, H, S, D}, ++seed, t, s);
        const Input k = random_input({B, H, S, D}, ++seed, t, s);
        const Input v = random_input({B, H, S, D}, ++seed, t, s);
        const Input dout = random_input({B, H, S, D}, ++seed, t, s);
        nn::AttentionOptions full;
        full.causal = causal;
        full.kernel = kernel;
        const nn::AttentionOutput f = nn::attention_forward(q.gpu, k.gpu, v.gpu, full, s);
        const nn::AttentionGrads fg =
            nn::attention_backward(dout.gpu, q.gpu, k.gpu, v.gpu, f.out, f.lse, full, s);

        std::vector<Tensor> dk_sum(2), dv_sum(2);
        for (const Block& qb : qblocks) {
          Merged m;
          Tensor dq_sum;
          for (int kbi = 0; kbi < 2; ++kbi) {
            const Block& kb = kblocks[kbi];
            nn::AttentionOptions o = full;
            o.q_offset = qb.start;
            o.k_offset = kb.start;
            const Tensor qs = q.gpu.narrow(2, qb.start, qb.len);
            const Tensor ks = k.gpu.narrow(2, kb.start, kb.len);
            const Tensor vs = v.gpu.narrow(2, kb.start, kb.len);
            const nn::AttentionOutput r = nn::attention_forward(qs, ks, vs, o, s);
            merge_into(m, values(r.out, s), values(r.lse, s), D);
            // Backward of one block pair with the MERGED (= full) out and lse.
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
          const Tensor out_slice = f.out.narrow(2, qb.start, qb.len).contiguous(s);
          const Tensor lse_slice = f.lse.narrow(2, qb.start, qb.len).contiguous(s);
          check_close(m.out, values(out_slice, s), t);
          // Both sides -inf on the same rows; finite rows close.
          const std::vector<double> want_lse = values(lse_slice, s);
          std::vector<double> a, b;
          for (std::size_t i = 0; i < want_lse.size(); ++i) {
            if (std::isinf(want_lse[i])) {
              CHECK(std::isinf(m.lse[i]));
            } else {
              a.push_back(m.lse[i]);
              b.push_back(want_lse[i]);
            }
          }
          check_close(a, b, t);
          check_close(values(dq_sum, s), values(fg.dq.narrow(2, qb.start, qb.len).contiguous(s), s),
                      t);
        }
        for (int kbi = 0; kbi < 2; ++kbi) {
          const Block& kb = kblocks[kbi];
          check_close(values(dk_sum[kbi], s),
                      values(fg.dk.narrow(2, kb.start, kb.len).contiguous(s), s), t);
          check_close(values(dv_sum[kbi], s),
                      values(fg.dv.narrow(2, kb.start, kb.len).contiguous(s), s), t);
        }
      }
    }
  }
}

TEST_CASE("attention_merge_ on the GPU equals the CPU's, rows that see no key included") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const std::int64_t B = 2, H = 3, S = 19, D = 40;
  for (const DType t : kDTypes) {
    INFO("dtype " << dtype_name(t));
    const Input out_a = random_input({B, H, S, D}, 31, t, s);
    const Input out_b = random_input({B, H, S, D}, 32, t, s);
    // Statistics with -inf rows on either side and on both.
    std::vector<float> la = Tensor::randn({B, H, S}, 33).to_vector<float>();
    std::vector<float> lb = Tensor::randn({B, H, S}, 34).to_vector<float>();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < la.size(); i += 5) la[i] = -inf;
    for (std::size_t i = 0; i < lb.size(); i += 3) lb[i] = -inf;
    const Tensor lse_a = Tensor::from_vector(la, {B, H, S}),
                 lse_b = Tensor::from_vector(lb, {B, H, S});
    Tensor cpu_out = out_a.cpu.clone(), cpu_lse = lse_a.clone();
    nn::attention_merge_(cpu_out, cpu_lse, out_b.cpu, lse_b, Stream());
    Tensor gpu_out = out_a.gpu.clone(s), gpu_lse = lse_a.to(gpu, s);
    nn::attention_merge_(gpu_out, gpu_lse, out_b.gpu, lse_b.to(gpu, s), s);
    check_close(values(gpu_out, s), values(cpu_out, s), t);
    const std::vector<double> got = values(gpu_lse, s), want = values(cpu_lse, s);
    std::vector<double> a, b;
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (std::isinf(want[i])) {
        CHECK(std::isinf(got[i]));
      } else {
        a.push_back(got[i]);
        b.push_back(want[i]);
      }
    }
    CHECK(rel_err(a, b) < 1e-6);
  }
}

TEST_CASE(
    "attention's GEMM path equals the CPU's, and the SIMT path the GEMM's, on a GPT-sized "
    "causal block") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const Shape shape{2, 4, 1024, 64};
  std::uint64_t seed = 3000;
  for (const DType t : kDTypes) {
    INFO("dtype " << dtype_name(t));
    const Input q = random_input(shape, ++seed, t, s);
    const Input k = random_input(shape, ++seed, t, s);
    const Input v = random_input(shape, ++seed, t, s);
    const Input dout = random_input(shape, ++seed, t, s);
    nn::AttentionOptions og, os;
    og.kernel = nn::AttentionKernel::gemm;
    os.kernel = nn::AttentionKernel::simt;
    const nn::AttentionOutput rg = nn::attention_forward(q.gpu, k.gpu, v.gpu, og, s);
    const nn::AttentionOutput rs = nn::attention_forward(q.gpu, k.gpu, v.gpu, os, s);
    // The GEMM path splits 1024 causal queries into blocks, which the small cases above do not
    // reach at head_dim 64: against the CPU op at this size too.
    const nn::AttentionOutput rc = nn::attention_forward(q.cpu, k.cpu, v.cpu, {}, cpu);
    CHECK_CLOSE(rg.out, rc.out, s, t);
    const double lerr = lse_err(rg.lse, rc.lse, s);
    INFO("GEMM path's lse relative error against the CPU " << lerr);
    CHECK(lerr < tolerance(t));
    check_close(values(rg.out, s), values(rs.out, s), t);
    check_close(values(rg.lse, s), values(rs.lse, s), t);
    // The automatic choice for head_dim 64 is the GEMM path (bit-identical to forcing it), except
    // in bf16 with cuDNN, where it is cuDNN's (nn_attention_cudnn_test checks that one).
    if (t == DType::f32 || !QUINTET_HAS_CUDNN) {
      const nn::AttentionOutput ra = nn::attention_forward(q.gpu, k.gpu, v.gpu, {}, s);
      CHECK(values(ra.out, s) == values(rg.out, s));
    }
    const nn::AttentionGrads gg =
        nn::attention_backward(dout.gpu, q.gpu, k.gpu, v.gpu, rg.out, rg.lse, og, s);
    const nn::AttentionGrads gs =
        nn::attention_backward(dout.gpu, q.gpu, k.gpu, v.gpu, rs.out, rs.lse, os, s);
    const nn::AttentionGrads gc =
        nn::attention_backward(dout.cpu, q.cpu, k.cpu, v.cpu, rc.out, rc.lse, {}, cpu);
    CHECK_CLOSE(gg.dq, gc.dq, s, t);
    CHECK_CLOSE(gg.dk, gc.dk, s, t);
    CHECK_CLOSE(gg.dv, gc.dv, s, t);
    check_close(values(gg.dq, s), values(gs.dq, s), t);
    check_close(values(gg.dk, s), values(gs.dk, s), t);
    check_close(values(gg.dv, s), values(gs.dv, s), t);
  }
}

TEST_CASE("attention on the GPU rejects bad inputs with InvalidArgument") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Tensor q = Tensor::randn({1, 2, 5, 8}, 1).to(gpu, s).to(DType::bf16, s);
  const Tensor k = Tensor::randn({1, 2, 6, 8}, 2).to(gpu, s).to(DType::bf16, s);
  nn::AttentionOptions o;
  REQUIRE_THROWS_QUINTET(nn::attention_forward(q, k.narrow(3, 0, 7), k, o, s), InvalidArgument,
                         "k has shape");
  REQUIRE_THROWS_QUINTET(nn::attention_forward(q, k, k.to(DType::f32, s), o, s), InvalidArgument,
                         "cast it");
  REQUIRE_THROWS_QUINTET(nn::attention_forward(q.view({2, 5, 8}), k, k, o, s), InvalidArgument,
                         "expected [batch, heads, seq, head_dim]");
  nn::AttentionOptions neg;
  neg.q_offset = -1;
  REQUIRE_THROWS_QUINTET(nn::attention_forward(q, k, k, neg, s), InvalidArgument, "q_offset");
  // head_dim beyond what the SIMT kernel supports (automatic picks it for 300 bf16: 600 bytes
  // is not a multiple of 16); the GEMM path takes any head_dim.
  const Tensor big = Tensor::zeros({1, 1, 3, 300}, DType::bf16, gpu);
  REQUIRE_THROWS_QUINTET(nn::attention_forward(big, big, big, o, s), InvalidArgument,
                         "head_dim up to 256");
  nn::AttentionOptions og;
  og.kernel = nn::AttentionKernel::gemm;
  const nn::AttentionOutput rb = nn::attention_forward(big, big, big, og, s);
  for (const double x : values(rb.out, s)) CHECK(x == 0.0);
  // The backward wants the forward's f32 log-sum-exp of shape [B, H, Sq].
  const nn::AttentionOutput r = nn::attention_forward(q, k, k, o, s);
  REQUIRE_THROWS_QUINTET(nn::attention_backward(q, q, k, k, r.out, r.lse.to(DType::bf16, s), o, s),
                         InvalidArgument, "lse");
  REQUIRE_THROWS_QUINTET(nn::attention_backward(q, q, k, k, r.out, r.lse.narrow(2, 0, 4), o, s),
                         InvalidArgument, "lse");
}
