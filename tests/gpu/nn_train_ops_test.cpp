// The training ops on the GPU (embedding and its scatter-add backward, cross-entropy fused with
// the softmax, the fused AdamW step) against the CPU ops on the same random inputs; the GPU's
// handling of out-of-range ids and targets; bad inputs.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/nn_gpu_compare.hpp"

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
      for (const std::int64_t V : {std::int64_t{1}, std::int64_t{1001}, std::int64_t{50257}}) {
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
