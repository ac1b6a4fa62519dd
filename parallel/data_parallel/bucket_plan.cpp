// BucketPlan: the bucket cut, the group of each bucket and its ZeRO shards (see bucket_plan.hpp).
#include "quintet/parallel/data_parallel/bucket_plan.hpp"

#include <algorithm>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/mesh.hpp"

namespace quintet::data_parallel {

namespace {

GradientGroups::Group layout_group(const Layout& layout, Axis axis, int rank) {
  return {layout.group_size(axis), layout.index_in_group(axis, rank)};
}

void check_group(const GradientGroups::Group& g, Axis axis) {
  QUINTET_CHECK(g.size >= 1 && g.rank >= 0 && g.rank < g.size,
                "BucketPlan: the '{}' group has size {} and this rank at index {}; expected a "
                "size >= 1 and an index in [0, size)",
                axis_name(axis), g.size, g.rank);
}

}  // namespace

GradientGroups GradientGroups::of(const Layout& layout, int rank) {
  GradientGroups g;
  g.tp = layout.group_size(Axis::tp);
  g.dp_cp = layout_group(layout, Axis::dp_cp, rank);
  g.tp_dp_cp = layout_group(layout, Axis::tp_dp_cp, rank);
  g.edp = layout_group(layout, Axis::edp, rank);
  return g;
}

GradientGroups GradientGroups::of(const Mesh& mesh) {
  GradientGroups g;
  g.tp = mesh.size(Axis::tp);
  g.dp_cp = {mesh.size(Axis::dp_cp), mesh.rank(Axis::dp_cp)};
  g.tp_dp_cp = {mesh.size(Axis::tp_dp_cp), mesh.rank(Axis::tp_dp_cp)};
  g.edp = {mesh.size(Axis::edp), mesh.rank(Axis::edp)};
  return g;
}

const GradientGroups::Group& GradientGroups::group(Axis axis) const {
  switch (axis) {
    case Axis::dp_cp:
      return dp_cp;
    case Axis::tp_dp_cp:
      return tp_dp_cp;
    case Axis::edp:
      return edp;
    default:
      break;
  }
  QUINTET_THROW(InvalidArgument,
                "GradientGroups: gradients reduce over dp_cp, tp_dp_cp or edp, not '{}'",
                axis_name(axis));
}

std::int64_t GradientBucket::shard_begin(int r) const {
  return std::min(end, begin + static_cast<std::int64_t>(r) * shard_size);
}
std::int64_t GradientBucket::shard_end(int r) const {
  return std::min(end, begin + static_cast<std::int64_t>(r + 1) * shard_size);
}

Axis BucketPlan::group_axis(const BucketParameter& p, int tp) {
  if (p.is_expert) {
    QUINTET_CHECK(!p.reduce_over_tp,
                  "DataParallel: expert parameter {} asks for reduce_over_tp; expert weights are "
                  "reduced over edp only (an expert norm replicated over etp is not supported)",
                  p.name);
    return Axis::edp;
  }
  return p.reduce_over_tp && tp > 1 ? Axis::tp_dp_cp : Axis::dp_cp;
}

BucketPlan::BucketPlan(std::vector<BucketParameter> params, const BucketSizes& sizes,
                       const GradientGroups& groups)
    : params_(std::move(params)), sizes_(sizes), groups_(groups) {
  QUINTET_CHECK(sizes.first_bucket_bytes > 0 && sizes.bucket_bytes > 0 && sizes.element_bytes > 0 &&
                    sizes.align_elements > 0,
                "BucketPlan: sizes first_bucket_bytes = {}, bucket_bytes = {}, element_bytes = "
                "{}, align_elements = {}; each must be positive",
                sizes.first_bucket_bytes, sizes.bucket_bytes, sizes.element_bytes,
                sizes.align_elements);
  QUINTET_CHECK(groups.tp >= 1, "BucketPlan: tensor-parallel size {}; expected >= 1", groups.tp);
  check_group(groups.dp_cp, Axis::dp_cp);
  check_group(groups.tp_dp_cp, Axis::tp_dp_cp);
  check_group(groups.edp, Axis::edp);
  auto aligned = [&](std::int64_t n) {
    const std::int64_t a = sizes.align_elements;
    return (n + a - 1) / a * a;
  };
  std::int64_t previous_end = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const BucketParameter& p = params_[i];
    QUINTET_CHECK(p.numel >= 0 && p.offset >= previous_end,
                  "BucketPlan: parameter {} has {} elements at offset {}; expected numel >= 0 and "
                  "an offset at or after the previous parameter's aligned end ({}), in buffer "
                  "order",
                  p.name, p.numel, p.offset, previous_end);
    const Axis axis = group_axis(p, groups.tp);
    const std::int64_t size = aligned(p.numel);
    // The first bucket closes at its own (small) limit; later buckets at bucket_bytes.
    const std::int64_t limit = buckets_.size() <= 1 ? sizes.first_bucket_bytes : sizes.bucket_bytes;
    GradientBucket* cur = buckets_.empty() ? nullptr : &buckets_.back();
    const bool alone = p.tied || (i > 0 && params_[i - 1].tied);
    const bool fits = cur != nullptr && !alone && cur->axis == axis &&
                      (cur->numel() + size) * sizes.element_bytes <= limit;
    if (!fits) {
      GradientBucket b;
      b.begin = p.offset;
      b.end = b.begin;
      b.axis = axis;
      b.first_param = static_cast<int>(i);
      buckets_.push_back(std::move(b));
      cur = &buckets_.back();
    }
    cur->num_params += 1;
    cur->end = p.offset + size;
    previous_end = cur->end;
    bucket_of_.push_back(static_cast<int>(buckets_.size()) - 1);
  }
  for (GradientBucket& b : buckets_) {
    const GradientGroups::Group& g = groups.group(b.axis);
    b.shard_count = g.size;
    b.shard_rank = g.rank;
    b.shard_size = (b.numel() + b.shard_count - 1) / b.shard_count;
  }
}

namespace {

std::vector<BucketParameter> describe(const nn::ParameterStore& store) {
  std::vector<BucketParameter> out;
  for (const nn::Parameter* p : store.parameters()) {
    const nn::ParameterAttributes& a = p->attributes();
    out.push_back({p->name(), p->offset(), p->numel(), a.is_expert, a.reduce_over_tp,
                   a.tied != nn::TiedRole::none});
  }
  return out;
}

}  // namespace

BucketPlan::BucketPlan(const nn::ParameterStore& store, std::int64_t first_bucket_bytes,
                       std::int64_t bucket_bytes, const GradientGroups& groups)
    : BucketPlan(describe(store),
                 BucketSizes{first_bucket_bytes, bucket_bytes,
                             static_cast<std::int64_t>(dtype_size(nn::accum_dtype(store.dtype()))),
                             nn::ParameterStore::kAlignElements},
                 groups) {
  const std::vector<nn::Parameter*>& params = store.parameters();
  for (GradientBucket& b : buckets_) {
    b.params.assign(params.begin() + b.first_param, params.begin() + b.first_param + b.num_params);
  }
}

}  // namespace quintet::data_parallel
