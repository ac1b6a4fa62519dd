// DistributedOptimizer: AdamW over a data-parallel model chunk, for every ZeRO stage of its
// DataParallel (data_parallel.hpp), with gradient clipping by the norm over the whole job.
//
// Stage 0: every rank keeps f32 master weights and both Adam moments of the whole chunk and
// updates all of it from the all-reduced gradients (no parameter communication).
// Stages 1, 2: the master weights and moments exist only for the elements this rank owns in each
// bucket (see GradientBucket: 1/S of it, S the size of the bucket's group), so they take 1/S of
// the memory. step() runs nn::adamw_step on the owned elements of every parameter, writes the
// updated compute-dtype values into the owned part of the store's value buffer, and issues one
// all-gather per bucket over the bucket's group. The forward of the next step waits for a bucket's
// all-gather only when a layer first uses one of its parameters (Parameter::use runs the store's
// before-use hook, which this optimizer sets), so gathers overlap the forward.
//
// Gradient norm: the 2-norm over every distinct parameter of the whole model, as one rank would
// compute it: each element is counted once over dp/cp/edp (stage 0: on group rank 0 only; ZeRO:
// each rank counts its shard) and once over tp/etp for parameters replicated there (counted on
// tp or etp rank 0; a parameter with attributes().shard_axis == tp (expert: tp or etp) is
// sharded and counted everywhere, a shard held by tp_replicas ranks on the first of them), then
// summed over Axis::tp_dp_cp and Axis::pp. A weight tied across chunks (nn::TiedRole) is counted on
// its owner's chunk only. Clipping scales the update by max_grad_norm / (norm + 1e-6) when norm >
// max_grad_norm, as the tests' single-rank nn::AdamW does.
//
// The DataParallel (and its store and mesh) must outlive the optimizer. Same thread as the
// DataParallel. Not copyable or movable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "quintet/nn/optimizer.hpp"
#include "quintet/parallel/data_parallel/data_parallel.hpp"

namespace quintet::data_parallel {

class DistributedOptimizer {
 public:
  // Creates the (sharded) state on stream: master weights copied from the current parameter
  // values (converted to f32), moments zero. For stages 1, 2 sets the store's before-use hook.
  // Throws InvalidArgument when stream is on another device than the store.
  DistributedOptimizer(DataParallel& dp, const nn::AdamWConfig& config, const Stream& stream);
  ~DistributedOptimizer();  // removes the before-use hook
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // One update from the reduced gradients: requires dp.finish() for this step (InvalidArgument
  // otherwise). Waits for any parameter all-gather still pending, computes the global norm (two
  // scalar all-reduces), clips, updates (nn::adamw_step_many: on a GPU the clip factor is taken on
  // the device and the host does not wait; the norm is read when asked for, see
  // nn::OptimizerStepInfo), and for ZeRO issues the parameter all-gathers. Does not zero the
  // gradients (DataParallel::begin_step does).
  nn::OptimizerStepInfo step(const Stream& stream);
  // step() for the optimizers of every model chunk this rank holds (a pipeline rank with vpp > 1
  // chunks has one store, DataParallel and optimizer per chunk): one global norm over all of
  // them (each chunk's part summed here, then the same all-reduces as step()), the same clipping
  // for all, then each one's update. Their DataParallels must share one mesh. Returns the info
  // of the step (the same norm and scale for every chunk).
  static nn::OptimizerStepInfo step_together(std::span<DistributedOptimizer* const> optimizers,
                                             const Stream& stream);
  void set_lr(float lr) { config_.hyper.lr = lr; }
  DataParallel& data_parallel() const { return dp_; }
  const nn::AdamWConfig& config() const { return config_; }
  std::int64_t steps() const { return step_; }

  // Makes stream wait for every pending parameter all-gather (ZeRO), so that all of the store's
  // values are current — before reading parameters outside a forward (evaluation, checkpoints,
  // tests). No-op for stage 0.
  void wait_for_parameters(const Stream& stream);

  // This rank's optimizer state as named tensors (views, not copies; 1-D f32 of the owned
  // elements in bucket and parameter order, the same layout on every run of the same model,
  // layout and config): "step" (i64 [1], a CPU copy), "master", "exp_avg", "exp_avg_sq" (on the
  // store's device).
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores what state() returned (same names, shapes and dtypes; copied in on stream). Throws
  // InvalidArgument naming the tensor on a mismatch, before changing anything. Parameter values
  // are not touched: restore them from the same checkpoint (they are the master rounded to the
  // compute dtype).
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, const Stream& stream);

  // The state of every element of the store, whatever the ZeRO stage: "master", "exp_avg" and
  // "exp_avg_sq", each laid out like the store's flat buffers (accum dtype, zero in the padding),
  // for checkpoints that load at another layout. Stage 0 copies its own state; stages 1, 2 fill
  // in what the other ranks of each bucket's group own (a sum over the group of buffers that are
  // zero outside each rank's elements: exact). Collective over the buckets' groups for ZeRO.
  std::vector<std::pair<std::string, Tensor>> full_state(const Stream& stream) const;
  // The inverse: takes this rank's elements of buffers laid out like full_state()'s (the same
  // names, shaped like the store's flat buffer) and the step count. Local; throws
  // InvalidArgument, naming the tensor, for a missing or misshapen one, before changing anything.
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& full, std::int64_t step,
                       const Stream& stream);
  // A fresh start from new weights, one parameter at a time, with no buffer the size of the
  // store (what an import of another format's weights needs): restart() zeroes both moments and
  // the step count; set_master(p, value) then takes this rank's elements of p from value (p's
  // shape, accum dtype: the exact weights, e.g. before rounding to a bf16 p.data()). Local;
  // throws InvalidArgument for a parameter not in the store or a misshapen value.
  void restart(const Stream& stream);
  void set_master(const nn::Parameter& p, const Tensor& value, const Stream& stream);

 private:
  // A run of elements of one parameter that this rank updates.
  struct Segment {
    nn::Parameter* param;
    int bucket;
    std::int64_t flat_offset;   // into the store's buffers
    std::int64_t length;        // elements
    std::int64_t state_offset;  // into master_/exp_avg_/exp_avg_sq_
    bool in_norm;               // whether this rank counts it in the global norm
  };
  // The reduced gradient this rank updates segment g from.
  Tensor grad_of(const Segment& g) const;
  // This rank's part of the squared global norm (what it counts), as a [1] tensor on stream.
  Tensor local_sum_of_squares(const Stream& stream);
  // The update given the global sum of squares (the clip factor taken from it where it is);
  // returns the step taken.
  std::int64_t apply(const Tensor& sum_sq, const Stream& stream);
  void gather_parameters(const Stream& stream);
  void wait_bucket(int b, const Stream& stream);

  DataParallel& dp_;
  nn::AdamWConfig config_;
  std::int64_t step_ = 0;
  int stage_ = 0;
  std::vector<Segment> segments_;
  Tensor master_, exp_avg_, exp_avg_sq_;  // f32, owned elements only
  // ZeRO parameter all-gathers, one per bucket.
  std::vector<Work> gathers_;
  std::vector<bool> gather_pending_;
  std::shared_ptr<nn::PendingNorm> pending_;  // GPU: the last step's norm
  std::vector<Tensor>
      gather_staging_;  // padded compute-dtype buffers for buckets S does not divide
};

}  // namespace quintet::data_parallel
