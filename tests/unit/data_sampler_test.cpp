// Sampler: a permutation per (seed, epoch); data-parallel ranks together cover every window once
// per epoch; resuming at the same or another data-parallel size continues the same stream.
#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "support/catch.hpp"

#include "quintet/data/sampler.hpp"

using namespace quintet;
using namespace quintet::data;

namespace {

// The samples rank r of R reads in `steps` steps from start.
std::vector<SampleRef> run(std::uint64_t windows, std::uint64_t seed, std::int64_t batch, int r,
                           int R, SamplerState start, std::uint64_t steps) {
  SamplerConfig c;
  c.seed = seed;
  c.batch_size = batch;
  c.dp_rank = r;
  c.dp_size = R;
  c.start = start;
  const Sampler s(windows, c);
  std::vector<SampleRef> out;
  for (std::uint64_t n = 0; n < steps; ++n) {
    for (const SampleRef& ref : s.batch(n)) out.push_back(ref);
  }
  return out;
}

}  // namespace

TEST_CASE("the permutation is a bijection that depends on seed and epoch") {
  for (std::uint64_t w : {1, 2, 3, 7, 64, 65, 1000, 4097}) {
    SamplerConfig c;
    c.seed = 99;
    const Sampler s(w, c);
    std::vector<std::uint64_t> p0(w), p1(w);
    for (std::uint64_t i = 0; i < w; ++i) {
      p0[i] = s.permute(0, i);
      p1[i] = s.permute(1, i);
    }
    std::vector<std::uint64_t> sorted = p0;
    std::sort(sorted.begin(), sorted.end());
    for (std::uint64_t i = 0; i < w; ++i) REQUIRE(sorted[i] == i);
    if (w >= 64) {
      CHECK(p0 != p1);  // another epoch, another order
      SamplerConfig other = c;
      other.seed = 100;
      const Sampler s2(w, other);
      std::uint64_t same = 0;
      for (std::uint64_t i = 0; i < w; ++i) same += s2.permute(0, i) == p0[i];
      CHECK(same < w / 8);  // unrelated orders agree at ~1 place
    }
  }
  SamplerConfig ordered;
  ordered.shuffle = false;
  const Sampler s(10, ordered);
  for (std::uint64_t i = 0; i < 10; ++i) CHECK(s.permute(3, i) == i);
}

TEST_CASE("over one epoch the ranks together read every window exactly once") {
  const std::uint64_t W = 120;
  for (int R = 1; R <= 4; ++R) {
    for (std::int64_t B : {5, 7}) {
      const std::uint64_t per_step = static_cast<std::uint64_t>(B) * R;
      const std::uint64_t steps = (W + per_step - 1) / per_step + 1;  // past the epoch's end
      std::map<std::uint64_t, int> count;                             // epoch 0 windows
      std::map<std::uint64_t, std::uint64_t> epoch1;  // position -> window in epoch 1
      for (int r = 0; r < R; ++r) {
        for (const SampleRef& s : run(W, 7, B, r, R, {}, steps)) {
          REQUIRE(s.window == run(W, 7, 1, 0, 1, {s.epoch, s.position}, 1)[0].window);
          if (s.epoch == 0)
            ++count[s.window];
          else
            epoch1[s.position] = s.window;
        }
      }
      INFO("R = " << R << ", B = " << B);
      REQUIRE(count.size() == W);
      for (const auto& [w, n] : count) REQUIRE(n == 1);
      // The overflow continues at epoch 1's position 0, 1, 2, ...
      std::uint64_t expect_pos = 0;
      for (const auto& [pos, w] : epoch1) CHECK(pos == expect_pos++);
      CHECK(expect_pos == steps * per_step - W);
    }
  }
}

TEST_CASE("state_after and resuming at the same or another data-parallel size") {
  const std::uint64_t W = 97;
  const std::int64_t B = 3;
  // Uninterrupted: R = 2 for 30 steps (180 samples: epoch 0 and 83 of epoch 1).
  std::multiset<std::pair<std::uint64_t, std::uint64_t>> full;  // (epoch, window)
  for (int r = 0; r < 2; ++r) {
    for (const SampleRef& s : run(W, 5, B, r, 2, {}, 30)) full.insert({s.epoch, s.window});
  }
  for (std::uint64_t k : {0, 1, 11, 16, 17}) {
    SamplerConfig c;
    c.seed = 5;
    c.batch_size = B;
    c.dp_size = 2;
    const SamplerState st = Sampler(W, c).state_after(k);
    CHECK(st.epoch * W + st.sample_index == k * 6);
    // Same size: the resumed run's batch n equals the uninterrupted run's batch k + n.
    for (int r = 0; r < 2; ++r) {
      const auto whole = run(W, 5, B, r, 2, {}, k + 3);
      const auto resumed = run(W, 5, B, r, 2, st, 3);
      for (std::size_t i = 0; i < resumed.size(); ++i) {
        CHECK(resumed[i].window == whole[k * B + i].window);
        CHECK(resumed[i].epoch == whole[k * B + i].epoch);
      }
    }
    // Another size (R = 3, B = 2: also 6 samples a step): together the first k steps at R = 2
    // and the rest at R = 3 read exactly the samples of the uninterrupted run.
    std::multiset<std::pair<std::uint64_t, std::uint64_t>> mixed;
    for (int r = 0; r < 2; ++r) {
      for (const SampleRef& s : run(W, 5, B, r, 2, {}, k)) mixed.insert({s.epoch, s.window});
    }
    for (int r = 0; r < 3; ++r) {
      for (const SampleRef& s : run(W, 5, 2, r, 3, st, 30 - k)) mixed.insert({s.epoch, s.window});
    }
    CHECK(mixed == full);
  }
}

TEST_CASE("bad sampler arguments are rejected") {
  SamplerConfig c;
  REQUIRE_THROWS_QUINTET(Sampler(0, c), InvalidArgument, "no window");
  c.dp_rank = 2;
  c.dp_size = 2;
  REQUIRE_THROWS_QUINTET(Sampler(10, c), InvalidArgument, "rank 2 must be in [0, dp_size = 2)");
  c.dp_rank = 0;
  c.start.sample_index = 10;
  REQUIRE_THROWS_QUINTET(Sampler(10, c), InvalidArgument,
                         "start sample_index 10 must be < the "
                         "number of windows 10");
}
