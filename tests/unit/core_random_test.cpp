// Philox: known-answer vectors, distribution sanity, and sliced draws equal to the whole.
#include <cmath>

#include "support/catch.hpp"

#include "quintet/core/philox.hpp"
#include "quintet/core/random.hpp"

using namespace quintet;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  // From Random123's kat_vectors: philox4x32 10 rounds.
  auto z = philox::philox4x32(0, 0, 0, 0, 0, 0);
  CHECK(z.v[0] == 0x6627e8d5u);
  CHECK(z.v[1] == 0xe169c58du);
  CHECK(z.v[2] == 0xbc57ac4cu);
  CHECK(z.v[3] == 0x9b00dbd8u);
  auto f = philox::philox4x32(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                              0xffffffffu);
  CHECK(f.v[0] == 0x408f276du);
  CHECK(f.v[1] == 0x41c83b0eu);
  CHECK(f.v[2] == 0xa20bc7c6u);
  CHECK(f.v[3] == 0x6d5451fdu);
  auto p = philox::philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u,
                              0x299f31d0u);
  CHECK(p.v[0] == 0xd16cfe09u);
  CHECK(p.v[1] == 0x94fdccebu);
  CHECK(p.v[2] == 0x5001e420u);
  CHECK(p.v[3] == 0x24126ea1u);
}

TEST_CASE("deterministic log and sincos are accurate") {
  for (float x = 1e-7f; x <= 1.0f; x *= 1.37f) {
    REQUIRE(std::abs(philox::det_log(x) - std::log(static_cast<double>(x))) <=
            2e-6 * std::max(1.0, std::abs(std::log(static_cast<double>(x)))));
  }
  for (int i = 0; i < 1000; ++i) {
    const float t = static_cast<float>(i) / 1000.0f;
    float s, c;
    philox::det_sincos_2pi(t, s, c);
    REQUIRE(std::abs(s - std::sin(2 * M_PI * t)) < 2e-6);
    REQUIRE(std::abs(c - std::cos(2 * M_PI * t)) < 2e-6);
  }
}

TEST_CASE("uniform and normal draws have the right moments") {
  Tensor u = Tensor::rand({200000}, 7);
  Tensor n = Tensor::randn({200000}, 7, DType::f64);
  double su = 0, su2 = 0, sn = 0, sn2 = 0, umin = 1, umax = 0;
  for (double x : u.to_vector<double>()) {
    su += x;
    su2 += x * x;
    umin = std::min(umin, x);
    umax = std::max(umax, x);
  }
  for (double x : n.to_vector<double>()) {
    sn += x;
    sn2 += x * x;
  }
  const double N = 200000;
  CHECK(std::abs(su / N - 0.5) < 0.005);
  CHECK(std::abs(su2 / N - 1.0 / 3) < 0.005);
  CHECK(umin >= 0.0);
  CHECK(umax < 1.0);
  CHECK(std::abs(sn / N) < 0.01);
  CHECK(std::abs(sn2 / N - 1.0) < 0.02);
}

TEST_CASE("a sharded draw is the same slice of the unsharded one") {
  const RandomKey key{42, 3, 1000};
  Tensor full = Tensor::empty({6, 10});
  fill_normal(full, key, 0.0f, 0.02f);
  // Column shard [4, 7) of rows [2, 6): a strided region.
  Tensor block = Tensor::empty({4, 3});
  fill_normal(block, key, 0.0f, 0.02f, RandomRegion{{6, 10}, {2, 4}});
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      REQUIRE(block.at<float>({i, j}) == full.at<float>({2 + i, 4 + j}));
  // A different seed or stream gives different numbers.
  Tensor other = Tensor::empty({6, 10});
  fill_normal(other, RandomKey{42, 4, 1000}, 0.0f, 0.02f);
  CHECK(other.at<float>({0, 0}) != full.at<float>({0, 0}));
  REQUIRE_THROWS_QUINTET(fill_normal(block, key, 0, 1, RandomRegion{{6, 10}, {4, 8}}),
                         InvalidArgument, "does not fit");
  Tensor ints = Tensor::empty({3}, DType::i32);
  REQUIRE_THROWS_QUINTET(fill_uniform(ints, key), InvalidArgument, "floating dtype");
}
