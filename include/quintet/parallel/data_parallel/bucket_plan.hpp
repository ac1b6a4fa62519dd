// BucketPlan: how data parallelism cuts one model chunk's flat gradient buffer into buckets, which
// group each bucket is reduced over, and which slice of it each rank owns under ZeRO. A pure value
// computed from the parameters' layout, the bucket sizes and the group sizes: no process,
// communicator or device is involved (like Layout), so any cut can be inspected and tested
// offline. DataParallel (data_parallel.hpp) plans with it and reduces the buckets it describes.
//
// Buckets. The parameters are taken in buffer (backward) order; a parameter's size in the buffer is
// its numel rounded up to align_elements. A bucket is a run of consecutive parameters of one
// gradient group. Parameter p joins the current bucket when it has the same group and
//   (bucket's elements + p's aligned size) * element_bytes <= limit,
// where limit is first_bucket_bytes while the current bucket is the first one (index 0) and
// bucket_bytes after; otherwise p starts a new bucket (so a parameter larger than the limit gets a
// bucket of its own). A tied parameter (one copy of a weight tied across chunks, see
// nn::TiedRole) always gets a bucket of its own, so that its two copies, in two stores, have the
// same ZeRO shards. A bucket spans the elements [first parameter's offset, last parameter's
// offset + its aligned size): the alignment padding after each parameter is in it.
//
// Groups. A parameter's attributes pick the group its gradient is reduced over:
//   dense                              Axis::dp_cp   (mean)
//   dense with reduce_over_tp, tp > 1  Axis::tp_dp_cp (sum of the gradient pre-scaled by
//                                      1/|dp_cp|: partial sums over tp, mean over dp_cp)
//   dense with reduce_over_tp, tp = 1  Axis::dp_cp
//   expert (is_expert)                 Axis::edp     (sum of the gradient pre-scaled by 1/|dp_cp|:
//                                      the mean over the dense replicas whose tokens each expert
//                                      saw); with reduce_over_tp: InvalidArgument
// Buckets never mix groups.
//
// ZeRO shards. A bucket of n elements over a group of S ranks is padded to L = S * ceil(n / S)
// elements; the group's rank r owns elements [r * L/S, (r + 1) * L/S) of it, clipped to n (a rank
// may own fewer elements than L/S, or none). The plan fills the shard fields for every ZeRO stage
// (stage 0 does not use them): the cut itself does not depend on the stage.
//
// Worked example: three dense parameters of 10, 100 and 30 f32 elements at offsets 0, 64, 192
// (align 64), first_bucket_bytes = 256, bucket_bytes = 1024, dp_cp of 3 ranks, this rank 2:
//   bucket 0: [0, 64)    param 0           (64 * 4 = 256 <= 256; adding 128 elements would not fit)
//   bucket 1: [64, 256)  params 1, 2       ((128 + 64) * 4 = 768 <= 1024)
//   bucket 1 shards: n = 192, L = 192, 64 each; rank 2 owns [64 + 128, 64 + 192) = [192, 256).
//
// Thread safety: a BucketPlan is immutable after construction; share it freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quintet/core/axis.hpp"
#include "quintet/nn/parameter.hpp"

namespace quintet {
class Layout;
class Mesh;
}  // namespace quintet

namespace quintet::data_parallel {

// What the plan needs to know of one parameter (elements of the flat buffers).
struct BucketParameter {
  std::string name;             // for messages
  std::int64_t offset = 0;      // first element in the flat buffer
  std::int64_t numel = 0;       // elements (before alignment)
  bool is_expert = false;       // nn::ParameterAttributes::is_expert
  bool reduce_over_tp = false;  // nn::ParameterAttributes::reduce_over_tp
  bool tied = false;            // nn::ParameterAttributes::tied != none: a bucket of its own
};

// Where the buckets are cut.
struct BucketSizes {
  std::int64_t first_bucket_bytes = 1 << 20;  // bytes of gradient in the first bucket; > 0
  std::int64_t bucket_bytes = 25 << 20;       // bytes of gradient in later buckets; > 0
  std::int64_t element_bytes = 4;             // bytes per gradient element (f32: 4, f64: 8); > 0
  std::int64_t align_elements = nn::ParameterStore::kAlignElements;  // > 0
};

// The groups one rank's gradients reduce over: each group's size and this rank's index in it.
struct GradientGroups {
  struct Group {
    int size = 1;
    int rank = 0;  // this rank's index in the group, 0 .. size-1
  };
  int tp = 1;      // the tensor-parallel size (reduce_over_tp needs tp_dp_cp only when tp > 1)
  Group dp_cp;     // dense gradients
  Group tp_dp_cp;  // dense gradients with reduce_over_tp
  Group edp;       // expert gradients

  // The groups of global rank `rank` of a layout; of this rank of a mesh (its communicators'
  // sizes and ranks, which are the layout's).
  static GradientGroups of(const Layout& layout, int rank);
  static GradientGroups of(const Mesh& mesh);
  // The group of Axis::dp_cp, tp_dp_cp or edp; throws InvalidArgument for another axis.
  const Group& group(Axis axis) const;
};

// One bucket of the gradient buffer (element offsets into the store's flat buffers).
struct GradientBucket {
  std::int64_t begin = 0;   // first element (the first parameter's offset)
  std::int64_t end = 0;     // one past the last element (includes alignment padding)
  Axis axis = Axis::dp_cp;  // the group it is reduced (and, for ZeRO, sharded) over
  int first_param = 0;      // its parameters are [first_param, first_param + num_params) in the
  int num_params = 0;       // plan's (buffer) order
  std::vector<nn::Parameter*> params;  // in buffer order; empty when planned without a store
  // ZeRO layout (also filled for stage 0, where it is unused): group size, this rank's index in
  // it, elements per shard (padded size / shard_count). This rank owns the flat elements
  // [owned_begin(), owned_end()).
  int shard_count = 1;
  int shard_rank = 0;
  std::int64_t shard_size = 0;
  std::int64_t numel() const { return end - begin; }
  std::int64_t padded_numel() const { return shard_size * shard_count; }  // L above
  // The flat elements the group's rank r owns, clipped to the bucket (begin == end: none).
  std::int64_t shard_begin(int r) const;
  std::int64_t shard_end(int r) const;
  std::int64_t owned_begin() const { return shard_begin(shard_rank); }
  std::int64_t owned_end() const { return shard_end(shard_rank); }
};

class BucketPlan {
 public:
  // Plans params (in buffer order, offsets increasing). Throws InvalidArgument for a size that is
  // not positive, a parameter that starts before the previous one's aligned end or has a negative
  // numel, an expert parameter that asks for reduce_over_tp, or a group whose size is < 1 or whose
  // rank is out of range.
  BucketPlan(std::vector<BucketParameter> params, const BucketSizes& sizes,
             const GradientGroups& groups);
  // The plan of a store's parameters (element bytes of its gradient dtype, kAlignElements), with
  // GradientBucket::params filled.
  BucketPlan(const nn::ParameterStore& store, std::int64_t first_bucket_bytes,
             std::int64_t bucket_bytes, const GradientGroups& groups);

  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  const std::vector<BucketParameter>& parameters() const { return params_; }
  const GradientGroups& groups() const { return groups_; }
  const BucketSizes& sizes() const { return sizes_; }
  // The bucket that holds parameter i (an index into parameters()).
  int bucket_of(int i) const { return bucket_of_.at(static_cast<std::size_t>(i)); }

  // The group a parameter with these attributes reduces over when the tensor-parallel size is tp
  // (the table above); throws InvalidArgument naming `name` for an expert with reduce_over_tp.
  static Axis group_axis(const BucketParameter& p, int tp);

 private:
  std::vector<BucketParameter> params_;
  BucketSizes sizes_;
  GradientGroups groups_;
  std::vector<GradientBucket> buckets_;
  std::vector<int> bucket_of_;
};

}  // namespace quintet::data_parallel
