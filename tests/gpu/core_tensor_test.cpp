// Tensors on the GPU: copies on streams with events, strided copies, dtype conversions equal to
// the CPU's, and Philox draws bitwise equal to the CPU's.
#include <cmath>
#include <cstring>

#include "support/catch.hpp"

#include "quintet/core/random.hpp"
#include "quintet/core/tensor.hpp"

using namespace quintet;

TEST_CASE("H2D, D2D and D2H copies on streams ordered by events") {
  const Device gpu = Device::cuda(0);
  Stream copy = Stream::create(gpu);
  Stream compute = Stream::create(gpu);
  Tensor host = Tensor::randn({1 << 20}, 3);
  Tensor pinned = Tensor::empty_pinned({1 << 20});
  pinned.copy_(host);
  Tensor dev = Tensor::empty({1 << 20}, DType::f32, gpu, copy);
  dev.copy_(pinned, copy);  // asynchronous
  Event ready(gpu);
  ready.record(copy);
  ready.wait(compute);
  Tensor dev2 = dev.clone(compute);  // D2D after the event
  Tensor back = Tensor::empty_pinned({1 << 20});
  back.copy_(dev2, compute);
  compute.synchronize();
  CHECK(back.to_vector<float>() == host.to_vector<float>());
}

TEST_CASE("strided copies and views on the GPU equal the CPU's") {
  const Device gpu = Device::cuda(0);
  Tensor cpu = Tensor::randn({5, 7, 9}, 11);
  Tensor g = cpu.to(gpu);
  CHECK(g.transpose(0, 2).contiguous().to(Device::cpu()).to_vector<float>() ==
        cpu.transpose(0, 2).contiguous().to_vector<float>());
  CHECK(g.slice(1, 2, 6).to_vector<float>() == cpu.slice(1, 2, 6).to_vector<float>());
  // Copy into a strided GPU destination from the host.
  Tensor dst = Tensor::zeros({9, 7, 5}, DType::f32, gpu);
  dst.transpose(0, 2).copy_(cpu);
  CHECK(dst.to_vector<float>() == cpu.transpose(0, 2).contiguous().to_vector<float>());
  CHECK(g.item({4, 6, 8}) == cpu.item({4, 6, 8}));
  Tensor filled = Tensor::full({3, 3}, -1.25, DType::bf16, gpu);
  CHECK(filled.to_vector<float>() == std::vector<float>(9, -1.25f));
}

TEST_CASE("attention-style head splits on the GPU (vectorized and not) equal the CPU's") {
  const Device gpu = Device::cuda(0);
  // [b, s, 3, h, hd]: the q, k, v parts to [b, h, s, hd] and back, as the attention layers do;
  // hd 64 takes 16-byte vectors, hd 7 (and an odd offset) the per-element path.
  for (std::int64_t hd : {64, 7}) {
    for (DType dtype : {DType::bf16, DType::f32}) {
      INFO("head dim " << hd << " " << dtype_name(dtype));
      const Tensor cpu = Tensor::randn({2, 5, 3, 4, hd}, 19).to(dtype);
      const Tensor g = cpu.to(gpu);
      for (std::int64_t i = 0; i < 3; ++i) {
        const Tensor want = cpu.narrow(2, i, 1).transpose(1, 3).contiguous();
        const Tensor got = g.narrow(2, i, 1).transpose(1, 3).contiguous().to(Device::cpu());
        CHECK(got.to(DType::f32).to_vector<float>() == want.to(DType::f32).to_vector<float>());
        // Back into a strided destination (the gradient of the split).
        Tensor back = Tensor::zeros({2, 5, 3, 4, hd}, dtype, gpu);
        back.narrow(2, i, 1).transpose(1, 3).copy_(got.to(gpu));
        Tensor back_cpu = Tensor::zeros({2, 5, 3, 4, hd}, dtype);
        back_cpu.narrow(2, i, 1).transpose(1, 3).copy_(want);
        CHECK(back.to(Device::cpu()).to(DType::f32).to_vector<float>() ==
              back_cpu.to(DType::f32).to_vector<float>());
      }
      // The merge [b, h, s, hd] -> [b, s, h, hd], and a fill of a strided view.
      const Tensor merged = g.narrow(2, 1, 1).transpose(1, 3).contiguous().transpose(1, 3);
      CHECK(merged.contiguous().to(Device::cpu()).to(DType::f32).to_vector<float>() ==
            cpu.narrow(2, 1, 1).contiguous().to(DType::f32).to_vector<float>());
      Tensor part = g.clone();
      part.narrow(2, 2, 1).fill_(0.5);
      Tensor part_cpu = cpu.clone();
      part_cpu.narrow(2, 2, 1).fill_(0.5);
      CHECK(part.to(Device::cpu()).to(DType::f32).to_vector<float>() ==
            part_cpu.to(DType::f32).to_vector<float>());
    }
  }
}

TEST_CASE("dtype conversions on the GPU equal the CPU's bit for bit") {
  const Device gpu = Device::cuda(0);
  // Normal values scaled over 13 decades: subnormal halves, overflowing halves, ties.
  Tensor vals = Tensor::randn({100003}, 5, DType::f64);
  std::vector<double> v = vals.to_vector<double>();
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] *= std::pow(10.0, static_cast<double>(i % 13) - 6);
  Tensor f = Tensor::from_vector<double>(v, {static_cast<std::int64_t>(v.size())}).to(DType::f32);
  for (DType to : {DType::bf16, DType::f16, DType::i32, DType::f64}) {
    Tensor on_cpu = f.to(to);
    Tensor on_gpu = f.to(gpu).to(to).to(Device::cpu());
    REQUIRE(on_cpu.nbytes() == on_gpu.nbytes());
    INFO("dtype " << dtype_name(to));
    CHECK(std::memcmp(on_cpu.data_ptr(), on_gpu.data_ptr(), on_cpu.nbytes()) == 0);
    // And back to f32.
    CHECK(on_cpu.to(DType::f32).to_vector<float>() ==
          on_gpu.to(gpu).to(DType::f32).to_vector<float>());
  }
}

TEST_CASE("Philox draws are bitwise identical on the CPU and the GPU") {
  const Device gpu = Device::cuda(0);
  const RandomKey key{0x1234567890abcdefULL, 77, (1ULL << 32) - 5};  // offset crosses 2^32
  CHECK(philox_words(key, 10000, Device::cpu()) == philox_words(key, 10000, gpu));
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Tensor c = Tensor::empty({301, 257}, dt);
    Tensor g = Tensor::empty({301, 257}, dt, gpu);
    fill_normal(c, key, 0.5f, 0.02f);
    fill_normal(g, key, 0.5f, 0.02f);
    Tensor gh = g.to(Device::cpu());
    CHECK(std::memcmp(c.data_ptr(), gh.data_ptr(), c.nbytes()) == 0);
    fill_uniform(c, key, -1.0f, 1.0f);
    fill_uniform(g, key, -1.0f, 1.0f);
    gh = g.to(Device::cpu());
    CHECK(std::memcmp(c.data_ptr(), gh.data_ptr(), c.nbytes()) == 0);
  }
  // A GPU shard equals the CPU's full draw sliced.
  Tensor full = Tensor::empty({64, 96});
  fill_normal(full, key);
  Tensor shard = Tensor::empty({64, 32}, DType::f32, gpu);
  fill_normal(shard, key, 0.0f, 1.0f, RandomRegion{{64, 96}, {0, 32}});
  CHECK(shard.to_vector<float>() == full.slice(1, 32, 64).to_vector<float>());
}

TEST_CASE("host_sync_count counts each wait for the GPU once, and no asynchronous call") {
  const Device gpu = Device::cuda(0);
  Stream s = Stream::create(gpu);
  const Tensor host = Tensor::arange(4096, DType::f32);
  const auto count_of = [](const auto& call) {
    const std::uint64_t before = host_sync_count();
    call();
    return host_sync_count() - before;
  };
  Tensor dev = host.to(gpu, s);
  s.synchronize();
  CHECK(count_of([&] { (void)dev.to(Device::cpu()); }) == 1);  // copy + synchronize: one
  CHECK(count_of([&] { (void)dev.to_vector<float>(); }) == 1);
  CHECK(count_of([&] { (void)dev.item({7}); }) == 1);
  CHECK(count_of([&] { (void)dev.clone(); }) == 1);
  CHECK(count_of([&] { (void)Tensor::from_vector(std::vector<float>{1, 2}, {2}, gpu); }) == 1);
  Tensor pageable = Tensor::empty({4096});
  CHECK(count_of([&] { pageable.copy_(dev, s); }) == 1);  // pageable memory waits
  CHECK(count_of([&] { s.synchronize(); }) == 1);
  Event done(gpu);
  done.record(s);
  CHECK(count_of([&] { done.synchronize(); }) == 1);
  CHECK(count_of([&] { done.wait(Stream()); }) == 1);  // a CPU stream waits on the host
  // Asynchronous work: kernels, device copies, a copy to pinned memory, events between streams.
  Stream other = Stream::create(gpu);
  CHECK(count_of([&] {
          Tensor d2 = dev.clone(s);
          d2.fill_(2.0, s);
          (void)d2.to(DType::bf16, s);
          (void)d2.to(Device::cpu(), s);
          done.record(s);
          done.wait(other);
        }) == 0);
  s.synchronize();
}

TEST_CASE("fills on the GPU equal the CPU's: zeros by memset, signed zeros and views by kernel") {
  const Device gpu = Device::cuda(0);
  const Stream s = Stream::create(gpu);
  // A copy to the host on a stream is asynchronous (into pinned memory): wait before reading.
  const auto on_host = [&](const Tensor& g) {
    const Tensor h = g.to(Device::cpu(), s);
    s.synchronize();
    return h.to(DType::f64).to_vector<double>();
  };
  for (const DType t : {DType::f32, DType::bf16, DType::i64}) {
    INFO(dtype_name(t));
    const Tensor cpu = Tensor::randn({6, 10, 7}, 21).to(t);
    Tensor g = cpu.to(gpu, s);
    Tensor want = cpu.clone();
    // A strided view (columns 2 to 5 of every row): the kernel fills it, the rest keeps its values.
    g.slice(1, 2, 6).fill_(0.0, s);
    want.slice(1, 2, 6).fill_(0.0);
    CHECK(on_host(g) == want.to(DType::f64).to_vector<double>());
    // The whole contiguous tensor: zero bytes through cudaMemsetAsync.
    g.fill_(0.0, s);
    for (const double v : on_host(g)) {
      CHECK(v == 0.0);
      CHECK(!std::signbit(v));
    }
    if (t != DType::i64) {  // -0.0 is not zero bytes: the kernel writes the sign
      g.fill_(-0.0, s);
      for (const double v : on_host(g)) {
        CHECK(v == 0.0);
        CHECK(std::signbit(v));
      }
    }
    const double value = t == DType::i64 ? 3.0 : 1.5;  // one each dtype holds exactly
    g.fill_(value, s);
    for (const double v : on_host(g)) CHECK(v == value);
  }
}
