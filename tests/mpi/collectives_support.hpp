// Helpers of the collectives tests: each rank's input is a pure function of (rank, seed, index),
// so every rank can compute what every other rank contributed and so the expected output.
//
// Values are small integers, exact in every dtype (bf16 holds integers up to 256 exactly), and
// chosen per reduction so that no sum or product leaves that range: every backend and every
// reduction order then gives the same bits, and only avg (a division) needs a tolerance.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/tensor.hpp"
#include "support/catch.hpp"

namespace quintet::test {

enum class Values { move, add, prod };  // plain data / sum, avg, max, min / prod

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline bool is_unsigned(DType dt) { return dt == DType::u8 || dt == DType::u16; }

// Element i of rank's input (a cheap hash: inputs of several MiB are generated on every rank).
inline double gen(int rank, std::uint64_t seed, std::int64_t i, DType dt, Values kind) {
  std::uint64_t h = (seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<std::uint64_t>(rank) << 40);
  h = (h + static_cast<std::uint64_t>(i)) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  switch (kind) {
    case Values::move:
      return static_cast<double>(h % 200);
    case Values::add:
      return is_unsigned(dt) ? static_cast<double>(h % 9) : static_cast<double>(h % 17) - 8.0;
    case Values::prod: {
      double v = (rank < 4 && h % 3 == 0) ? 2.0 : 1.0;  // |product| <= 16 on any group
      if (!is_unsigned(dt) && ((h >> 8) & 1)) v = -v;
      return v;
    }
  }
  return 0;
}

// A 1-D tensor of n elements of dtype with element i = gen(rank, seed, offset + i).
inline Tensor make_input(int rank, std::uint64_t seed, std::int64_t n, DType dt, Values kind,
                         std::int64_t offset = 0) {
  Tensor t = Tensor::empty({n}, dt);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    for (std::int64_t i = 0; i < n; ++i) {
      p[i] = convert_scalar<T>(static_cast<float>(gen(rank, seed, offset + i, dt, kind)));
    }
  });
  return t;
}

inline double fold(ReduceOp op, double acc, double v) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return acc + v;
    case ReduceOp::prod:
      return acc * v;
    case ReduceOp::max:
      return std::max(acc, v);
    case ReduceOp::min:
      return std::min(acc, v);
  }
  return acc;
}

inline Values values_for(ReduceOp op) { return op == ReduceOp::prod ? Values::prod : Values::add; }

// The reduction over ranks 0..size-1 of element i of their inputs.
inline double reduced(ReduceOp op, int size, std::uint64_t seed, std::int64_t i, DType dt) {
  double acc = gen(0, seed, i, dt, values_for(op));
  for (int r = 1; r < size; ++r) acc = fold(op, acc, gen(r, seed, i, dt, values_for(op)));
  return op == ReduceOp::avg ? acc / size : acc;
}

// Counts the elements of out (from element `first`) that differ from expected(i); exact unless
// approximate (then within a few units of the dtype's precision). Reports the first mismatch.
template <class Expected>
void check_values(const Tensor& out, std::int64_t first, std::int64_t n, Expected expected,
                  bool approximate, const std::string& what) {
  const Tensor h = out.flatten();
  const DType dt = h.dtype();
  const void* data = h.data_ptr();
  const double tol = dt == DType::bf16  ? 1.0 / 64
                     : dt == DType::f16 ? 1.0 / 512
                     : dt == DType::f32 ? 1e-6
                                        : 1e-12;
  std::int64_t bad = 0;
  std::string first_bad;
  // Large outputs are checked at a sample (every stride-th element and the last one): their
  // inputs differ everywhere, so a wrong block, offset or reduction still shows.
  const std::int64_t stride = n > 20000 ? (n / 20000) | 1 : 1;
  for (std::int64_t i = 0; i < n; i = (i + stride < n || i == n - 1) ? i + stride : n - 1) {
    const double a = load_as_double(data, dt, static_cast<std::size_t>(first + i));
    const double e = expected(i);
    const bool ok = approximate ? std::abs(a - e) <= tol * std::max(1.0, std::abs(e)) : a == e;
    if (!ok && bad++ == 0) first_bad = fmt::format("element {}: got {}, expected {}", i, a, e);
  }
  INFO(what << " (" << dtype_name(dt) << ", " << n << " elements): " << bad
            << " mismatches; first: " << first_bad);
  CHECK(bad == 0);
}

// A CPU world for the MPI tests (even on a machine with GPUs).
inline World cpu_world() {
  RuntimeConfig config = RuntimeConfig::from_env();
  config.device = DevicePreference::cpu;
  config.timeout_s = 60;
  return init(config);
}

// Sizes every operation is tested at, per rank, in elements: empty, one, odd, a few KiB, and for
// f32 and bf16 (a native MPI type and a user-defined reduction) a few MiB. Collectives whose
// input grows with the group (reduce_scatter, all_gather, all_to_all) use size/ranks elements per
// block at the large size, so that 8 oversubscribed ranks stay fast.
inline std::vector<std::int64_t> test_sizes(DType dt) {
  if (dt == DType::f32 || dt == DType::bf16) return {0, 1, 37, 4099, (1 << 19) + 3};
  return {0, 1, 37, 4099};
}
inline std::int64_t block_size(std::int64_t n, int ranks) { return n > 4099 ? (n / ranks) | 1 : n; }

}  // namespace quintet::test
