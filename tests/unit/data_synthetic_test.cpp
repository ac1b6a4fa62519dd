// The built-in synthetic dataset: the stated entropy equals the average log-loss of the true
// conditional distributions (recomputed here by parsing the stream), copies are verbatim, and the
// shards on disk carry the floor in their metadata.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "support/catch.hpp"

#include "quintet/data/synthetic.hpp"

using namespace quintet;
using namespace quintet::data;

namespace {

// -log2 p(x[n] | x[0..n)) under the source, computed by re-parsing the stream: a marker at a
// free position opens a copy event (offset token, then copy_len copied tokens).
std::vector<double> log_losses(const SyntheticSource& src, const std::vector<std::uint32_t>& x) {
  const SyntheticConfig& c = src.config();
  const double q = src.copy_prob();
  std::vector<double> loss(x.size());
  std::size_t n = 0;
  while (n < x.size()) {
    const bool copies = static_cast<std::int64_t>(n) >= c.max_distance();
    if (copies && x[n] == src.marker()) {
      loss[n++] = -std::log2(q);
      if (n >= x.size()) break;
      const std::uint32_t d = x[n];
      REQUIRE(d < static_cast<std::uint32_t>(c.num_offsets));
      loss[n++] = -std::log2(src.offset_probs()[d]);
      for (int j = 0; j < c.copy_len && n < x.size(); ++j, ++n) {
        if (x[n] != x[n - src.distance(static_cast<int>(d))]) FAIL("copy is not verbatim at " << n);
        loss[n] = 0.0;
      }
      continue;
    }
    const std::uint32_t* succ =
        src.successors(src.context_class(x.data(), static_cast<std::int64_t>(n)));
    double p = 0.0;
    for (int b = 0; b < c.branches; ++b) {
      if (succ[b] == x[n]) p = src.successor_probs()[static_cast<std::size_t>(b)];
    }
    if (p == 0.0) FAIL("token " << x[n] << " at " << n << " is not a successor of its context");
    loss[n++] = -std::log2(copies ? (1 - q) * p : p);
  }
  return loss;
}

// The formula of synthetic.hpp, written out for the default parameters independently of the
// implementation: q = 0.05, p proportional to 1, 1/2, 1/3, 1/4, 16 offsets, copy_len 24.
double default_entropy_by_hand() {
  const double q = 0.05;
  const double z = 1 + 1 / 2.0 + 1 / 3.0 + 1 / 4.0;
  double hp = 0;
  for (double w : {1.0, 1 / 2.0, 1 / 3.0, 1 / 4.0}) hp -= (w / z) * std::log2(w / z);
  const double hq = -q * std::log2(q) - (1 - q) * std::log2(1 - q);
  return (hq + (1 - q) * hp + q * 4.0) / (1 + q * 25);
}

}  // namespace

TEST_CASE("the stated entropy is the mean log-loss of the true conditionals") {
  SyntheticConfig cfg;
  const SyntheticSource src(cfg);
  CHECK(src.entropy_bits() == Approx(default_entropy_by_hand()).epsilon(1e-8));
  CHECK(src.entropy_nats() == Approx(src.entropy_bits() * std::log(2.0)));
  const std::int64_t N = 1 << 20;
  double realized = 0;
  const auto x = src.generate(3, N, &realized);
  const auto loss = log_losses(src, x);
  double mean = 0;
  for (double l : loss) mean += l;
  mean /= static_cast<double>(N);
  // Standard error of the mean ~ 1.6 bits * sqrt(25 / N) (events of ~25 tokens): ~0.008.
  INFO("stated " << src.entropy_bits() << " measured " << mean << " realized " << realized);
  CHECK(std::abs(mean - src.entropy_bits()) < 0.03);
  CHECK(std::abs(realized - src.entropy_bits()) < 0.01);
  for (std::uint32_t t : x) REQUIRE(t < 256u);
}

TEST_CASE("other parameters: more copies, other order and vocabulary") {
  SyntheticConfig cfg;
  cfg.seed = 77;
  cfg.vocab_size = 1000;
  cfg.order = 3;
  cfg.branches = 7;
  cfg.zipf_exponent = 0.5;
  cfg.copy_prob = 0.2;
  cfg.copy_len = 5;
  cfg.num_offsets = 3;  // not a power of two: probabilities are exact multiples of 2^-32
  cfg.min_distance = 4;
  cfg.distance_step = 3;
  const SyntheticSource src(cfg);
  const auto x = src.generate(0, 1 << 19);
  const auto loss = log_losses(src, x);
  double mean = 0;
  for (double l : loss) mean += l;
  mean /= static_cast<double>(loss.size());
  CHECK(std::abs(mean - src.entropy_bits()) < 0.03);
  CHECK(src.generate(0, 1000) == std::vector<std::uint32_t>(x.begin(), x.begin() + 1000));
  CHECK(src.generate(1, 1000) != std::vector<std::uint32_t>(x.begin(), x.begin() + 1000));
  cfg.branches = 1000;
  REQUIRE_THROWS_QUINTET(SyntheticSource{cfg}, InvalidArgument,
                         "branches 1000 must be in [1, vocab_size - 1 = 999]");
}

TEST_CASE("ensure_synthetic_dataset writes shards once and records the floor") {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("quintet_synth_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  SyntheticConfig cfg;
  const SyntheticDataset a = ensure_synthetic_dataset(dir, cfg, 2, 4096, 1024);
  REQUIRE(a.train.size() == 2);
  REQUIRE(a.val.size() == 1);
  const auto t0 = std::filesystem::last_write_time(a.train[0]);
  const SyntheticDataset b = ensure_synthetic_dataset(dir, cfg, 2, 4096, 1024);  // kept
  CHECK(std::filesystem::last_write_time(b.train[0]) == t0);
  const TokenDataset ds = TokenDataset::open(dir + "/train_*.qts");
  REQUIRE(ds.files().size() == 2);
  REQUIRE(entropy_floor_nats(ds).has_value());
  CHECK(*entropy_floor_nats(ds) == Approx(SyntheticSource(cfg).entropy_nats()).epsilon(1e-15));
  CHECK(ds.files()[1].token(100) ==
        static_cast<std::int64_t>(SyntheticSource(cfg).generate(1, 101)[100]));
  cfg.seed = 5;
  REQUIRE_THROWS_QUINTET(ensure_synthetic_dataset(dir, cfg, 2, 4096, 1024), InvalidArgument,
                         "holds other data: expected the synthetic dataset "
                         "v256-k2-c1024-b4-z1-q0.05-l24-d16-m32-s8-seed5");
  std::filesystem::remove_all(dir);
}
