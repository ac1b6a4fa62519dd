// DataParallel: gradient reduction across data-parallel replicas of one model chunk, overlapped
// with backward, with gradient accumulation over microbatches and the gradient half of ZeRO-1/2.
//
// The chunk's f32 gradient buffer (nn::ParameterStore, backward order) is cut into buckets: runs
// of consecutive parameters of one gradient group, the first bucket at most first_bucket_bytes,
// the others at most bucket_bytes (a larger parameter gets a bucket of its own). The cut depends
// only on the store's layout and the config, so it is the same on every rank. A parameter's
// attributes pick its group, and so the communicator its bucket reduces over:
//   dense                              mean over Axis::dp_cp (== dp when cp == 1)
//   dense with reduce_over_tp          sum over tp, mean over dp_cp: one reduction over
//                                      Axis::tp_dp_cp of the gradient pre-scaled by 1/|dp_cp|
//                                      (sequence-parallel norm weights: partial sums over tp)
//   expert (is_expert)                 mean over Axis::edp
// Buckets never mix groups. A bucket's reduction (an all-reduce for ZeRO stage 0, a
// reduce-scatter into this rank's shard for stages 1 and 2) starts the moment backward of the
// LAST microbatch marks its last parameter grad-ready, in bucket order (a bucket that becomes
// ready early waits for the ones before it, so every rank issues the same sequence), and runs on
// the group's communicator while the rest of backward computes. finish() starts whatever is left
// and makes the stream wait for all of it. With overlap = false every reduction starts in
// finish(), after backward: the same reductions, serialised, for comparison.
//
// ZeRO shards (stages 1, 2): a bucket of n elements reduced over a group of S ranks is padded to
// L = S * ceil(n / S) elements; rank r owns elements [r * L/S, (r + 1) * L/S) of it (clipped to
// n). When S divides n the reduce-scatter runs in place in the gradient buffer; otherwise the
// bucket is copied into a padded staging buffer (kept per bucket) that is reduce-scattered.
// Memory: the store's full f32 gradient buffer stays allocated in every stage, because layers
// accumulate into it during backward; stage 2 reduces like stage 1 (once, after the last
// microbatch) and after finish() only the owned shard of the gradients is meaningful — the rest
// of the buffer holds this rank's unreduced partial sums. See distributed_optimizer.hpp for the
// optimizer half (sharded master weights and moments, parameter all-gather).
//
// Measurement (last_step_stats), per step, in milliseconds:
//   comm_ms     length of the union of the intervals [a bucket's reduction was issued, it
//               completed]. GPU: timing events — the start recorded on the compute stream when the
//               reduction is issued (its inputs are ready there), the end on a side stream made to
//               wait for the reduction's Work. CPU: host clock at issue; the end is the first time
//               the host saw the Work complete (polled at every grad-ready hook and in finish()),
//               so it is late by at most one hook interval.
//   exposed_ms  the time the compute stream waited for the reductions: from the point finish()
//               is called (backward compute done, an event recorded there) to the point after the
//               last Work is waited for (GPU: events on the compute stream; CPU: host clock).
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
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/mesh.hpp"

namespace quintet {

struct DataParallelConfig {
  std::int64_t first_bucket_bytes = 1 << 20;  // bytes of f32 gradient in the first bucket; > 0
  std::int64_t bucket_bytes = 25 << 20;       // bytes of f32 gradient in later buckets; > 0
  bool overlap = true;  // reduce during backward (true) or all in finish() (false)
  int zero_stage = 0;   // 0: all-reduce, replicated optimizer; 1, 2: reduce-scatter + sharded state
  // Throws InvalidArgument naming the field unless the values above are in range.
  void validate() const;
};

// One bucket of the gradient buffer (element offsets into the store's flat buffers).
struct GradientBucket {
  std::int64_t begin = 0;              // first element (the first parameter's offset)
  std::int64_t end = 0;                // one past the last element (includes alignment padding)
  Axis axis = Axis::dp_cp;             // the group it is reduced (and, for ZeRO, sharded) over
  std::vector<nn::Parameter*> params;  // in buffer order
  // ZeRO layout (also filled for stage 0, where it is unused): group size, this rank's index in
  // it, elements per shard (padded size / shard_count). This rank owns the flat elements
  // [owned_begin(), owned_end()).
  int shard_count = 1;
  int shard_rank = 0;
  std::int64_t shard_size = 0;
  std::int64_t numel() const { return end - begin; }
  std::int64_t owned_begin() const;
  std::int64_t owned_end() const;
};

// What one step's reductions cost, measured (see the header comment for the definitions).
struct DataParallelStats {
  double comm_ms = 0.0;     // time some gradient reduction was in flight
  double exposed_ms = 0.0;  // time the compute stream waited for them after backward
  std::int64_t bytes = 0;   // bytes of gradient reduced (f32, padded buckets)
  int buckets = 0;          // reductions issued
};

class DataParallel {
 public:
  // Plans the buckets and subscribes to the store's grad-ready hooks. The compute stream is the
  // one backward runs on (reductions are ordered after the work queued there). Throws
  // InvalidArgument, before any communication, for a bad config, a store or stream on another
  // device than the mesh's communicators, or an expert parameter that asks for reduce_over_tp.
  DataParallel(nn::ParameterStore& store, const Mesh& mesh, const DataParallelConfig& config,
               const Stream& compute_stream);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Starts a step: zeroes the gradients on the compute stream, resets the bucket counters and
  // marks the next microbatch as the last one (so a step of one microbatch needs no other call).
  void begin_step();
  // Before each microbatch's forward/backward: whether it is the last of the step. Only the last
  // microbatch's backward starts reductions; the earlier ones just accumulate.
  void set_last_microbatch(bool last);
  // Issues the reductions not started yet and makes stream wait for all of them. After it, stage 0
  // gradients hold the mean over the group; stages 1, 2 hold it in each bucket's owned shard
  // (owned_grad). Throws InvalidArgument when called twice in a step or before begin_step.
  void finish(const Stream& stream);
  // Whether finish() has run since the last begin_step().
  bool finished() const;

  // The measured cost of the last finished step. Blocks the host until that step's reductions
  // (and on a GPU its timing events) have completed. Zeros before the first finish().
  DataParallelStats last_step_stats() const;

  const std::vector<GradientBucket>& buckets() const;
  // The reduced gradient of bucket b's owned elements [owned_begin, owned_end) after finish():
  // a 1-D f32 view into the gradient buffer or the bucket's staging buffer (stages 1, 2 only).
  Tensor owned_grad(int b) const;
  const DataParallelConfig& config() const;
  nn::ParameterStore& store() const;
  const Mesh& mesh() const;
  const Stream& compute_stream() const;

  struct State;  // implementation, in parallel/data/

 private:
  std::shared_ptr<State> state_;
};

}  // namespace quintet
