// Tensor on the CPU: factories, views, copies, conversions, element access and bad input.
#include <numeric>

#include "support/catch.hpp"

#include "quintet/core/allocator.hpp"
#include "quintet/core/tensor.hpp"

using namespace quintet;

TEST_CASE("factories give the right shapes and values") {
  Tensor z = Tensor::zeros({2, 3});
  CHECK(z.numel() == 6);
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.strides() == Shape{3, 1});
  for (double v : z.to_vector<double>()) CHECK(v == 0.0);
  Tensor f = Tensor::full({4}, 2.5, DType::bf16);
  for (float v : f.to_vector<float>()) CHECK(v == 2.5f);
  Tensor a = Tensor::arange(5, DType::i64);
  CHECK(a.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  Tensor e = Tensor::empty({0, 7});
  CHECK(e.defined());
  CHECK(e.numel() == 0);
  CHECK_FALSE(Tensor().defined());
}

TEST_CASE("views share storage and index correctly") {
  Tensor t = Tensor::arange(24, DType::f32).view({2, 3, 4});
  CHECK(t.at<float>({1, 2, 3}) == 23.0f);
  Tensor s = t.slice(2, 1, 3);  // [2, 3, 2]
  CHECK(s.shape() == Shape{2, 3, 2});
  CHECK_FALSE(s.is_contiguous());
  CHECK(s.at<float>({1, 0, 1}) == 12.0f + 2.0f);
  CHECK(s.shares_storage(t));
  s.at<float>({0, 0, 0}) = -1.0f;
  CHECK(t.at<float>({0, 0, 1}) == -1.0f);

  Tensor tr = t.transpose(0, 2);  // [4, 3, 2]
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.at<float>({3, 2, 1}) == t.at<float>({1, 2, 3}));
  Tensor c = tr.contiguous();
  CHECK(c.is_contiguous());
  CHECK_FALSE(c.shares_storage(t));
  // Compare every element of the contiguous copy with the transposed view.
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t k = 0; k < 2; ++k)
        REQUIRE(c.at<float>({i, j, k}) == t.at<float>({k, j, i}));

  Tensor n = t.narrow(1, 1, 2);
  CHECK(n.shape() == Shape{2, 2, 4});
  CHECK(n.at<float>({0, 0, 0}) == 4.0f);
  Tensor sel = t.select(1);
  CHECK(sel.shape() == Shape{3, 4});
  CHECK(sel.at<float>({0, 0}) == 12.0f);
  CHECK(t.view({-1, 4}).shape() == Shape{6, 4});
  CHECK(t.slice(0, -1, 2).shape() == Shape{1, 3, 4});
}

TEST_CASE("copy_ and to(dtype) convert exactly") {
  Tensor src = Tensor::arange(12, DType::f32).view({3, 4});
  Tensor dst = Tensor::empty({4, 3}, DType::f32);
  dst.copy_(src.transpose(0, 1));
  CHECK(dst.at<float>({3, 2}) == 11.0f);
  Tensor h = src.to(DType::bf16);
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.to(DType::f64).to_vector<double>() == src.to_vector<double>());
  Tensor x = Tensor::full({3}, 1.0 + 1.0 / 256 + 1.0 / 65536, DType::f32).to(DType::bf16);
  CHECK(x.to_vector<float>()[0] == 1.0f + 1.0f / 128);  // rounds up: above the halfway point
  Tensor cl = src.clone();
  cl.fill_(7);
  CHECK(src.at<float>({0, 1}) == 1.0f);
  CHECK(cl.item({2, 3}) == 7.0);
  Tensor v = Tensor::from_vector<std::int32_t>({5, -6, 7}, {3});
  CHECK(v.to(DType::f32).to_vector<float>() == std::vector<float>{5, -6, 7});
}

TEST_CASE("bad input gives a clear quintet::Error") {
  REQUIRE_THROWS_QUINTET(Tensor::empty({2, -3}), InvalidArgument, "negative size");
  REQUIRE_THROWS_QUINTET(Tensor::empty({1LL << 40, 1LL << 40}), InvalidArgument,
                         "more elements than fit");
  Tensor t = Tensor::zeros({2, 3});
  REQUIRE_THROWS_QUINTET(t.view({4, 2}), InvalidArgument, "has 8 elements");
  REQUIRE_THROWS_QUINTET(t.view({-1, 4}), InvalidArgument, "cannot infer");
  REQUIRE_THROWS_QUINTET(t.transpose(0, 1).view({6}), InvalidArgument, "contiguous");
  Tensor other = Tensor::zeros({3, 2});
  REQUIRE_THROWS_QUINTET(t.copy_(other), InvalidArgument, "source shape [3, 2]");
  Tensor d = Tensor::zeros({2, 3}, DType::f64);
  REQUIRE_THROWS_QUINTET(t.copy_(d), InvalidArgument, "source dtype f64");
  REQUIRE_THROWS_QUINTET(t.at<double>({0, 0}), InvalidArgument, "dtype f32");
  REQUIRE_THROWS_QUINTET(t.at<float>({2, 0}), InvalidArgument, "out of range");
  REQUIRE_THROWS_QUINTET(t.at<float>({0}), InvalidArgument, "1 indices on a 2-D");
  REQUIRE_THROWS_QUINTET(t.slice(1, 2, 5), InvalidArgument, "not within");
  REQUIRE_THROWS_QUINTET(t.transpose(0, 2), InvalidArgument, "out of range");
  REQUIRE_THROWS_QUINTET(Tensor::zeros({2}, DType::f32, Device::cuda(cuda_device_count())),
                         InvalidArgument, "out of range");
  REQUIRE_THROWS_QUINTET(Device::parse("tpu:0"), InvalidArgument, "expected cpu, cuda");
  REQUIRE_THROWS_QUINTET(Tensor::from_vector<float>({1, 2}, {3}), InvalidArgument, "2 values");
  REQUIRE_THROWS_QUINTET(Tensor().clone(), InvalidArgument, "undefined");
  REQUIRE_THROWS_QUINTET(t.data<double>(), InvalidArgument, "dtype f32");
}

TEST_CASE("the CPU allocator counts live and peak bytes") {
  quintet::cpu_reset_peak();
  const quintet::AllocatorStats before = quintet::cpu_allocator_stats();
  CHECK(before.peak_bytes == before.current_bytes);
  {
    const Tensor a = Tensor::empty({1000}, DType::f32);  // 4000 bytes, rounded up to 4032
    const quintet::AllocatorStats during = quintet::cpu_allocator_stats();
    CHECK(during.current_bytes == before.current_bytes + 4032);
    CHECK(during.num_allocs == before.num_allocs + 1);
    { const Tensor b = Tensor::empty({16}, DType::f64); }  // 128 bytes, freed at once
    CHECK(quintet::cpu_allocator_stats().peak_bytes == before.current_bytes + 4032 + 128);
  }
  const quintet::AllocatorStats after = quintet::cpu_allocator_stats();
  CHECK(after.current_bytes == before.current_bytes);
  CHECK(after.peak_bytes == before.current_bytes + 4032 + 128);
  quintet::cpu_reset_peak();
  CHECK(quintet::cpu_allocator_stats().peak_bytes == after.current_bytes);
}

TEST_CASE("devices parse and print") {
  CHECK(Device::parse("cpu").is_cpu());
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::cuda(1).str() == "cuda:1");
  REQUIRE_THROWS_QUINTET(Device::parse("cuda:-1"), InvalidArgument, "cuda:N");
}

TEST_CASE("CPU streams and events are no-ops that keep time") {
  Stream s;
  Event a, b;
  a.record(s);
  b.record(s);
  CHECK(b.query());
  CHECK(b.elapsed_ms(a) >= 0.0f);
  s.synchronize();
}

TEST_CASE("host_sync_count counts the host's waits and reads, once per call") {
  Tensor t = Tensor::arange(6, DType::f32).view({2, 3});
  Stream s;
  Event e;
  e.record(s);
  const auto count_of = [](const auto& call) {
    const std::uint64_t before = host_sync_count();
    call();
    return host_sync_count() - before;
  };
  // Waits and host reads count on the CPU too: they mark where a GPU run waits.
  CHECK(count_of([&] { s.synchronize(); }) == 1);
  CHECK(count_of([&] { e.synchronize(); }) == 1);
  CHECK(count_of([&] { (void)t.to(Device::cpu()); }) == 1);
  CHECK(count_of([&] { (void)t.to_vector<float>(); }) == 1);
  CHECK(count_of([&] { (void)t.transpose(0, 1).to_vector<float>(); }) == 1);  // copy + read: one
  CHECK(count_of([&] { (void)t.item({1, 2}); }) == 1);
  // CPU work that would not wait on a GPU is not counted.
  CHECK(count_of([&] {
          (void)t.to(Device::cpu(), s);
          (void)t.to(DType::f64, s);
          (void)t.transpose(0, 1).contiguous(s);
          (void)t.clone(s);
          Tensor u = Tensor::empty({2, 3});
          u.copy_(t, s);
          u.fill_(1.0, s);
          e.record(s);
          e.wait(s);
          CHECK(e.query());
        }) == 0);
}
