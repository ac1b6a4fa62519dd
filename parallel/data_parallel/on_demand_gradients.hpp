// OnDemandGradients: the gradient memory of ZeRO-2 (a private part of DataParallel, see
// data_parallel.hpp). The store keeps no full gradient buffer: a bucket's f32 gradient exists only
// from the moment backward first asks for one of its parameters' gradients (need(): a zeroed
// buffer of the bucket's padded size, bound to its parameters) until its reduce-scatter has been
// issued (issued(): unbound and released; the communicator holds the memory until it has read it).
// Each bucket's reduction lands in its persistent shard (the first reduction of a step) or in a
// scratch shard (later microbatches), which is added into the shard before the next reduction of
// that bucket or in fold().
//
// Contract: every call on the compute thread; buffers are allocated, zeroed and folded on the
// compute stream given to the constructor (fold: on the stream given). Sizes in elements of the
// store's gradient dtype, memory in bytes. The store and the bucket list must outlive this.
#pragma once

#include <cstdint>
#include <vector>

#include "quintet/collectives/work.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/data_parallel/bucket_plan.hpp"

namespace quintet::data_parallel {

class OnDemandGradients {
 public:
  // Allocates and zeroes one shard per bucket on compute. Releasing the store's gradient buffer
  // (ParameterStore::release_gradient_buffer, whose binder calls need()) is the owner's part.
  OnDemandGradients(nn::ParameterStore& store, const std::vector<GradientBucket>& buckets,
                    const Stream& compute);

  // Backward asks for the gradient of p, in bucket b: binds the bucket's buffer unless it is bound.
  // Throws InvalidArgument when b was already reduced in this microbatch.
  void need(int b, const nn::Parameter& p);
  // The gradient bucket b reduces now: its bound buffer ([padded_numel]), bound here (zeros) when
  // backward never asked for it.
  Tensor gradient(int b);
  // Where bucket b's reduce-scatter lands ([shard_size]): the shard for its first reduction of the
  // step; after that scratch, once the previous reduction's result has been added into the shard.
  Tensor output(int b);
  // Bucket b's reduce-scatter into output(b) was issued as `work`: unbinds and releases its buffer
  // and closes the bucket for this microbatch.
  void issued(int b, const Work& work);
  // Adds every scratch result not folded yet into its shard, on stream (after waiting for it).
  void fold(const Stream& stream);
  // A new microbatch: every bucket may be asked for again.
  void new_round();
  // A new step: the first reduction of each bucket lands in its shard again.
  void begin_step();

  // Bucket b's reduced shard, [shard_size].
  const Tensor& shard(int b) const { return shard_[static_cast<std::size_t>(b)]; }
  // Bytes kept from step to step (shards and scratch shards), and the most bytes (those plus the
  // bound buffers) held at once since begin_step().
  std::int64_t resident_bytes() const { return resident_; }
  std::int64_t peak_bytes() const { return peak_; }

 private:
  void bind(int b);
  void fold(int b, const Stream& stream);
  void note_peak();

  nn::ParameterStore& store_;
  const std::vector<GradientBucket>& buckets_;
  const Stream& compute_;
  std::vector<Tensor> full_;     // padded gradient while bound (this microbatch), else undefined
  std::vector<Tensor> shard_;    // [shard_size] the reduced owned shard, summed over microbatches
  std::vector<Tensor> scratch_;  // [shard_size] a later microbatch's reduction, added into shard
  std::vector<Work> pending_;    // the reduction into scratch not added yet (if is_pending_)
  std::vector<char> is_pending_;
  std::vector<char> to_scratch_;  // output() gave scratch: the reduction issued next lands there
  std::vector<char> reduced_;     // reduced at least once this step: later ones go to scratch
  std::vector<char> closed_;      // reduced in this microbatch: its gradient may not be asked again
  std::int64_t bound_ = 0;        // bytes of bucket buffers bound now
  std::int64_t resident_ = 0;
  std::int64_t peak_ = 0;
};

}  // namespace quintet::data_parallel
