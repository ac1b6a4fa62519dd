// DataParallel: gradient reduction across data-parallel replicas of one model chunk, overlapped
// with backward, with gradient accumulation over microbatches and the gradient half of ZeRO-1/2.
//
// The chunk's f32 gradient buffer (nn::ParameterStore, backward order) is cut into buckets: runs
// of consecutive parameters of one gradient group, the first bucket at most first_bucket_bytes,
// the others at most bucket_bytes (a larger parameter gets a bucket of its own). The cut is a
// BucketPlan (bucket_plan.hpp: the exact rule, a pure function of the store's layout, the config
// and the group sizes), so it is the same on every rank. A parameter's attributes pick its group,
// and so the communicator its bucket reduces over:
//   dense                              mean over Axis::dp_cp (== dp when cp == 1)
//   dense with reduce_over_tp          sum over tp, mean over dp_cp: one reduction over
//                                      Axis::tp_dp_cp of the gradient pre-scaled by 1/|dp_cp|
//                                      (sequence-parallel norm weights: partial sums over tp)
//   expert (is_expert)                 sum over Axis::edp / |dp_cp| (each expert saw the tokens
//                                      of every replica in its ep group)
// Buckets never mix groups. A bucket's reduction (an all-reduce for ZeRO stage 0, a
// reduce-scatter into this rank's shard for stages 1 and 2) starts the moment backward marks its
// last parameter grad-ready, in bucket order (a bucket that becomes ready early waits for the ones
// before it, so every rank issues the same sequence), and runs on the group's communicator while
// the rest of backward computes. finish() starts whatever is left and makes the stream wait for
// all of it. With overlap = false every reduction starts after backward (stages 0, 1: in
// finish(); stage 2: once the microbatch's last gradient is marked): the same reductions,
// serialised, for comparison.
//
// Stages 0 and 1 reduce once per step, during the LAST microbatch's backward; the earlier
// microbatches accumulate into the store's full f32 gradient buffer. Stage 2 keeps no full
// gradient buffer (the store's is released when the DataParallel is built): a bucket's f32
// gradient exists only from the moment backward first asks for one of its parameters'
// gradients (Parameter::grad_for_backward binds a zeroed, padded buffer for the whole bucket)
// until its reduction has read it, and it is reduce-scattered in EVERY microbatch into the
// rank's persistent shard (a later microbatch's result is added to it). So the gradient memory
// of stage 2 is the shards (1/S of the model, twice with accumulation) plus the buckets that
// backward is filling or the communicator is still reading — not the model's size — at the
// price of one reduction per microbatch. A microbatch's round of reductions closes when every
// parameter has been marked grad-ready, or else at the next set_last_microbatch()/finish().
//
// ZeRO shards (stages 1, 2; the ranges are BucketPlan's): a bucket of n elements reduced over a
// group of S ranks is padded to L = S * ceil(n / S) elements; rank r owns elements
// [r * L/S, (r + 1) * L/S) of it (clipped to n). Stage 1 reduce-scatters in place in the gradient
// buffer when S divides n, else through a padded staging buffer (kept per bucket); after finish()
// only the owned part of its buffer is meaningful (the rest holds this rank's unreduced partial
// sums). See distributed_optimizer.hpp for the optimizer half (sharded master weights and
// moments, parameter all-gather).
//
// Measurement (last_step_stats), per step, in milliseconds, through one OverlapMeter
// (parallel/overlap/overlap_meter.hpp; a window per step, its origin marked on the compute stream
// at begin_step): each reduction is an in_flight interval, each wait below an exposed interval.
//   comm_ms     length of the union of the intervals [a bucket's reduction was issued, it
//               completed]. GPU: timing events — the start recorded on the compute stream when the
//               reduction is issued (its inputs are ready there), the end on a side stream made to
//               wait for the reduction's Work. CPU: host clock at issue; the end is the first time
//               the host saw the Work complete (polled at every grad-ready hook and in finish()),
//               so it is late by at most one hook interval.
//   exposed_ms  the time the compute stream waited for the reductions: from the point finish()
//               is called (backward compute done, an event recorded there) to the point after the
//               last Work is waited for (GPU: events on the compute stream; CPU: host clock);
//               with stage 2 serialised, plus the same wait at the end of each earlier
//               microbatch's backward.
// Both are measured, never derived from sizes and bandwidths.
//
// Threading: call everything on the thread that runs backward (hooks run there). The store, mesh
// and compute stream must outlive the DataParallel; destroying it first is safe (its hooks become
// no-ops). Not copyable or movable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/nn/gradient_sync.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/data_parallel/bucket_plan.hpp"  // GradientBucket, BucketPlan
#include "quintet/parallel/mesh.hpp"

namespace quintet::data_parallel {

struct DataParallelConfig {
  std::int64_t first_bucket_bytes = 1 << 20;  // bytes of f32 gradient in the first bucket; > 0
  std::int64_t bucket_bytes = 25 << 20;       // bytes of f32 gradient in later buckets; > 0
  bool overlap = true;  // reduce during backward (true) or all in finish() (false)
  int zero_stage = 0;   // 0: all-reduce, replicated optimizer; 1, 2: reduce-scatter + sharded state
  // Throws InvalidArgument naming the field unless the values above are in range.
  void validate() const;
};

// What one step's reductions cost, measured (see the header comment for the definitions).
struct DataParallelStats {
  double comm_ms = 0.0;     // time some gradient reduction was in flight
  double exposed_ms = 0.0;  // time the compute stream waited for them after backward
  std::int64_t bytes = 0;   // bytes of gradient reduced (f32, padded buckets)
  int buckets = 0;          // reductions issued (stage 2: per microbatch)
  // The most gradient storage this DataParallel held at once during the step, in bytes: the full
  // buffer (+ stage-1 staging) for stages 0, 1; for stage 2 the shards (+ scratch) plus the
  // bucket buffers bound for backward (a buffer counts until its reduction is issued; the
  // communicator holds it a little longer, until the reduction has read it).
  std::int64_t peak_gradient_bytes = 0;
};

// The schedule drives a step through nn::GradientSync (begin_step, set_last_microbatch, finish).
class DataParallel final : public nn::GradientSync {
 public:
  // Plans the buckets and subscribes to the store's grad-ready hooks (stage 2: also releases the
  // store's gradient buffer and binds gradients on demand; the store stays so). The compute stream
  // is the one backward runs on (reductions are ordered after the work queued there). Throws
  // InvalidArgument, before any communication, for a bad config, a store or stream on another
  // device than the mesh's communicators, or an expert parameter that asks for reduce_over_tp.
  DataParallel(nn::ParameterStore& store, const Mesh& mesh, const DataParallelConfig& config,
               const Stream& compute_stream);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Starts a step: zeroes the gradients on the compute stream, resets the bucket counters and
  // marks the next microbatch as the last one (so a step of one microbatch needs no other call).
  void begin_step() override;
  // Before each microbatch's forward/backward: whether it is the last of the step. Stages 0, 1:
  // only the last microbatch's backward starts reductions; the earlier ones just accumulate.
  // Stage 2: reduces what the previous microbatch left unreduced (every microbatch reduces).
  void set_last_microbatch(bool last) override;
  // Issues the reductions not started yet and makes stream wait for all of them. After it, stage 0
  // gradients hold the mean over the group; stages 1, 2 hold it in each bucket's owned shard
  // (owned_grad; stage 2 has no other gradient left). Throws InvalidArgument when called twice in
  // a step or before begin_step.
  void finish(const Stream& stream) override;
  // Whether finish() has run since the last begin_step().
  bool finished() const;

  // The measured cost of the last finished step. Blocks the host until that step's reductions
  // (and on a GPU its timing events) have completed. Zeros before the first finish().
  DataParallelStats last_step_stats() const;

  const std::vector<GradientBucket>& buckets() const;  // == plan().buckets()
  const BucketPlan& plan() const;
  // The reduced gradient of bucket b's owned elements [owned_begin, owned_end) after finish():
  // a 1-D f32 view into the gradient buffer, the bucket's staging buffer (stage 1) or its shard
  // (stage 2). Stages 1, 2 only.
  Tensor owned_grad(int b) const;
  // The reduced gradient of parameter p after finish(), as this rank holds it: the whole gradient
  // (stage 0: p.grad()), else the owned shard of p's bucket (owned_grad). For a weight with a
  // bucket of its own (a tied weight), so that the shard is all of it this rank owns. Throws
  // InvalidArgument for a parameter in no bucket.
  Tensor reduced_grad(const nn::Parameter& p) const;
  const DataParallelConfig& config() const;
  nn::ParameterStore& store() const;
  const Mesh& mesh() const;
  const Stream& compute_stream() const;

  struct State;  // implementation, in parallel/data_parallel/

 private:
  std::shared_ptr<State> state_;
};

}  // namespace quintet::data_parallel
