// CPU nn ops: forward against direct f64 loops, backward against central finite differences in
// f64 (h = 1e-5; tolerance 1e-6 relative), f32 against f64.
#include <cmath>
#include <limits>
#include <vector>

#include "quintet/nn/ops.hpp"
#include "quintet/nn/vocab_parallel_ops.hpp"
#include "support/catch.hpp"
#include "unit/nn_gradcheck.hpp"

using namespace quintet;
using namespace quintet::nn;
using nn_test::dot;
using nn_test::numeric_grad;
using nn_test::randn64;
using nn_test::require_close;

namespace {
const Stream kCpu;
constexpr double kFdTol = 1e-6;  // f64 analytic vs central differences
}  // namespace

TEST_CASE("linear forward and backward", "[nn][ops]") {
  Tensor x = randn64({2, 3, 5}, 1), w = randn64({4, 5}, 2), b = randn64({4}, 3);
  const Tensor r = randn64({2, 3, 4}, 4);
  const Tensor y = linear_forward(x, w, b, kCpu);
  REQUIRE(y.shape() == Shape{2, 3, 4});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int o = 0; o < 4; ++o) {
        double s = b.at<double>({o});
        for (int k = 0; k < 5; ++k) s += x.at<double>({i, j, k}) * w.at<double>({o, k});
        REQUIRE(y.at<double>({i, j, o}) == Approx(s).epsilon(1e-12));
      }
  Tensor dw = Tensor::zeros({4, 5}, DType::f64), db = Tensor::zeros({4}, DType::f64);
  const Tensor dx = linear_backward(r, x, w, dw, db, kCpu);
  auto loss = [&] { return dot(linear_forward(x, w, b, kCpu), r); };
  require_close(dx, numeric_grad(loss, x), kFdTol, "dx");
  require_close(dw, numeric_grad(loss, w), kFdTol, "dw");
  require_close(db, numeric_grad(loss, b), kFdTol, "db");
  // Weight gradients accumulate: a second backward doubles them.
  const Tensor dw1 = dw.clone();
  linear_backward_weight(r, x, dw, db, kCpu);
  for (std::int64_t i = 0; i < dw.numel(); ++i)
    REQUIRE(dw.data<double>()[i] == Approx(2 * dw1.data<double>()[i]).epsilon(1e-12));
  // No bias; strided x (a transposed view).
  const Tensor xt = randn64({5, 3}, 5).transpose(0, 1);
  const Tensor y2 = linear_forward(xt, w, Tensor(), kCpu);
  const Tensor y3 = linear_forward(xt.contiguous(), w, Tensor(), kCpu);
  require_close(y2, y3, 0.0, "strided input");
}

TEST_CASE("layernorm and rmsnorm backward", "[nn][ops]") {
  Tensor x = randn64({3, 7}, 11), g = randn64({7}, 12), be = randn64({7}, 13);
  const Tensor r = randn64({3, 7}, 14);
  SECTION("layernorm") {
    const NormOutput o = layernorm_forward(x, g, be, 1e-5f, kCpu);
    for (int i = 0; i < 3; ++i) {  // the normalised row has mean 0, variance 1 (before gamma)
      double mu = 0, var = 0;
      for (int j = 0; j < 7; ++j) mu += x.at<double>({i, j}) / 7;
      for (int j = 0; j < 7; ++j) var += std::pow(x.at<double>({i, j}) - mu, 2) / 7;
      REQUIRE(o.mean.at<double>({i}) == Approx(mu).epsilon(1e-12));
      REQUIRE(o.rstd.at<double>({i}) == Approx(1 / std::sqrt(var + 1e-5)).epsilon(1e-6));
    }
    Tensor dg = Tensor::zeros({7}, DType::f64), db = Tensor::zeros({7}, DType::f64);
    const Tensor dx = layernorm_backward(r, x, g, o.mean, o.rstd, dg, db, kCpu);
    auto loss = [&] { return dot(layernorm_forward(x, g, be, 1e-5f, kCpu).y, r); };
    require_close(dx, numeric_grad(loss, x), kFdTol, "dx");
    require_close(dg, numeric_grad(loss, g), kFdTol, "dgamma");
    require_close(db, numeric_grad(loss, be), kFdTol, "dbeta");
  }
  SECTION("rmsnorm") {
    const NormOutput o = rmsnorm_forward(x, g, 1e-5f, kCpu);
    REQUIRE_FALSE(o.mean.defined());
    Tensor dg = Tensor::zeros({7}, DType::f64);
    const Tensor dx = rmsnorm_backward(r, x, g, o.rstd, dg, kCpu);
    auto loss = [&] { return dot(rmsnorm_forward(x, g, 1e-5f, kCpu).y, r); };
    require_close(dx, numeric_grad(loss, x), kFdTol, "dx");
    require_close(dg, numeric_grad(loss, g), kFdTol, "dgamma");
  }
}

TEST_CASE("norms with a residual equal the add and the norm one after the other", "[nn][ops]") {
  const Tensor x = randn64({2, 3, 7}, 15), res = randn64({2, 3, 7}, 16), g = randn64({7}, 17),
               be = randn64({7}, 18), dy = randn64({2, 3, 7}, 19), dres = randn64({2, 3, 7}, 20);
  const Tensor h = add(x, res, kCpu);
  const NormOutput ln = layernorm_forward(x, g, be, 1e-5f, kCpu, res);
  const NormOutput ln_ref = layernorm_forward(h, g, be, 1e-5f, kCpu);
  require_close(ln.sum, h, 0.0, "sum");
  require_close(ln.y, ln_ref.y, 0.0, "layernorm y");
  require_close(ln.rstd, ln_ref.rstd, 0.0, "layernorm rstd");
  REQUIRE_FALSE(ln_ref.sum.defined());
  Tensor dg = Tensor::zeros({7}, DType::f64), db = Tensor::zeros({7}, DType::f64);
  Tensor dg_ref = Tensor::zeros({7}, DType::f64), db_ref = Tensor::zeros({7}, DType::f64);
  const Tensor dx = layernorm_backward(dy, ln.sum, g, ln.mean, ln.rstd, dg, db, kCpu, dres);
  const Tensor dx_ref =
      add(layernorm_backward(dy, h, g, ln.mean, ln.rstd, dg_ref, db_ref, kCpu), dres, kCpu);
  require_close(dx, dx_ref, 0.0, "layernorm dx + dresidual");
  require_close(dg, dg_ref, 0.0, "layernorm dgamma");
  const NormOutput rms = rmsnorm_forward(x, g, 1e-6f, kCpu, res);
  require_close(rms.y, rmsnorm_forward(h, g, 1e-6f, kCpu).y, 0.0, "rmsnorm y");
  const Tensor rdx = rmsnorm_backward(dy, rms.sum, g, rms.rstd, Tensor(), kCpu, dres);
  require_close(rdx, add(rmsnorm_backward(dy, h, g, rms.rstd, Tensor(), kCpu), dres, kCpu), 0.0,
                "rmsnorm dx + dresidual");
  REQUIRE_THROWS_QUINTET(layernorm_forward(x, g, be, 1e-5f, kCpu, randn64({2, 3, 6}, 21)),
                         InvalidArgument, "residual");
  REQUIRE_THROWS_QUINTET(rmsnorm_backward(dy, h, g, rms.rstd, Tensor(), kCpu, res.to(DType::f32)),
                         InvalidArgument, "dresidual");
}

TEST_CASE("gelu, swiglu and softmax backward", "[nn][ops]") {
  Tensor x = randn64({4, 6}, 21, 2.0), u = randn64({4, 6}, 22);
  const Tensor r = randn64({4, 6}, 23);
  SECTION("gelu") {
    const Tensor y = gelu_forward(x, kCpu);
    const double v = x.at<double>({1, 2});
    REQUIRE(y.at<double>({1, 2}) ==
            Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))));
    auto loss = [&] { return dot(gelu_forward(x, kCpu), r); };
    require_close(gelu_backward(r, x, kCpu), numeric_grad(loss, x), kFdTol, "dx");
  }
  SECTION("swiglu") {
    const Tensor y = swiglu_forward(x, u, kCpu);
    const double a = x.at<double>({3, 5});
    REQUIRE(y.at<double>({3, 5}) == Approx(a / (1 + std::exp(-a)) * u.at<double>({3, 5})));
    const SwiGluGrads g = swiglu_backward(r, x, u, kCpu);
    auto loss = [&] { return dot(swiglu_forward(x, u, kCpu), r); };
    require_close(g.dgate, numeric_grad(loss, x), kFdTol, "dgate");
    require_close(g.dup, numeric_grad(loss, u), kFdTol, "dup");
  }
  SECTION("softmax") {
    const Tensor y = softmax_forward(x, kCpu);
    double row = 0;
    for (int j = 0; j < 6; ++j) row += y.at<double>({2, j});
    REQUIRE(row == Approx(1.0).epsilon(1e-12));
    auto loss = [&] { return dot(softmax_forward(x, kCpu), r); };
    require_close(softmax_backward(r, y, kCpu), numeric_grad(loss, x), kFdTol, "dx");
  }
}

namespace {
// Attention by direct loops in f64: out and lse, with the same masking rule as the op.
void reference_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& o, Tensor& out, Tensor& lse) {
  const auto B = q.size(0), H = q.size(1), Sq = q.size(2), Sk = k.size(2), D = q.size(3);
  // The op keeps the scale in float (AttentionOptions::scale).
  const double scale = o.scale > 0 ? o.scale : double(float(1 / std::sqrt(double(D))));
  out = Tensor::zeros(q.shape(), DType::f64);
  lse = Tensor::zeros({B, H, Sq}, DType::f64);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Sq; ++i) {
        std::vector<double> s;
        std::vector<int> keys;
        for (int j = 0; j < Sk; ++j) {
          if (o.causal && o.k_offset + j > o.q_offset + i) continue;
          double d = 0;
          for (int c = 0; c < D; ++c) d += q.at<double>({b, h, i, c}) * k.at<double>({b, h, j, c});
          s.push_back(d * scale);
          keys.push_back(j);
        }
        if (s.empty()) {
          lse.at<double>({b, h, i}) = -std::numeric_limits<double>::infinity();
          continue;
        }
        double mx = s[0], sum = 0;
        for (double z : s) mx = std::max(mx, z);
        for (double z : s) sum += std::exp(z - mx);
        lse.at<double>({b, h, i}) = mx + std::log(sum);
        for (std::size_t t = 0; t < s.size(); ++t)
          for (int c = 0; c < D; ++c)
            out.at<double>({b, h, i, c}) +=
                std::exp(s[t] - mx) / sum * v.at<double>({b, h, keys[t], c});
      }
}
}  // namespace

TEST_CASE("attention forward against loops, backward against finite differences",
          "[nn][ops][attention]") {
  Tensor q = randn64({2, 2, 5, 3}, 31), k = randn64({2, 2, 7, 3}, 32),
         v = randn64({2, 2, 7, 3}, 33);
  const Tensor r = randn64({2, 2, 5, 3}, 34);
  AttentionOptions o;
  SECTION("causal, no offsets") {}
  SECTION("causal, query block after the keys") {
    o.q_offset = 4;
    o.k_offset = 1;
  }
  SECTION("causal, some rows see no key") {
    o.q_offset = 0;
    o.k_offset = 2;
  }
  SECTION("full mask, explicit scale") {
    o.causal = false;
    o.scale = 0.3f;
  }
  const AttentionOutput a = attention_forward(q, k, v, o, kCpu);
  Tensor ref_out, ref_lse;
  reference_attention(q, k, v, o, ref_out, ref_lse);
  require_close(a.out, ref_out, 1e-12, "out");
  nn_test::require_lse_close(a.lse, ref_lse, 1e-12);
  const AttentionGrads g = attention_backward(r, q, k, v, a.out, a.lse, o, kCpu);
  auto loss = [&] { return dot(attention_forward(q, k, v, o, kCpu).out, r); };
  require_close(g.dq, numeric_grad(loss, q), kFdTol, "dq");
  require_close(g.dk, numeric_grad(loss, k), kFdTol, "dk");
  require_close(g.dv, numeric_grad(loss, v), kFdTol, "dv");
}

TEST_CASE("attention of one query block over key blocks merged by lse equals the full attention",
          "[nn][ops][attention]") {
  const std::int64_t S = 11, q0 = 3, q1 = 8, k_split = 5;  // query rows [3, 8), keys [0,5) + [5,11)
  const Tensor q = randn64({1, 2, S, 4}, 41), k = randn64({1, 2, S, 4}, 42),
               v = randn64({1, 2, S, 4}, 43);
  const Tensor dout_rows = randn64({1, 2, q1 - q0, 4}, 44);
  const AttentionOptions full;  // causal over the whole sequence
  const AttentionOutput whole = attention_forward(q, k, v, full, kCpu);
  // Full backward with the loss seeing only query rows [q0, q1).
  Tensor dout = Tensor::zeros(q.shape(), DType::f64);
  dout.narrow(2, q0, q1 - q0).copy_(dout_rows);
  const AttentionGrads gw = attention_backward(dout, q, k, v, whole.out, whole.lse, full, kCpu);

  const Tensor qb = q.narrow(2, q0, q1 - q0);
  struct Block {
    std::int64_t start, len;
    AttentionOutput o;
  };
  std::vector<Block> blocks = {{0, k_split, {}}, {k_split, S - k_split, {}}};
  for (Block& b : blocks) {
    AttentionOptions o;
    o.q_offset = q0;
    o.k_offset = b.start;
    b.o = attention_forward(qb, k.narrow(2, b.start, b.len), v.narrow(2, b.start, b.len), o, kCpu);
  }
  // Merge: lse = log(sum_b exp(lse_b)), out = sum_b exp(lse_b - lse) out_b.
  Tensor lse = Tensor::zeros({1, 2, q1 - q0}, DType::f64),
         out = Tensor::zeros(qb.shape(), DType::f64);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < q1 - q0; ++i) {
      const double a = blocks[0].o.lse.at<double>({0, h, i}),
                   b = blocks[1].o.lse.at<double>({0, h, i});
      const double m = std::max(a, b);
      const double l = std::isinf(m) ? m : m + std::log(std::exp(a - m) + std::exp(b - m));
      lse.at<double>({0, h, i}) = l;
      for (int c = 0; c < 4; ++c)
        out.at<double>({0, h, i, c}) = std::exp(a - l) * blocks[0].o.out.at<double>({0, h, i, c}) +
                                       std::exp(b - l) * blocks[1].o.out.at<double>({0, h, i, c});
    }
  require_close(out, whole.out.narrow(2, q0, q1 - q0), 1e-12, "merged out");
  require_close(lse, whole.lse.narrow(2, q0, q1 - q0), 1e-12, "merged lse");
  // Per-block backward with the merged out/lse: dq adds up, dk/dv are the full grads' slices.
  Tensor dq = Tensor::zeros(qb.shape(), DType::f64);
  for (const Block& b : blocks) {
    AttentionOptions o;
    o.q_offset = q0;
    o.k_offset = b.start;
    const AttentionGrads g = attention_backward(dout_rows, qb, k.narrow(2, b.start, b.len),
                                                v.narrow(2, b.start, b.len), out, lse, o, kCpu);
    add_(dq, g.dq, 1.0f, kCpu);
    require_close(g.dk, gw.dk.narrow(2, b.start, b.len), 1e-12, "dk block");
    require_close(g.dv, gw.dv.narrow(2, b.start, b.len), 1e-12, "dv block");
  }
  require_close(dq, gw.dq.narrow(2, q0, q1 - q0), 1e-12, "dq");
}

TEST_CASE("attention over a fused qkv equals the split-head attention, views in and out",
          "[nn][ops][attention]") {
  const std::int64_t b = 2, s = 5, h = 3, d = 4;
  const Tensor qkv = randn64({b, s, 3, h, d}, 41), dout = randn64({b, s, h, d}, 42);
  AttentionOptions o;
  const FusedQkvAttention f = fused_qkv_attention_forward(qkv, o, kCpu);
  const Tensor q = fused_qkv_heads(qkv, 0).contiguous(), k = fused_qkv_heads(qkv, 1).contiguous(),
               v = fused_qkv_heads(qkv, 2).contiguous();
  REQUIRE(q.at<double>({1, 2, 3, 1}) == qkv.at<double>({1, 3, 0, 2, 1}));
  REQUIRE(v.at<double>({0, 1, 4, 3}) == qkv.at<double>({0, 4, 2, 1, 3}));
  const AttentionOutput a = attention_forward(q, k, v, o, kCpu);
  REQUIRE(f.out.shape() == Shape{b, s, h, d});
  require_close(f.out.transpose(1, 2).contiguous(), a.out, 0.0, "out");
  require_close(f.lse, a.lse, 0.0, "lse");
  const Tensor dqkv = fused_qkv_attention_backward(dout, qkv, f.out, f.lse, o, kCpu);
  const AttentionGrads g =
      attention_backward(dout.transpose(1, 2).contiguous(), q, k, v, a.out, a.lse, o, kCpu);
  require_close(fused_qkv_heads(dqkv, 0).contiguous(), g.dq, 0.0, "dq");
  require_close(fused_qkv_heads(dqkv, 1).contiguous(), g.dk, 0.0, "dk");
  require_close(fused_qkv_heads(dqkv, 2).contiguous(), g.dv, 0.0, "dv");
  // Strided views given to the plain ops: read through copies, written back in place.
  const Tensor out = Tensor::zeros({b, s, h, d}, DType::f64);
  const Tensor lse = attention_forward_into(fused_qkv_heads(qkv, 0), fused_qkv_heads(qkv, 1),
                                            fused_qkv_heads(qkv, 2), o, out.transpose(1, 2), kCpu);
  require_close(out, f.out, 0.0, "out written into a view");
  require_close(lse, f.lse, 0.0, "lse of the views");
  REQUIRE_THROWS_QUINTET(fused_qkv_heads(dout, 0), InvalidArgument, "[batch, seq, 3, heads");
}

TEST_CASE("adamw_step_many equals adamw_step per tensor, clip factor from the sum of squares",
          "[nn][ops]") {
  AdamWHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  std::vector<AdamWTensors> many, one;
  std::vector<Tensor> grads;
  for (int i = 0; i < 5; ++i) {
    const std::int64_t n = 1 + 3 * i;
    const Tensor m0 = Tensor::randn({n}, 50 + i), g = Tensor::randn({n}, 60 + i);
    many.push_back({m0.clone(), g, Tensor::zeros({n}), Tensor::zeros({n}),
                    Tensor::zeros({n}, DType::bf16), i % 2 == 0});
    one.push_back({m0.clone(), g, Tensor::zeros({n}), Tensor::zeros({n}),
                   Tensor::zeros({n}, DType::bf16), i % 2 == 0});
    grads.push_back(g);
  }
  const Tensor sq = sum_of_squares(grads, kCpu);
  const double norm = std::sqrt(sq.item());
  REQUIRE(clip_scale(norm, 0.0f) == 1.0f);
  REQUIRE(clip_scale(norm, static_cast<float>(2 * norm)) == 1.0f);
  const float max_norm = static_cast<float>(norm / 3);
  const float scale = clip_scale(norm, max_norm);
  REQUIRE(scale == Approx(1.0 / 3).epsilon(1e-5));
  adamw_step_many(many, h, 1, sq, max_norm, kCpu);
  AdamWHyper no_decay = h;
  no_decay.weight_decay = 0.0f;
  for (const AdamWTensors& t : one) {
    adamw_step(t.master, t.grad, t.exp_avg, t.exp_avg_sq, t.weight_decay ? h : no_decay, 1, scale,
               t.param, kCpu);
  }
  for (std::size_t i = 0; i < many.size(); ++i) {
    require_close(many[i].master, one[i].master, 0.0, "master");
    require_close(many[i].exp_avg_sq, one[i].exp_avg_sq, 0.0, "exp_avg_sq");
    require_close(many[i].param.to(DType::f64), one[i].param.to(DType::f64), 0.0, "param");
  }
  // A sum of squares that is not finite updates nothing.
  const std::vector<double> before = many[2].master.to_vector<double>();
  adamw_step_many(many, h, 2, Tensor::full({}, std::numeric_limits<double>::quiet_NaN()), max_norm,
                  kCpu);
  REQUIRE(many[2].master.to_vector<double>() == before);
  // Bad input: one param dtype per call, a scalar f32 sum of squares, adamw_step's own checks.
  std::vector<AdamWTensors> mixed = many;
  mixed[1].param = Tensor::zeros({4}, DType::f32);
  REQUIRE_THROWS_QUINTET(adamw_step_many(mixed, h, 2, sq, 1.0f, kCpu), InvalidArgument,
                         "params of dtypes bf16 and f32");
  REQUIRE_THROWS_QUINTET(adamw_step_many(many, h, 2, Tensor::zeros({2}), 1.0f, kCpu),
                         InvalidArgument, "expected a scalar f32");
  REQUIRE_THROWS_QUINTET(adamw_step_many(many, h, 0, sq, 1.0f, kCpu), InvalidArgument,
                         "expected >= 1");
}

TEST_CASE("f32 ops agree with f64", "[nn][ops]") {
  const Tensor x = randn64({6, 33}, 51), w = randn64({17, 33}, 52), b = randn64({17}, 53);
  const Tensor y64 = linear_forward(x, w, b, kCpu);
  const Tensor y32 = linear_forward(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), kCpu);
  REQUIRE(y32.dtype() == DType::f32);
  REQUIRE(nn_test::rel_error(y32, y64) < 1e-5);
  const Tensor q = randn64({1, 3, 19, 8}, 54), k = randn64({1, 3, 19, 8}, 55),
               v = randn64({1, 3, 19, 8}, 56);
  const AttentionOutput a64 = attention_forward(q, k, v, {}, kCpu);
  const AttentionOutput a32 =
      attention_forward(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), {}, kCpu);
  REQUIRE(a32.lse.dtype() == DType::f32);
  REQUIRE(nn_test::rel_error(a32.out, a64.out) < 1e-5);
  REQUIRE(nn_test::rel_error(a32.lse, a64.lse) < 1e-5);
}

TEST_CASE("embedding lookup and scatter-add backward", "[nn][ops]") {
  Tensor table = randn64({6, 3}, 61);
  const Tensor ids = Tensor::from_vector<std::int64_t>({2, 5, 2, 0}, {2, 2});
  const Tensor y = embedding_forward(ids, table, kCpu);
  REQUIRE(y.shape() == Shape{2, 2, 3});
  REQUIRE(y.at<double>({1, 0, 2}) == table.at<double>({2, 2}));
  const Tensor r = randn64({2, 2, 3}, 62);
  Tensor dt = Tensor::zeros({6, 3}, DType::f64);
  embedding_backward(r, ids, dt, kCpu);
  auto loss = [&] { return dot(embedding_forward(ids, table, kCpu), r); };
  require_close(dt, numeric_grad(loss, table), kFdTol, "dtable");
  REQUIRE(dt.at<double>({2, 1}) == Approx(r.at<double>({0, 0, 1}) + r.at<double>({1, 0, 1})));
  const Tensor ids32 = Tensor::from_vector<std::int32_t>({2, 5, 2, 0}, {2, 2});
  require_close(embedding_forward(ids32, table, kCpu), y, 0.0, "i32 ids");
}

TEST_CASE("vocabulary-parallel cross-entropy with a shard whose row is all -inf equals the unsplit",
          "[nn][ops]") {
  // Row 0's first shard (columns 0-2) is masked whole; row 1 is masked in part. The shard's
  // partials are max -inf and sum 0 (not NaN), and the merged loss and lse are the unsplit op's.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor logits = randn64({2, 7}, 73, 2.0);
  for (int j = 0; j < 3; ++j) logits.data<double>()[j] = -inf;
  logits.data<double>()[7 + 1] = -inf;
  const Tensor targets = Tensor::from_vector<std::int64_t>({5, 2}, {2});
  const CrossEntropyOutput want = cross_entropy_forward(logits, targets, -100, kCpu);
  const std::int64_t starts[] = {0, 3, 7};
  Tensor gathered = Tensor::empty({2, 3, 2}, DType::f64);
  for (int k = 0; k < 2; ++k) {
    const Tensor shard = logits.narrow(1, starts[k], starts[k + 1] - starts[k]).contiguous();
    gathered.select(k).copy_(vocab_parallel_ce_partials(shard, targets, starts[k], 7, -100, kCpu),
                             kCpu);
  }
  REQUIRE(gathered.at<double>({0, 0, 0}) == -inf);
  REQUIRE(gathered.at<double>({0, 1, 0}) == 0.0);
  const CrossEntropyOutput got = vocab_parallel_ce_combine(gathered, targets, 7, -100, kCpu);
  REQUIRE(std::isfinite(got.loss.item()));
  REQUIRE(got.loss.item() == Approx(want.loss.item()).epsilon(1e-12));
  require_close(got.lse, want.lse, 1e-12, "lse");
}

TEST_CASE("cross-entropy with ignore index", "[nn][ops]") {
  Tensor logits = randn64({5, 7}, 71, 2.0);
  const Tensor targets = Tensor::from_vector<std::int64_t>({3, -100, 0, 6, -100}, {5});
  const CrossEntropyOutput o = cross_entropy_forward(logits, targets, -100, kCpu);
  double expect = 0;
  for (int i : {0, 2, 3}) {
    double s = 0;
    for (int j = 0; j < 7; ++j) s += std::exp(logits.at<double>({i, j}));
    expect += std::log(s) - logits.at<double>({i, int(targets.at<std::int64_t>({i}))});
  }
  REQUIRE(o.valid_count.item() == 3.0);
  REQUIRE(o.loss.item() == Approx(expect / 3).epsilon(1e-12));
  const Tensor dl = cross_entropy_backward(logits, targets, o.lse, o.valid_count, 0.5f, -100, kCpu);
  auto loss = [&] { return 0.5 * cross_entropy_forward(logits, targets, -100, kCpu).loss.item(); };
  require_close(dl, numeric_grad(loss, logits), kFdTol, "dlogits");
  // No valid token: loss 0, zero gradient.
  const Tensor none = Tensor::from_vector<std::int32_t>({-1, -1}, {2});
  const CrossEntropyOutput z = cross_entropy_forward(logits.narrow(0, 0, 2), none, -1, kCpu);
  REQUIRE(z.loss.item() == 0.0);
  REQUIRE(dot(cross_entropy_backward(logits.narrow(0, 0, 2), none, z.lse, z.valid_count, 1.0f, -1,
                                     kCpu),
              Tensor::full({2, 7}, 1.0, DType::f64)) == 0.0);
}

TEST_CASE("AdamW against a hand-computed reference", "[nn][ops]") {
  const std::vector<float> p0 = {0.5f, -1.25f, 2.0f}, g1 = {0.1f, -0.3f, 0.05f},
                           g2 = {-0.2f, 0.4f, 0.0f};
  Tensor master = Tensor::from_vector(p0, {3}), m = Tensor::zeros({3}), v = Tensor::zeros({3});
  Tensor bf = Tensor::zeros({3}, DType::bf16);
  AdamWHyper h;
  h.lr = 0.01f;
  h.beta1 = 0.9f;
  h.beta2 = 0.99f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  adamw_step(master, Tensor::from_vector(g1, {3}), m, v, h, 1, 1.0f, bf, kCpu);
  adamw_step(master, Tensor::from_vector(g2, {3}), m, v, h, 2, 0.5f, Tensor(), kCpu);
  for (int i = 0; i < 3; ++i) {
    double p = p0[i], mm = 0, vv = 0;
    const double gs[2] = {g1[i] * 1.0, g2[i] * 0.5};
    for (int t = 1; t <= 2; ++t) {
      const double g = gs[t - 1];
      p -= 0.01 * 0.1 * p;
      mm = 0.9 * mm + 0.1 * g;
      vv = 0.99 * vv + 0.01 * g * g;
      p -= 0.01 * (mm / (1 - std::pow(0.9, t))) / (std::sqrt(vv / (1 - std::pow(0.99, t))) + 1e-8);
      if (t == 1) {  // the bf16 copy was written after step 1
        REQUIRE(bf.item({i}) == Approx(p).epsilon(1e-2));
      }
    }
    REQUIRE(master.item({i}) == Approx(p).epsilon(1e-6));
    REQUIRE(m.item({i}) == Approx(mm).epsilon(1e-5));
    REQUIRE(v.item({i}) == Approx(vv).epsilon(1e-5));
  }
}

TEST_CASE("add, scale, cast and the global norm", "[nn][ops]") {
  const Tensor a = randn64({3, 4}, 81), b = randn64({3, 4}, 82);
  const Tensor s = add(a, b, kCpu);
  REQUIRE(s.at<double>({2, 3}) == a.at<double>({2, 3}) + b.at<double>({2, 3}));
  const Tensor acc = Tensor::full({3, 4}, 1.0, DType::f64);
  add_(acc, a, -2.0f, kCpu);
  REQUIRE(acc.at<double>({1, 1}) == Approx(1 - 2 * a.at<double>({1, 1})));
  REQUIRE(scale(a, 3.0f, kCpu).at<double>({0, 2}) == Approx(3 * a.at<double>({0, 2})));
  const Tensor c = a.clone();
  scale_(c, -0.5f, kCpu);
  REQUIRE(c.at<double>({0, 0}) == Approx(-0.5 * a.at<double>({0, 0})));
  const Tensor h = cast(a, DType::f32, kCpu);
  REQUIRE(h.dtype() == DType::f32);
  const double n = global_norm({a, b.to(DType::f32)}, kCpu);
  REQUIRE(n == Approx(std::sqrt(dot(a, a) + dot(b, b))).epsilon(1e-6));
  REQUIRE(global_norm({}, kCpu) == 0.0);
}

TEST_CASE("nn ops reject bad input with a quintet::Error", "[nn][ops]") {
  const Tensor x = Tensor::randn({2, 5}, 1), w = Tensor::randn({4, 5}, 2);
  REQUIRE_THROWS_QUINTET(linear_forward(x, Tensor::randn({4, 6}, 3), Tensor(), kCpu),
                         InvalidArgument, "expected [out, 5]");
  REQUIRE_THROWS_QUINTET(linear_forward(x, w.to(DType::f64), Tensor(), kCpu), InvalidArgument,
                         "other inputs are f32");
  REQUIRE_THROWS_QUINTET(linear_forward(x.to(DType::bf16), w, Tensor(), kCpu), InvalidArgument,
                         "compute in f32");
  Tensor dw_bad = Tensor::zeros({4, 4});
  REQUIRE_THROWS_QUINTET(
      linear_backward_weight(Tensor::randn({2, 4}, 4), x, dw_bad, Tensor(), kCpu), InvalidArgument,
      "dw has shape [4, 4], expected [4, 5]");
  const Tensor q = Tensor::randn({1, 2, 4, 8}, 5);
  REQUIRE_THROWS_QUINTET(attention_forward(q, Tensor::randn({1, 3, 4, 8}, 6), q, {}, kCpu),
                         InvalidArgument, "k has shape");
  AttentionOptions neg;
  neg.q_offset = -1;
  REQUIRE_THROWS_QUINTET(attention_forward(q, q, q, neg, kCpu), InvalidArgument, "q_offset");
  REQUIRE_THROWS_QUINTET(embedding_forward(Tensor::from_vector<std::int64_t>({7}, {1}), w, kCpu),
                         InvalidArgument, "outside the table's vocabulary [0, 4)");
  REQUIRE_THROWS_QUINTET(embedding_forward(x, w, kCpu), InvalidArgument, "expected i32 or i64");
  REQUIRE_THROWS_QUINTET(
      cross_entropy_forward(x, Tensor::from_vector<std::int64_t>({1, 9}, {2}), -100, kCpu),
      InvalidArgument, "cross_entropy_forward: targets[1] = 9 is outside the vocabulary");
  REQUIRE_THROWS_QUINTET(
      layernorm_forward(x, Tensor::randn({4}, 7), Tensor::randn({4}, 8), 1e-5f, kCpu),
      InvalidArgument, "gamma has shape [4], expected [5]");
  Tensor mw = Tensor::zeros({3});
  REQUIRE_THROWS_QUINTET(
      adamw_step(mw, mw.clone(), mw.clone(), mw.clone(), {}, 0, 1.0f, Tensor(), kCpu),
      InvalidArgument, "expected >= 1");
  if (cuda_available()) {  // device mismatch needs a visible GPU to build a CUDA stream
    const Stream gpu = Stream::create(Device::cuda(0));
    REQUIRE_THROWS_QUINTET(linear_forward(x, w, Tensor(), gpu), InvalidArgument, "cuda:0");
  }
}
