// The training ops on the GPU (embedding and its scatter-add backward, cross-entropy fused with
// the softmax, whole or split over vocabulary shards, the fused AdamW step, one tensor or many per
// launch, and the sum of squares) against the CPU ops on the same random inputs; the GPU's handling
// of out-of-range ids and targets; the optimizer's norm left on the device; bad inputs.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gpu/nn_gpu_compare.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/nn/vocab_parallel_ops.hpp"
#include "support/nn_adamw.hpp"
#include "support/nn_layers.hpp"

using namespace quintet;
using namespace nn_gpu_test;

namespace {
const DType kDTypes[] = {DType::f32, DType::bf16};

// n ids in [0, vocab), with repeats, as i32 or i64 on the CPU.
Tensor random_ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed, DType dtype) {
  const std::vector<double> u = Tensor::rand({n}, seed, DType::f64).to_vector<double>();
  std::vector<std::int64_t> ids(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) {
    ids[i] = std::min<std::int64_t>(vocab - 1, static_cast<std::int64_t>(u[i] * vocab));
  }
  ids[0] = ids.size() > 1 ? ids[1] : ids[0];  // at least one repeat
  return Tensor::from_vector<std::int64_t>(ids, {n}).to(dtype);
}
}  // namespace

TEST_CASE("embedding forward and scatter-add backward on the GPU equal the CPU's") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  std::uint64_t seed = 3000;
  for (const DType t : kDTypes) {
    for (const DType it : {DType::i32, DType::i64}) {
      INFO("dtype " << dtype_name(t) << " ids " << dtype_name(it));
      const std::int64_t V = 37, D = 29;
      const Tensor ids = random_ids(3 * 41, V, ++seed, it).view({3, 41});
      const Tensor ids_gpu = ids.to(gpu, s);
      const Input table = random_input({V, D}, ++seed, t, s);
      const Input dy = random_input({3, 41, D}, ++seed, t, s);
      const Tensor y = nn::embedding_forward(ids_gpu, table.gpu, s);
      CHECK(y.shape() == Shape{3, 41, D});
      CHECK_CLOSE(y, nn::embedding_forward(ids, table.cpu, cpu), s, t);
      const Tensor dt0 = Tensor::randn({V, D}, ++seed);
      const Tensor dt = dt0.to(gpu, s), dt_ref = dt0.clone();
      nn::embedding_backward(dy.gpu, ids_gpu, dt, s);
      nn::embedding_backward(dy.cpu, ids, dt_ref, cpu);
      CHECK_CLOSE(dt, dt_ref, s, t);
    }
  }

  SECTION("an id outside the vocabulary gives a zero row and no gradient on the GPU") {
    const std::int64_t V = 5, D = 3;
    const Tensor ids = Tensor::from_vector<std::int64_t>({1, 7, -2, 4}, {4});
    const Tensor table = Tensor::randn({V, D}, 7);
    const Tensor y = nn::embedding_forward(ids.to(gpu, s), table.to(gpu, s), s);
    const std::vector<double> yv = values(y, s), tv = table.to_vector<double>();
    for (std::int64_t c = 0; c < D; ++c) {
      CHECK(yv[0 * D + c] == tv[1 * D + c]);
      CHECK(yv[1 * D + c] == 0.0);
      CHECK(yv[2 * D + c] == 0.0);
      CHECK(yv[3 * D + c] == tv[4 * D + c]);
    }
    const Tensor dt = Tensor::zeros({V, D}, DType::f32, gpu);
    nn::embedding_backward(Tensor::full({4, D}, 1.0, DType::f32, gpu), ids.to(gpu, s), dt, s);
    const std::vector<double> dv = values(dt, s);
    for (std::int64_t r = 0; r < V; ++r) {
      for (std::int64_t c = 0; c < D; ++c) CHECK(dv[r * D + c] == ((r == 1 || r == 4) ? 1.0 : 0.0));
    }
  }
}

TEST_CASE("cross-entropy on the GPU equals the CPU's, with ignored targets") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const std::int64_t kIgnore = -100;
  std::uint64_t seed = 4000;
  for (const DType t : kDTypes) {
    for (const DType it : {DType::i32, DType::i64}) {
      for (const std::int64_t V :
           {std::int64_t{1}, std::int64_t{1001}, std::int64_t{50257}, std::int64_t{50304}}) {
        INFO("dtype " << dtype_name(t) << " targets " << dtype_name(it) << " vocab " << V);
        const std::int64_t N = 53;
        const Input logits = random_input({N, V}, ++seed, t, s, 4.0);
        std::vector<std::int64_t> tg =
            random_ids(N, V, ++seed, DType::i64).to_vector<std::int64_t>();
        for (std::int64_t i = 0; i < N; i += 5) tg[i] = kIgnore;
        const Tensor targets = Tensor::from_vector<std::int64_t>(tg, {N}).to(it);
        const nn::CrossEntropyOutput o =
            nn::cross_entropy_forward(logits.gpu, targets.to(gpu, s), kIgnore, s);
        const nn::CrossEntropyOutput o_ref =
            nn::cross_entropy_forward(logits.cpu, targets, kIgnore, cpu);
        CHECK(o.loss.numel() == 1);
        CHECK_CLOSE(o.loss, o_ref.loss, s, DType::f32);
        CHECK_CLOSE(o.lse, o_ref.lse, s, DType::f32);
        CHECK(values(o.valid_count, s)[0] == o_ref.valid_count.item());
        const Tensor dl = nn::cross_entropy_backward(logits.gpu, targets.to(gpu, s), o.lse,
                                                     o.valid_count, 0.5f, kIgnore, s);
        const Tensor dl_ref = nn::cross_entropy_backward(logits.cpu, targets, o_ref.lse,
                                                         o_ref.valid_count, 0.5f, kIgnore, cpu);
        CHECK_CLOSE(dl, dl_ref, s, t);
      }
    }
  }

  SECTION("an out-of-range target counts as ignored on the GPU; no valid target gives 0") {
    const Tensor logits = Tensor::randn({3, 4}, 9);
    const Tensor bad = Tensor::from_vector<std::int32_t>({2, 9, -100}, {3});
    const Tensor fixed = Tensor::from_vector<std::int32_t>({2, -100, -100}, {3});
    const nn::CrossEntropyOutput o =
        nn::cross_entropy_forward(logits.to(gpu, s), bad.to(gpu, s), -100, s);
    const nn::CrossEntropyOutput o_ref = nn::cross_entropy_forward(logits, fixed, -100, cpu);
    CHECK_CLOSE(o.loss, o_ref.loss, s, DType::f32);
    CHECK(values(o.valid_count, s)[0] == 1.0);
    const Tensor none = Tensor::full({3}, -100, DType::i32, gpu);
    const nn::CrossEntropyOutput z = nn::cross_entropy_forward(logits.to(gpu, s), none, -100, s);
    CHECK(values(z.loss, s)[0] == 0.0);
    CHECK(values(z.valid_count, s)[0] == 0.0);
    const Tensor dz =
        nn::cross_entropy_backward(logits.to(gpu, s), none, z.lse, z.valid_count, 1.0f, -100, s);
    for (const double v : values(dz, s)) CHECK(v == 0.0);
  }
}

// The vocabulary split at odd offsets (the kernels read 16-byte vectors between a scalar head and
// tail): shard 0 and 2 have odd widths and start 1 row into their buffer, so neither their rows
// nor their base are 16-byte aligned (and dlogits, freshly allocated, is aligned differently);
// shard 1's rows are whole vectors. Rows with masked (-inf) logits, one whose shard 0 is all -inf,
// one of very negative logits, ignored targets; the merged loss, lse and gradients equal the
// unsplit CPU op's.
TEST_CASE(
    "vocabulary-parallel cross-entropy on the GPU at unaligned shard offsets equals the CPU's") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  const std::int64_t kIgnore = -100, N = 37, V = 1003;
  const std::int64_t starts[] = {0, 333, 701, V};
  const float inf = std::numeric_limits<float>::infinity();
  std::uint64_t seed = 4500;
  for (const DType t : kDTypes) {
    INFO("dtype " << dtype_name(t));
    std::vector<float> x = Tensor::randn({N, V}, ++seed).to_vector<float>();
    for (float& v : x) v *= 4.0f;
    for (std::int64_t c = 0; c < V; ++c) {
      if (c < 40 || c % 3 == 0) x[1 * V + c] = -inf;  // masked, whole first vectors included
      if (c < starts[1]) x[2 * V + c] = -inf;         // shard 0 sees only -inf in row 2
      x[3 * V + c] -= 1000.0f;                        // very negative: exp(x) is 0 in f32
    }
    std::vector<std::int64_t> tg = random_ids(N, V, ++seed, DType::i64).to_vector<std::int64_t>();
    for (std::int64_t i = 5; i < N; i += 5) tg[i] = kIgnore;
    tg[1] = 41;     // not masked
    tg[2] = 400;    // in shard 1
    tg[4] = 2;      // in shard 0, whose rows start unaligned
    tg[6] = V - 1;  // the last entry, in shard 2's tail
    const Tensor full = Tensor::from_vector<float>(x, {N, V}).to(t).to(DType::f32);
    const Tensor targets = Tensor::from_vector<std::int64_t>(tg, {N});
    const Tensor targets_gpu = targets.to(gpu, s);
    const Tensor full_gpu = to_gpu(full, t, s);
    const nn::CrossEntropyOutput want = nn::cross_entropy_forward(full, targets, kIgnore, cpu);
    const Tensor dl_want =
        nn::cross_entropy_backward(full, targets, want.lse, want.valid_count, 0.5f, kIgnore, cpu);

    const std::int64_t shards = 3;
    std::vector<Tensor> logits(shards);
    const Tensor gathered = Tensor::empty({shards, 3, N}, DType::f32, gpu, s);
    for (std::int64_t k = 0; k < shards; ++k) {
      const std::int64_t local = starts[k + 1] - starts[k];
      const std::int64_t skip = k == 1 ? 0 : 1;  // rows of buffer before the shard's
      const Tensor buffer = Tensor::empty({N + skip, local}, t, gpu, s);
      logits[k] = buffer.narrow(0, skip, N);
      logits[k].copy_(full_gpu.narrow(1, starts[k], local), s);
      CHECK((reinterpret_cast<std::uintptr_t>(logits[k].data_ptr()) % 16 == 0) == (k == 1));
      gathered.select(k).copy_(
          nn::vocab_parallel_ce_partials(logits[k], targets_gpu, starts[k], V, kIgnore, s), s);
    }
    const std::vector<double> g = values(gathered, s);
    CHECK(std::isinf(g[2]));  // shard 0, row 2: max -inf, sum of exp 0 (not NaN)
    CHECK(g[2] < 0.0);
    CHECK(g[N + 2] == 0.0);
    const nn::CrossEntropyOutput got =
        nn::vocab_parallel_ce_combine(gathered, targets_gpu, V, kIgnore, s);
    CHECK_CLOSE(got.loss, want.loss, s, DType::f32);
    // Row 3's lse (near -1000) apart, so it does not set the bars of the others (near 15).
    std::vector<double> lse = values(got.lse, s), lse_want = want.lse.to_vector<double>();
    check_close({lse[3]}, {lse_want[3]}, DType::f32);
    lse.erase(lse.begin() + 3);
    lse_want.erase(lse_want.begin() + 3);
    check_close(lse, lse_want, DType::f32);
    CHECK(values(got.valid_count, s)[0] == want.valid_count.item());
    for (std::int64_t k = 0; k < shards; ++k) {
      INFO("shard " << k);
      const Tensor dl = nn::vocab_parallel_ce_backward(
          logits[k], targets_gpu, got.lse, got.valid_count, 0.5f, starts[k], V, kIgnore, s);
      CHECK_CLOSE(dl, dl_want.narrow(1, starts[k], starts[k + 1] - starts[k]).contiguous(), s, t);
    }
  }
}

TEST_CASE("the fused AdamW step on the GPU equals the CPU's over several steps") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  nn::AdamWHyper hyper;
  hyper.lr = 3e-3f;
  hyper.beta1 = 0.85f;
  hyper.beta2 = 0.99f;
  hyper.eps = 1e-6f;
  hyper.weight_decay = 0.1f;
  std::uint64_t seed = 5000;
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{4099}, std::int64_t{1000003}}) {
    for (const DType pdt : {DType::bf16, DType::f32, DType::f16}) {
      for (const bool with_param : {true, false}) {
        INFO("numel " << n << " param " << dtype_name(pdt) << " written " << with_param);
        const Tensor master0 = Tensor::randn({n}, ++seed);
        const Tensor master = master0.to(gpu, s), master_ref = master0.clone();
        const Tensor m = Tensor::zeros({n}, DType::f32, gpu), m_ref = Tensor::zeros({n});
        const Tensor v = Tensor::zeros({n}, DType::f32, gpu), v_ref = Tensor::zeros({n});
        const Tensor param = with_param ? Tensor::zeros({n}, pdt, gpu) : Tensor();
        const Tensor param_ref = with_param ? Tensor::zeros({n}, pdt) : Tensor();
        for (std::int64_t step = 1; step <= 3; ++step) {
          const Tensor grad = Tensor::randn({n}, ++seed);
          nn::adamw_step(master, grad.to(gpu, s), m, v, hyper, step, 0.7f, param, s);
          nn::adamw_step(master_ref, grad, m_ref, v_ref, hyper, step, 0.7f, param_ref, cpu);
        }
        CHECK_CLOSE(master, master_ref, s, DType::f32);
        CHECK_CLOSE(m, m_ref, s, DType::f32);
        CHECK_CLOSE(v, v_ref, s, DType::f32);
        if (with_param) {
          // The same f32 master rounded to the parameter dtype: equal but for rounding ties.
          CHECK_CLOSE(param, param_ref, s, pdt == DType::f32 ? DType::f32 : DType::bf16);
        }
      }
    }
  }
}

TEST_CASE("adamw_step_many and sum_of_squares over many tensors on the GPU equal the CPU's") {
  // 150 tensors (more than one launch of 64), of sizes that put tensor boundaries inside the
  // kernels' chunks, some empty, with and without decay; the clip factor taken on the device.
  // Every fifth size is a multiple of 8 (16-byte vectors of f32 and bf16: the kernels' vector
  // paths), the others mostly not (their element paths).
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Stream cpu;
  nn::AdamWHyper hyper;
  hyper.lr = 2e-3f;
  hyper.weight_decay = 0.1f;
  std::uint64_t seed = 6000;
  struct Set {
    std::vector<nn::AdamWTensors> t;
    std::vector<Tensor> grads;
  } dev, ref;
  for (int i = 0; i < 150; ++i) {
    std::int64_t n = i % 17 == 0 ? 0 : 1 + (i * 7919) % 3001;
    if (i % 5 == 1) n = (n + 7) / 8 * 8;
    const Tensor master0 = Tensor::randn({n}, ++seed), grad = Tensor::randn({n}, ++seed);
    const bool decay = i % 3 != 0;
    dev.t.push_back({master0.to(gpu, s), grad.to(gpu, s), Tensor::zeros({n}, DType::f32, gpu),
                     Tensor::zeros({n}, DType::f32, gpu), Tensor::zeros({n}, DType::bf16, gpu),
                     decay});
    ref.t.push_back({master0.clone(), grad, Tensor::zeros({n}), Tensor::zeros({n}),
                     Tensor::zeros({n}, DType::bf16), decay});
    // The norm over gradients of two dtypes: every other one in bf16 (the same rounded values).
    const Tensor g = i % 2 == 0 ? grad : grad.to(DType::bf16);
    dev.grads.push_back(g.to(gpu, s));
    ref.grads.push_back(g);
  }
  Stream::default_stream(gpu).synchronize();  // the zeros were filled on the default stream
  const Tensor sq = nn::sum_of_squares(dev.grads, s), sq_ref = nn::sum_of_squares(ref.grads, cpu);
  CHECK_CLOSE(sq, sq_ref, s, DType::f32);
  const float max_norm = static_cast<float>(0.5 * std::sqrt(sq_ref.item()));  // clips: scale ~0.5
  for (std::int64_t step = 1; step <= 2; ++step) {
    nn::adamw_step_many(dev.t, hyper, step, sq, max_norm, s);
    nn::adamw_step_many(ref.t, hyper, step, sq_ref, max_norm, cpu);
  }
  for (std::size_t i = 0; i < dev.t.size(); ++i) {
    INFO("tensor " << i << " of " << dev.t[i].master.numel());
    if (dev.t[i].master.numel() == 0) continue;
    CHECK_CLOSE(dev.t[i].master, ref.t[i].master, s, DType::f32);
    CHECK_CLOSE(dev.t[i].exp_avg, ref.t[i].exp_avg, s, DType::f32);
    CHECK_CLOSE(dev.t[i].exp_avg_sq, ref.t[i].exp_avg_sq, s, DType::f32);
    CHECK_CLOSE(dev.t[i].param, ref.t[i].param, s, DType::bf16);
  }
  // An inf or nan norm updates nothing.
  const std::vector<double> before = values(dev.t[5].master, s);
  for (const double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const Tensor bad_sq = Tensor::full({}, bad, DType::f32, gpu);
    Stream::default_stream(gpu).synchronize();
    nn::adamw_step_many(dev.t, hyper, 3, bad_sq, max_norm, s);
    CHECK(values(dev.t[5].master, s) == before);
  }
}

TEST_CASE("AdamW on the GPU reads the norm when asked; an inf gradient skips the step and fails") {
  const Stream s = Stream::create(Device::cuda(0));
  nn::Linear m(8, 4);
  nn::ParameterStore store(m, DType::bf16, s, 3);
  nn::AdamWConfig cfg;
  cfg.max_grad_norm = 1.0f;
  nn::AdamW opt(store, cfg, s);
  m.weight().grad().fill_(0.5, s);
  m.bias()->grad().fill_(0.25, s);
  const nn::OptimizerStepInfo ok = opt.step(s);
  const double norm = std::sqrt(32 * 0.25 + 4 * 0.0625);
  CHECK(ok.grad_norm() == Approx(norm).epsilon(1e-6));
  CHECK(ok.grad_scale() == Approx(1.0 / norm).epsilon(1e-5));
  CHECK(ok.step == 1);
  const std::vector<double> w = values(m.weight().data(), s);
  m.weight().grad().fill_(std::numeric_limits<double>::infinity(), s);
  const nn::OptimizerStepInfo bad = opt.step(s);  // queued: the host has not seen the norm
  REQUIRE_THROWS_QUINTET(bad.grad_norm(), InvalidArgument, "inf or nan");
  CHECK(values(m.weight().data(), s) == w);  // nothing was updated
  // A program that never reads the norm fails at the next step.
  REQUIRE_THROWS_QUINTET(opt.step(s), InvalidArgument, "a gradient holds inf or nan");
}

TEST_CASE("GPU training ops reject bad inputs with InvalidArgument") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  const Tensor ids = Tensor::zeros({4}, DType::i32, gpu);
  const Tensor table = Tensor::zeros({5, 3}, DType::bf16, gpu);
  REQUIRE_THROWS_QUINTET(nn::embedding_forward(ids.to(DType::f32, s), table, s), InvalidArgument,
                         "i32 or i64");
  REQUIRE_THROWS_QUINTET(
      nn::embedding_backward(Tensor::zeros({4, 3}, DType::bf16, gpu), ids, table, s),
      InvalidArgument, "dtable");
  REQUIRE_THROWS_QUINTET(
      nn::cross_entropy_forward(table, Tensor::zeros({4}, DType::i64, gpu), -1, s), InvalidArgument,
      "targets");
  const Tensor w = Tensor::zeros({6}, DType::f32, gpu);
  REQUIRE_THROWS_QUINTET(
      nn::adamw_step(w, w.to(DType::bf16, s), w.clone(s), w.clone(s), {}, 1, 1.0f, Tensor(), s),
      InvalidArgument, "grad");
  REQUIRE_THROWS_QUINTET(
      nn::adamw_step(w, w.clone(s), w.clone(s), w.clone(s), {}, 0, 1.0f, Tensor(), s),
      InvalidArgument, "step");
}
