// BucketPlan with no process: bucket boundaries (alignment padding included), the small first
// bucket, a parameter larger than a bucket, groups never mixed (dense / reduce_over_tp / expert),
// ZeRO shard ranges with padding when sizes do not divide, groups from a Layout, and bad input.
// Every expected value is worked out by hand in the comments next to it.
#include <string>
#include <vector>

#include "quintet/parallel/data_parallel/bucket_plan.hpp"
#include "quintet/parallel/layout.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

// Parameters laid out back to back as a ParameterStore does: each at the previous one's end
// rounded up to 64 elements.
std::vector<data_parallel::BucketParameter> packed(const std::vector<std::int64_t>& numels,
                                                   const std::vector<char>& kinds = {}) {
  std::vector<data_parallel::BucketParameter> out;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    data_parallel::BucketParameter p;
    p.name = "p" + std::to_string(i);
    p.offset = offset;
    p.numel = numels[i];
    // d dense, t reduce_over_tp, e expert, w tied (one copy of a weight tied across chunks)
    const char kind = kinds.empty() ? 'd' : kinds[i];
    p.reduce_over_tp = kind == 't';
    p.is_expert = kind == 'e';
    p.tied = kind == 'w';
    out.push_back(p);
    offset += (numels[i] + 63) / 64 * 64;
  }
  return out;
}

data_parallel::BucketSizes sizes(std::int64_t first, std::int64_t rest) {
  data_parallel::BucketSizes s;
  s.first_bucket_bytes = first;
  s.bucket_bytes = rest;
  return s;  // f32 (4 bytes), align 64
}

data_parallel::GradientGroups groups(int dp, int rank, int tp = 1, int edp = 1, int edp_rank = 0) {
  data_parallel::GradientGroups g;
  g.tp = tp;
  g.dp_cp = {dp, rank};
  g.tp_dp_cp = {tp * dp, rank};
  g.edp = {edp, edp_rank};
  return g;
}

struct Expected {
  std::int64_t begin, end;
  int first_param, num_params;
  Axis axis;
};

void check_buckets(const data_parallel::BucketPlan& plan, const std::vector<Expected>& want) {
  const std::vector<data_parallel::GradientBucket>& got = plan.buckets();
  REQUIRE(got.size() == want.size());
  for (std::size_t b = 0; b < want.size(); ++b) {
    INFO("bucket " << b);
    CHECK(got[b].begin == want[b].begin);
    CHECK(got[b].end == want[b].end);
    CHECK(got[b].first_param == want[b].first_param);
    CHECK(got[b].num_params == want[b].num_params);
    CHECK(got[b].axis == want[b].axis);
    CHECK(got[b].params.empty());  // planned without a store
    for (int i = want[b].first_param; i < want[b].first_param + want[b].num_params; ++i) {
      CHECK(plan.bucket_of(i) == static_cast<int>(b));
    }
  }
}

}  // namespace

TEST_CASE("bucket plan: the header's worked example") {
  // 10, 100, 30 elements at offsets 0, 64, 192 (aligned sizes 64, 128, 64).
  const data_parallel::BucketPlan plan(packed({10, 100, 30}), sizes(256, 1024), groups(3, 2));
  // Bucket 0 = p0: 64 * 4 = 256 fits the 256-byte first bucket; p0 + p1 = 192 * 4 = 768 does not.
  // Bucket 1 = p1 + p2: (128 + 64) * 4 = 768 <= 1024.
  check_buckets(plan, {{0, 64, 0, 1, Axis::dp_cp}, {64, 256, 1, 2, Axis::dp_cp}});
  const data_parallel::GradientBucket& b = plan.buckets()[1];
  // n = 192 over 3 ranks: 64 each, no padding; rank 2 owns [64 + 128, 64 + 192).
  CHECK(b.shard_count == 3);
  CHECK(b.shard_rank == 2);
  CHECK(b.shard_size == 64);
  CHECK(b.padded_numel() == 192);
  CHECK(b.owned_begin() == 192);
  CHECK(b.owned_end() == 256);
}

TEST_CASE("bucket plan: boundaries with alignment padding and the first small bucket") {
  // Aligned sizes: 1 -> 64, 64 -> 64, 65 -> 128, 200 -> 256, 3 -> 64, 64 -> 64; offsets 0, 64,
  // 128, 256, 512, 576; end 640.
  const std::vector<data_parallel::BucketParameter> params = packed({1, 64, 65, 200, 3, 64});
  SECTION("first bucket 512 bytes (128 elements), later 2048 bytes (512 elements)") {
    const data_parallel::BucketPlan plan(params, sizes(512, 2048), groups(2, 0));
    // First: p0 (64) + p1 (64) = 128 elements = 512 bytes fits; + p2 would be 256 elements.
    // Then p2 (128) + p3 (256) + p4 (64) + p5 (64) = 512 elements = 2048 bytes: all fit.
    check_buckets(plan, {{0, 128, 0, 2, Axis::dp_cp}, {128, 640, 2, 4, Axis::dp_cp}});
  }
  SECTION("later buckets 1024 bytes (256 elements)") {
    const data_parallel::BucketPlan plan(params, sizes(512, 1024), groups(2, 0));
    // p2 (128) alone: + p3 would be 384 elements. p3 (256) alone: exactly 256, + p4 exceeds.
    // p4 + p5 = 128 elements.
    check_buckets(plan, {{0, 128, 0, 2, Axis::dp_cp},
                         {128, 256, 2, 1, Axis::dp_cp},
                         {256, 512, 3, 1, Axis::dp_cp},
                         {512, 640, 4, 2, Axis::dp_cp}});
  }
  SECTION("a first bucket smaller than any parameter still holds the first one") {
    const data_parallel::BucketPlan plan(params, sizes(4, 1 << 20), groups(1, 0));
    check_buckets(plan, {{0, 64, 0, 1, Axis::dp_cp}, {64, 640, 1, 5, Axis::dp_cp}});
  }
}

TEST_CASE("bucket plan: a parameter larger than a bucket gets its own") {
  // Aligned: 64, 1024 (1000), 64; offsets 0, 64, 1088; end 1152. Buckets of 256 elements.
  const data_parallel::BucketPlan plan(packed({64, 1000, 10}), sizes(1024, 1024), groups(4, 1));
  check_buckets(
      plan,
      {{0, 64, 0, 1, Axis::dp_cp}, {64, 1088, 1, 1, Axis::dp_cp}, {1088, 1152, 2, 1, Axis::dp_cp}});
  // The big bucket: n = 1024 over 4: 256 each; rank 1 owns [64 + 256, 64 + 512).
  const data_parallel::GradientBucket& big = plan.buckets()[1];
  CHECK(big.shard_size == 256);
  CHECK(big.owned_begin() == 320);
  CHECK(big.owned_end() == 576);
}

TEST_CASE("bucket plan: a tied parameter always has a bucket of its own") {
  // Five small dense parameters of 64 elements; all would fit one 4096-byte bucket.
  const data_parallel::BucketPlan plan(packed({64, 64, 64, 64, 64}, {'d', 'w', 'd', 'd', 'w'}),
                                       sizes(4096, 4096), groups(3, 1));
  check_buckets(plan, {{0, 64, 0, 1, Axis::dp_cp},
                       {64, 128, 1, 1, Axis::dp_cp},
                       {128, 256, 2, 2, Axis::dp_cp},
                       {256, 320, 4, 1, Axis::dp_cp}});
  // Its shards depend on nothing but its own size: the same in any store that holds it.
  const data_parallel::BucketPlan alone(packed({64}, {'w'}), sizes(4096, 4096), groups(3, 1));
  CHECK(alone.buckets()[0].owned_end() - alone.buckets()[0].owned_begin() ==
        plan.buckets()[1].owned_end() - plan.buckets()[1].owned_begin());
  CHECK(alone.buckets()[0].owned_begin() == plan.buckets()[1].owned_begin() - 64);
}

TEST_CASE("bucket plan: groups are never mixed") {
  // Kinds d d t e e d, all 64 elements (offsets 0, 64, ..., 320); buckets large enough for all.
  const std::vector<data_parallel::BucketParameter> params =
      packed({64, 64, 64, 64, 64, 64}, {'d', 'd', 't', 'e', 'e', 'd'});
  SECTION("tp = 2: reduce_over_tp goes over tp_dp_cp, experts over edp") {
    const data_parallel::BucketPlan plan(params, sizes(1 << 20, 1 << 20), groups(3, 1, 2, 2, 1));
    check_buckets(plan, {{0, 128, 0, 2, Axis::dp_cp},
                         {128, 192, 2, 1, Axis::tp_dp_cp},
                         {192, 320, 3, 2, Axis::edp},
                         {320, 384, 5, 1, Axis::dp_cp}});
    // Shards follow each bucket's own group: tp_dp_cp of 6 (rank 1), edp of 2 (rank 1).
    const data_parallel::GradientBucket& tp_bucket = plan.buckets()[1];
    CHECK(tp_bucket.shard_count == 6);
    CHECK(tp_bucket.shard_rank == 1);
    CHECK(tp_bucket.shard_size == 11);  // ceil(64 / 6)
    const data_parallel::GradientBucket& expert = plan.buckets()[2];
    CHECK(expert.shard_count == 2);
    CHECK(expert.shard_rank == 1);
    CHECK(expert.shard_size == 64);
    CHECK(expert.owned_begin() == 256);
    CHECK(expert.owned_end() == 320);
  }
  SECTION("tp = 1: reduce_over_tp is plain dense and joins its neighbours") {
    const data_parallel::BucketPlan plan(params, sizes(1 << 20, 1 << 20), groups(3, 1));
    check_buckets(
        plan,
        {{0, 192, 0, 3, Axis::dp_cp}, {192, 320, 3, 2, Axis::edp}, {320, 384, 5, 1, Axis::dp_cp}});
  }
  CHECK(data_parallel::BucketPlan::group_axis(params[0], 2) == Axis::dp_cp);
  CHECK(data_parallel::BucketPlan::group_axis(params[2], 2) == Axis::tp_dp_cp);
  CHECK(data_parallel::BucketPlan::group_axis(params[2], 1) == Axis::dp_cp);
  CHECK(data_parallel::BucketPlan::group_axis(params[3], 2) == Axis::edp);
}

TEST_CASE("bucket plan: ZeRO shard ranges pad when the group size does not divide") {
  // Alignment 1, so that the bucket is exactly the parameter's 10 elements (at offset 100).
  data_parallel::BucketSizes s = sizes(1 << 20, 1 << 20);
  s.align_elements = 1;
  std::vector<data_parallel::BucketParameter> params(1);
  params[0].name = "w";
  params[0].offset = 100;
  params[0].numel = 10;
  // n = 10 over S = 4: L = 4 * ceil(10 / 4) = 12, shard 3. Ranks own [100, 103), [103, 106),
  // [106, 109), [109, 110) (the last clipped from [109, 112) to n).
  const std::int64_t begins[] = {100, 103, 106, 109};
  const std::int64_t ends[] = {103, 106, 109, 110};
  for (int r = 0; r < 4; ++r) {
    const data_parallel::BucketPlan plan(params, s, groups(4, r));
    REQUIRE(plan.buckets().size() == 1);
    const data_parallel::GradientBucket& b = plan.buckets()[0];
    CHECK(b.begin == 100);
    CHECK(b.end == 110);
    CHECK(b.shard_size == 3);
    CHECK(b.padded_numel() == 12);
    CHECK(b.owned_begin() == begins[r]);
    CHECK(b.owned_end() == ends[r]);
    CHECK(b.shard_begin(r) == begins[r]);
    CHECK(b.shard_end(r) == ends[r]);
  }
  // n = 4 over S = 6: shard 1, L = 6; ranks 4 and 5 own nothing ([104, 104)).
  params[0].numel = 4;
  const data_parallel::BucketPlan small(params, s, groups(6, 5));
  const data_parallel::GradientBucket& b = small.buckets()[0];
  CHECK(b.shard_size == 1);
  CHECK(b.padded_numel() == 6);
  CHECK(b.shard_begin(3) == 103);
  CHECK(b.shard_end(3) == 104);
  CHECK(b.owned_begin() == 104);
  CHECK(b.owned_end() == 104);
}

TEST_CASE("bucket plan: f64 gradients halve the elements per bucket") {
  data_parallel::BucketSizes s = sizes(512, 512);
  s.element_bytes = 8;  // 512 bytes = 64 elements
  const data_parallel::BucketPlan plan(packed({64, 64, 64}), s, groups(1, 0));
  check_buckets(
      plan,
      {{0, 64, 0, 1, Axis::dp_cp}, {64, 128, 1, 1, Axis::dp_cp}, {128, 192, 2, 1, Axis::dp_cp}});
}

TEST_CASE("gradient groups from a layout") {
  // 8 ranks, tp = 2, dp = 4 (order tp-cp-ep-dp-pp): rank 5 = (t 1, d 2); dp_cp group {1, 3, 5, 7}
  // (index 2); tp_dp_cp is the whole world (index 5). ep = 2, etp = 1: edp = 8 / 2 = 4; experts
  // at (etp 0, ep e, edp d) = e + 2 * d: rank 5 = (e 1, d 2), edp group {1, 3, 5, 7}, index 2.
  ParallelConfig c;
  c.tp = 2;
  c.ep = 2;
  c.etp = 1;
  const Layout layout(c, 8);
  const data_parallel::GradientGroups g = data_parallel::GradientGroups::of(layout, 5);
  CHECK(g.tp == 2);
  CHECK(g.dp_cp.size == 4);
  CHECK(g.dp_cp.rank == 2);
  CHECK(g.tp_dp_cp.size == 8);
  CHECK(g.tp_dp_cp.rank == 5);
  CHECK(g.edp.size == 4);
  CHECK(g.edp.rank == 2);
  CHECK(&g.group(Axis::edp) == &g.edp);
  REQUIRE_THROWS_QUINTET(g.group(Axis::tp), InvalidArgument, "not 'tp'");
}

TEST_CASE("bucket plan: bad input is rejected") {
  REQUIRE_THROWS_QUINTET(data_parallel::BucketPlan(packed({8}, {'x'}), sizes(0, 64), groups(1, 0)),
                         InvalidArgument, "first_bucket_bytes = 0");
  std::vector<data_parallel::BucketParameter> expert_tp = packed({8});
  expert_tp[0].is_expert = true;
  expert_tp[0].reduce_over_tp = true;
  REQUIRE_THROWS_QUINTET(data_parallel::BucketPlan(expert_tp, sizes(64, 64), groups(2, 0, 2)),
                         InvalidArgument, "asks for reduce_over_tp");
  std::vector<data_parallel::BucketParameter> overlap = packed({100, 10});
  overlap[1].offset = 64;  // inside p0's aligned [0, 128)
  REQUIRE_THROWS_QUINTET(data_parallel::BucketPlan(overlap, sizes(64, 64), groups(1, 0)),
                         InvalidArgument, "aligned end (128)");
  REQUIRE_THROWS_QUINTET(data_parallel::BucketPlan(packed({8}), sizes(64, 64), groups(2, 2)),
                         InvalidArgument, "'dp-cp' group has size 2 and this rank at index 2");
  // No parameters: no buckets.
  CHECK(data_parallel::BucketPlan({}, sizes(64, 64), groups(1, 0)).buckets().empty());
}
